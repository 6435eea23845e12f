"""WHIP in (``POST /whip/{avatar}``, ``docs/design/broadcast.md`` §21): a publisher's speech
makes the avatar speak, watched over WHEP. The publisher here is aiortc (as a browser
would be); GStreamer's webrtcbin publishes in ``tests/test_gstreamer_interop.py``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer

from config.settings import Settings
from tests.live_calls import session_state, until
from tests.media import speech_with_pauses, write_wav
from tests.whep_viewer import Viewer
from web.app import build_app
from web.app_keys import SESSIONS
from web.session_tokens import mint_token

Client = TestClient[Any, Any]
SECRET = "a-test-secret-of-at-least-32-bytes!!"
SDP = {"Content-Type": "application/sdp"}


def _settings(tmp_path: Path, **sections: Any) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
            **sections,
        }
    )


@pytest.fixture
async def client(tmp_path: Path, loopback: None) -> AsyncIterator[Client]:
    async with TestClient(TestServer(build_app(_settings(tmp_path)), host="127.0.0.1")) as c:
        yield c


def _speech(tmp_path: Path) -> tuple[Path, float]:
    pcm, spans = speech_with_pauses(tmp_path, ("hello there, this is the publisher",), 1.0)
    return write_wav(tmp_path / "publisher.wav", pcm, 16_000), spans[0][1]


@contextlib.asynccontextmanager
async def _publisher(
    client: Client, wav: Path | None, *, video: bool = False, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[RTCPeerConnection, Any]]:
    """An aiortc WHIP publisher of ``wav`` (send-only), its offer posted; the response."""
    pc = RTCPeerConnection()
    player = MediaPlayer(str(wav)) if wav is not None else None
    try:
        if player is not None and player.audio is not None:
            pc.addTransceiver(player.audio, direction="sendonly")
        if video:
            pc.addTransceiver("video", direction="sendonly")
        await pc.setLocalDescription(await pc.createOffer())
        response = await client.post(
            "/whip/demo", data=pc.localDescription.sdp, headers={**SDP, **(headers or {})}
        )
        if response.status == 201:
            answer = await response.text()
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        yield pc, response
    finally:
        if player is not None and player.audio is not None:
            player.audio.stop()
        await pc.close()


async def test_a_publishers_speech_is_spoken_and_watched(client: Client, tmp_path: Path) -> None:
    wav, _ = _speech(tmp_path)
    async with _publisher(client, wav, video=True) as (_, response):
        assert response.status == 201, await response.text()
        assert response.content_type == "application/sdp"
        answer = await response.text()
        assert "a=recvonly" in answer
        assert "m=video 0" in answer or "a=inactive" in answer  # its video is declined
        location = response.headers["Location"]
        sid = location.removeprefix("/sessions/")
        viewer = Viewer(client, sid)
        try:
            await viewer.watch()
            await until(
                lambda: client.app[SESSIONS].get(sid).stats.frames_inferred >= 10,
                "the publisher's speech lip-synced",
            )
            await until(lambda: viewer.watched.audio_peak > 0.05, "the viewer to hear it")
            assert len(viewer.watched.pictures) > 0
            state = await session_state(client, sid)
            assert state["caller"] is True
            assert state["viewers"] == 1
        finally:
            await viewer.close()
        ended = await client.delete(location)  # WHIP: DELETE the resource ends it
        assert ended.status == 200
    assert client.app[SESSIONS].live_count == 0


async def test_whip_refusals(tmp_path: Path, loopback: None) -> None:
    settings = _settings(tmp_path, auth={"jwt_secret": SECRET})
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        token = mint_token(settings.auth, "demo", ttl_s=60)
        bearer = {"Authorization": f"Bearer {token}"}
        async with _publisher(client, None, video=True, headers=bearer) as (_, video_only):
            body = await video_only.json()
            assert video_only.status == 400, body
            assert "must send audio" in body["error"]["message"]
        wav, _ = _speech(tmp_path)
        async with _publisher(client, wav) as (_, no_token):
            assert no_token.status == 401
            assert no_token.headers["WWW-Authenticate"] == "Bearer"
        wrong = await client.post("/whip/demo", data="v=0", headers={"Content-Type": "text/plain"})
        assert wrong.status in (401, 415)
        json_type = await client.post("/whip/demo", data="v=0", headers={**bearer})
        assert json_type.status == 415
        garbage = await client.post("/whip/demo", data="v=0", headers={**SDP, **bearer})
        assert garbage.status == 400
        other = mint_token(settings.auth, "demo", ttl_s=60)
        unknown = await client.post(
            "/whip/nobody", data="v=0", headers={**SDP, "Authorization": f"Bearer {other}"}
        )
        assert unknown.status == 401  # a token for another avatar, before anything else
        assert client.app[SESSIONS].live_count == 0
