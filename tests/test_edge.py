"""One process and a cluster front share their edge and their offer gate (``web/edge.py``,
``web/offer_gate.py``): the same middlewares in the same order, the drain flag and the
liveness made with the app, and a bad offer refused alike, with the same status and
code, before any session manager or worker is asked. The front here runs on a Ray
runtime that pretends (``tests/fake_ray.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from config.settings import Settings
from tests.fake_ray import FakeRuntime
from web.app import build_app
from web.app_keys import DRAINING, LIVENESS, SETTINGS
from web.cluster.app import build_front_app
from web.cluster.front import ClusterFront
from web.cluster.runtime import RuntimeMode
from web.session_tokens import mint_token

SECRET = "edge-test-secret-" + "0123456789abcdef" * 4
RATE_PER_MINUTE = 4
MAX_OFFER_BYTES = 4096
SDP = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n"  # JSON and token pass, the SDP check fails

Client = TestClient[Any, Any]


def _settings(tmp_path: Path, workers: int = 0) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "data")},
            "auth": {"jwt_secret": SECRET},
            "server": {
                "offer_rate_limit_per_minute": RATE_PER_MINUTE,
                "max_offer_bytes": MAX_OFFER_BYTES,
            },
            "cluster": {"workers": workers},
        }
    )


@pytest.fixture
async def both(tmp_path: Path) -> AsyncIterator[dict[str, Client]]:
    """A client of one process's app and one of a front's, with the same settings."""
    one = build_app(_settings(tmp_path))
    front_settings = _settings(tmp_path, workers=2)
    front = ClusterFront(front_settings, runtime=FakeRuntime(RuntimeMode.STARTED))
    fronted = build_front_app(front_settings, front=front)
    async with (
        TestClient(TestServer(one, host="127.0.0.1")) as one_client,
        TestClient(TestServer(fronted, host="127.0.0.1")) as front_client,
    ):
        yield {"one process": one_client, "front": front_client}


def _names(app: web.Application) -> list[str]:
    return [getattr(m, "__qualname__", type(m).__name__) for m in app.middlewares]


def test_both_apps_start_from_the_same_edge(tmp_path: Path) -> None:
    one = build_app(_settings(tmp_path))
    front = build_front_app(_settings(tmp_path, workers=1))
    assert _names(one) == _names(front)
    assert len(_names(one)) == 4  # guard, client address, CORS, errors
    for app in (one, front):  # made with the app, before any route or start-up
        assert not app[DRAINING].draining
        assert app[LIVENESS].failure is None


async def _refusal(client: Client, **post: Any) -> tuple[int, str]:
    response = await client.post("/offer", **post)
    return response.status, (await response.json())["error"]["code"]


async def test_bad_offers_are_refused_alike(both: dict[str, Client]) -> None:
    token = mint_token(both["front"].app[SETTINGS].auth, "demo", ttl_s=60)
    bearer = {"Authorization": f"Bearer {token}"}
    cases = {
        "not JSON": {"data": b"{nope", "headers": {"Content-Type": "application/json"}},
        "too big": {"data": b"x" * (MAX_OFFER_BYTES + 1)},
        "no token": {"json": {"sdp": SDP, "type": "offer", "avatar": "demo"}},
    }
    seen: dict[str, dict[str, tuple[int, str]]] = {}
    for name, client in both.items():
        answers = {case: await _refusal(client, **post) for case, post in cases.items()}
        # A valid token, then the SDP is what is wrong.
        answers["bad SDP"] = await _refusal(
            client, json={"sdp": SDP, "type": "offer", "avatar": "demo"}, headers=bearer
        )
        seen[name] = answers
    assert seen["front"] == seen["one process"]
    assert seen["front"] == {
        "not JSON": (400, "bad_json"),
        "too big": (413, "body_too_large"),
        "no token": (401, "unauthorized"),
        "bad SDP": (400, "bad_offer"),
    }


async def test_rate_limit_and_drain_refuse_alike(both: dict[str, Client]) -> None:
    for client in both.values():
        statuses = [(await _refusal(client, data=b"{nope"))[0] for _ in range(RATE_PER_MINUTE)]
        assert statuses == [400] * RATE_PER_MINUTE  # each offer took a token
        assert await _refusal(client, data=b"{nope") == (429, "rate_limited")
        client.app[DRAINING].start()
        assert await _refusal(client, data=b"{nope") == (503, "too_many_sessions")
