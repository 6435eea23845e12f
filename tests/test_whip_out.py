"""WHIP out (``docs/design/broadcast.md`` §21): a session published to a WHIP endpoint. The
endpoint here is a second lipstream's ``POST /whip/{avatar}``, a real one that checks
the offer and speaks what arrives: the first avatar's voice makes the second one's
mouth move."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from config.settings import Settings
from tests.live_calls import until
from tests.media import require_espeak
from web.app import build_app
from web.app_keys import SESSIONS

Client = TestClient[Any, Any]


def _settings(tmp_path: Path, name: str, **sections: Any) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / name), "data_dir": str(tmp_path / f"{name}-data")},
            "video": {"preset": "ultrafast"},
            **sections,
        }
    )


async def _outputs(client: Client, session_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/sessions/{session_id}/outputs")
    assert response.status == 200, await response.text()
    outputs: list[dict[str, Any]] = (await response.json())["outputs"]
    return outputs


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_session_published_over_whip_makes_another_server_speak(
    tmp_path: Path, loopback: None
) -> None:
    require_espeak()
    source = _settings(tmp_path, "source", outputs={"allow_private": True, "retry_max_s": 2})
    ingest = _settings(tmp_path, "ingest")
    async with (
        TestClient(TestServer(build_app(ingest), host="127.0.0.1")) as far,
        TestClient(TestServer(build_app(source), host="127.0.0.1")) as near,
    ):
        endpoint = str(far.make_url("/whip/demo"))
        created = await near.post(
            "/sessions", json={"avatar": "demo", "outputs": [{"whip": endpoint}]}
        )
        assert created.status == 201, await created.text()
        sid = (await created.json())["session_id"]

        async def live() -> bool:
            (status,) = await _outputs(near, sid)
            return bool(status["state"] == "live")

        await until(live, "the publication to go live")
        published = far.app[SESSIONS].sessions
        assert len(published) == 1
        assert published[0].has_caller  # the far side's session speaks what it is sent
        said = await near.post(f"/sessions/{sid}/say", json={"text": "Hello from over there."})
        assert said.status == 202
        await until(
            lambda: published[0].stats.frames_inferred >= 10,
            "the far avatar to lip-sync the near one's voice",
        )
        (status,) = await _outputs(near, sid)
        assert status["kind"] == "whip"
        assert status["connects"] == 1
        assert status["frames_sent"] == 0  # a lipstream endpoint declines the video
        removed = await near.delete(f"/sessions/{sid}/outputs/{status['output_id']}")
        assert removed.status == 200
        # Stopping DELETEs the endpoint's Location: the far session ends.
        await until(lambda: not far.app[SESSIONS].sessions, "the far session to end")
        assert far.app[SESSIONS].counters.ended_by_reason.get("hung up by API") == 1


async def test_an_endpoint_that_refuses_is_tried_again(tmp_path: Path, loopback: None) -> None:
    settings = _settings(tmp_path, "source", outputs={"allow_private": True, "retry_max_s": 2})
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as near:
        sid = (await (await near.post("/sessions", json={"avatar": "demo"})).json())["session_id"]
        for body, code in (
            ({"whip": "ftp://example.com/whip"}, "bad_output"),
            ({"whip": "http://127.0.0.1/x", "rtmp": "rtmp://127.0.0.1/a/b"}, "bad_output"),
            ({}, "bad_output"),
        ):
            refused = await near.post(f"/sessions/{sid}/outputs", json=body)
            assert refused.status == 400, body
            assert (await refused.json())["error"]["code"] == code
        url = f"http://127.0.0.1:{_closed_port()}/whip/demo"
        added = await near.post(f"/sessions/{sid}/outputs", json={"whip": url, "token": "t"})
        assert added.status == 201, await added.text()

        async def retrying() -> bool:
            (status,) = await _outputs(near, sid)
            return status["retries"] >= 2 and status["last_error"] is not None

        await until(retrying, "the refused publication to be tried again")
        (status,) = await _outputs(near, sid)
        assert status["state"] in ("connecting", "retrying")
        removed = await near.delete(f"/sessions/{sid}/outputs/{status['output_id']}")
        assert removed.status == 200
        assert (await removed.json())["state"] == "ended"
