"""Admin API, health/readiness and the admin page, on the real app and inference core.

Non-loopback peers are simulated two ways: :func:`admin_denial` is unit-tested on
``make_mocked_request`` requests whose transport reports a chosen peer address, and the
full app is served with an extra innermost middleware that hands handlers
``request.clone(remote=...)`` (aiohttp's own way to override the peer, as a proxy
middleware would), so the route wrapper sees the address end to end.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import onnxruntime as ort
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from pydantic import SecretStr

from config.settings import Settings
from inference_core.adapter.onnx_io import open_session
from inference_core.adapter.serving_graph import ServingGraph
from inference_core.avatars.locator import AvatarLocator
from inference_core.serving.core import InferenceCore
from inference_core.serving.devices import Device
from streaming.audio_rates import AUDIO_CHUNK_S
from streaming.webrtc.pacing import CATCH_UP_S
from tests.packages import make_package
from tests.webrtc_client import Caller
from web.admin_auth import FORBIDDEN_MESSAGE, UNAUTHORIZED_MESSAGE, admin_denial, is_loopback
from web.app import build_app
from web.app_keys import CORE, DRAINING

VISUAL = (6, 320, 320)
AUDIO = (32, 16, 16)
TOKEN = "correct-horse-battery-staple"

Client = TestClient[Any, Any]


def _settings(root: Path, **sections: dict[str, Any]) -> Settings:
    config: dict[str, Any] = {
        "avatars": {"root": str(root), "data_dir": str(root.parent / "data"), "demo": False},
        "devices": {"kind": "cpu", "count": 2, "workers_per_device": 1},
        "batching": {"max_batch_size": 2, "max_wait_ms": 2},
    }
    for name, values in sections.items():
        config[name] = config.get(name, {}) | values
    return Settings.model_validate(config)


def _avatars(tmp_path: Path, *ids: str) -> Path:
    root = tmp_path / "avatars"
    for avatar_id in ids:
        make_package(root / avatar_id)
    return root


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    app = build_app(_settings(_avatars(tmp_path, "alice", "bob")))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


def _infer_body(n: int) -> bytes:
    rng = np.random.default_rng(0)
    visual = rng.random((n, *VISUAL), dtype=np.float32)
    audio = rng.normal(0, 1, (n, *AUDIO)).astype(np.float32)
    return visual.astype("<f4").tobytes() + audio.astype("<f4").tobytes()


async def _json(response: Any, status: int = 200) -> Any:
    assert response.status == status, await response.text()
    return await response.json()


async def _error(response: Any, status: int, code: str) -> dict[str, str]:
    body = await _json(response, status)
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    error: dict[str, str] = body["error"]
    return error


# -- stats -------------------------------------------------------------------------------


async def test_stats_move_after_raw_inference(client: Client) -> None:
    before = await _json(await client.get("/admin/stats"))
    assert {m["id"]: m["state"] for m in before["models"]} == {
        "alice": "registered",
        "bob": "registered",
    }
    assert before["global"]["models_loaded"] == 0
    assert [d["name"] for d in before["devices"]] == ["cpu:0", "cpu:1"]

    response = await client.post("/v1/infer/alice?batch_size=3", data=io.BytesIO(_infer_body(3)))
    assert response.status == 200, await response.text()

    after = await _json(await client.get("/admin/stats"))
    alice = next(m for m in after["models"] if m["id"] == "alice")
    assert alice["state"] == "loaded"
    assert alice["device"] in {"cpu:0", "cpu:1"}
    assert alice["usage_count"] == 1
    assert alice["frames"] == 3
    assert alice["memory_bytes"] > 0
    assert alice["total_inference_ms"] > 0
    assert alice["mean_inference_ms"] == pytest.approx(alice["total_inference_ms"] / 3, rel=1e-2)
    assert alice["refcount"] == 0
    assert alice["load_seconds"] > 0
    for stamp in (alice["last_used"], alice["loaded_at"]):
        assert datetime.fromisoformat(stamp).utcoffset() is not None  # ISO-8601 with UTC
    device = next(d for d in after["devices"] if d["name"] == alice["device"])
    assert device["kind"] == "cpu"
    assert device["models_loaded"] == 1
    assert device["memory_used_bytes"] == alice["memory_bytes"]
    assert device["memory_total_bytes"] is None or device["memory_total_bytes"] > 0
    assert device["batches"] >= 2  # 3 frames, batches of at most 2
    assert device["frames"] == 3
    assert 1 <= device["mean_batch_size"] <= 2
    assert 0 < device["busy_fraction"] <= 1
    assert device["queue_depth"] == 0
    assert (device["expired"], device["rejected"]) == (0, 0)
    assert [w["frames"] for w in device["workers"]] == [3]
    assert device["workers"][0]["busy_seconds"] > 0
    cache_keys = {"hits", "misses", "hit_rate", "evictions", "bytes", "max_bytes", "entries"}
    assert set(after["cache"]) == cache_keys
    g = after["global"]
    assert (g["models_registered"], g["models_loaded"], g["live_sessions"]) == (2, 1, 0)
    assert g["sessions_started"] == g["sessions_ended"] == g["sessions_rejected"] == 0
    assert g["frames_served"] == 0
    assert g["frames_dropped"] == {}
    assert g["cpu_ms_per_frame"] is None  # nothing sent, nothing measured
    assert g["evictions"] == {"capacity": 0, "idle": 0, "admin": 0}
    assert g["uptime_s"] >= 0
    assert g["version"]

    listed = await _json(await client.get("/admin/models"))
    assert listed["models"] == after["models"]


# -- load / unload -------------------------------------------------------------------------


async def test_load_on_a_device_then_unload(client: Client) -> None:
    loaded = await _json(await client.post("/admin/models/bob/load", json={"device": 1}))
    assert (loaded["id"], loaded["state"], loaded["device"]) == ("bob", "loaded", "cpu:1")
    assert loaded["memory_bytes"] > 0
    again = await _json(await client.post("/admin/models/bob/load"))  # no body: no-op
    assert again["device"] == "cpu:1"
    unloaded = await _json(await client.post("/admin/models/bob/unload"))
    assert (unloaded["state"], unloaded["device"], unloaded["memory_bytes"]) == (
        "registered",
        None,
        0,
    )
    stats = await _json(await client.get("/admin/stats"))
    assert stats["global"]["evictions"]["admin"] == 1
    assert stats["global"]["models_loaded"] == 0


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/admin/models/nobody/load", None, 404, "model_not_found"),
        ("/admin/models/nobody/unload", None, 404, "model_not_found"),
        ("/admin/models/Bad.Id/load", None, 400, "invalid_model_id"),
        ("/admin/models/Bad.Id/unload", None, 400, "invalid_model_id"),
        ("/admin/models/alice/load", {"device": 2}, 400, "bad_device"),
        ("/admin/models/alice/load", {"device": -1}, 400, "bad_device"),
        ("/admin/models/alice/load", {"device": "cpu:0"}, 400, "bad_device"),
        ("/admin/models/alice/load", {"device": True}, 400, "bad_device"),
        ("/admin/models/alice/load", [0], 400, "bad_json"),
    ],
)
async def test_load_and_unload_errors(
    client: Client, path: str, body: object, status: int, code: str
) -> None:
    await _error(await client.post(path, json=body), status, code)
    models = await _json(await client.get("/admin/models"))
    assert all(m["state"] == "registered" for m in models["models"])  # nothing was loaded


async def test_unload_of_a_held_model_is_409(client: Client) -> None:
    handle = await client.app[CORE].open("alice")
    try:
        error = await _error(await client.post("/admin/models/alice/unload"), 409, "model_in_use")
        assert "held by 1 session" in error["message"]
    finally:
        handle.close()
    assert (await _json(await client.post("/admin/models/alice/unload")))["state"] == "registered"


async def test_no_capacity_is_503_with_retry_after(tmp_path: Path) -> None:
    settings = _settings(
        _avatars(tmp_path, "alice", "bob"), devices={"count": 1, "max_models_per_device": 1}
    )
    async with TestClient(TestServer(build_app(settings))) as client:
        handle = await client.app[CORE].open("alice")
        try:
            response = await client.post("/admin/models/bob/load")
            await _error(response, 503, "no_capacity")
            assert int(response.headers["Retry-After"]) > 0
        finally:
            handle.close()
        # Once alice is idle, it makes room.
        assert (await _json(await client.post("/admin/models/bob/load")))["state"] == "loaded"


async def test_load_past_the_timeout_is_504_and_keeps_loading(tmp_path: Path) -> None:
    settings = _settings(_avatars(tmp_path, "alice"), registry={"load_timeout_s": 0.2})
    release = threading.Event()

    def slow_factory(graph: ServingGraph, device: Device) -> ort.InferenceSession:
        release.wait(10)
        return open_session(graph.serialized())

    avatars = settings.avatars
    core = InferenceCore(
        settings,
        AvatarLocator(avatars.root),
        session_factory=slow_factory,
    )
    async with TestClient(TestServer(build_app(settings, core=core))) as client:
        error = await _error(await client.post("/admin/models/alice/load"), 504, "load_timeout")
        assert "load_timeout_s" in error["message"]
        models = await _json(await client.get("/admin/models"))
        assert models["models"][0]["state"] == "loading"
        release.set()
        async with asyncio.timeout(10):
            while core.registry.entry("alice").state != "loaded":  # noqa: ASYNC110
                await asyncio.sleep(0.05)


# -- access rule ----------------------------------------------------------------------------


async def test_token_is_required_when_configured(tmp_path: Path) -> None:
    settings = _settings(_avatars(tmp_path, "alice"), server={"admin_token": TOKEN})
    async with TestClient(TestServer(build_app(settings))) as client:
        refusals = [
            await client.get("/admin/models"),
            await client.get("/admin/stats", headers={"Authorization": "Bearer wrong"}),
            await client.get("/admin/sessions", headers={"Authorization": f"Basic {TOKEN}"}),
            await client.post("/admin/models/alice/load", headers={"Authorization": "Bearer"}),
            await client.delete("/admin/sessions/x", headers={"Authorization": f"Bearer {TOKEN}x"}),
        ]
        for response in refusals:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"] == "Bearer"
            # The same words whatever was wrong: nothing about why.
            assert await response.json() == {
                "error": {"code": "unauthorized", "message": UNAUTHORIZED_MESSAGE}
            }
        assert client.app[CORE].registry.entry("alice").state == "registered"

        good = {"Authorization": f"Bearer {TOKEN}"}
        assert (await client.get("/admin/stats", headers=good)).status == 200
        assert (await client.get("/admin/models", headers=good)).status == 200
        lower = {"Authorization": f"bearer {TOKEN}"}  # the scheme is case-insensitive
        assert (await client.get("/admin/sessions", headers=lower)).status == 200
        # Other routes do not need it.
        assert (await client.get("/health")).status == 200
        assert (await client.get("/ready")).status == 200
        assert (await client.get("/avatars")).status == 200
        # The page itself holds no data and loads without it (then asks for the token).
        assert (await client.get("/admin")).status == 200


def _peer_override(remote: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def as_if_from(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        return await handler(request.clone(remote=remote))

    return as_if_from


async def test_without_a_token_only_loopback_peers_get_in(tmp_path: Path) -> None:
    app = build_app(_settings(_avatars(tmp_path, "alice")))
    app.middlewares.append(_peer_override("203.0.113.7"))
    async with TestClient(TestServer(app)) as client:
        for method, path in [
            ("GET", "/admin"),
            ("GET", "/admin/models"),
            ("GET", "/admin/stats"),
            ("GET", "/admin/sessions"),
            ("POST", "/admin/models/alice/load"),
            ("POST", "/admin/models/alice/unload"),
            ("DELETE", "/admin/sessions/x"),
        ]:
            response = await client.request(method, path)
            assert response.status == 403, (method, path)
            assert await response.json() == {
                "error": {"code": "forbidden", "message": FORBIDDEN_MESSAGE}
            }
            assert "server.admin_token" in FORBIDDEN_MESSAGE
        assert (await client.get("/health")).status == 200
        assert (await client.get("/avatars")).status == 200
        assert client.app[CORE].registry.entry("alice").state == "registered"


async def test_a_remote_peer_with_the_token_gets_in(tmp_path: Path) -> None:
    app = build_app(_settings(_avatars(tmp_path, "alice"), server={"admin_token": TOKEN}))
    app.middlewares.append(_peer_override("203.0.113.7"))
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/admin/models", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status == 200
        assert (await client.get("/admin/models")).status == 401


def _request(peer: str | None, headers: dict[str, str] | None = None) -> web.Request:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 50000) if name == "peername" and peer is not None else default
    )
    headers = {"Host": "127.0.0.1:8080"} | (headers or {})
    return make_mocked_request("GET", "/admin/stats", headers=headers, transport=transport)


@pytest.mark.parametrize(
    ("peer", "headers", "allowed"),
    [
        ("127.0.0.1", None, True),
        ("127.8.9.10", None, True),
        ("::1", None, True),
        ("::ffff:127.0.0.1", None, True),
        ("10.0.0.2", None, False),
        ("192.168.1.20", None, False),
        ("::ffff:10.0.0.2", None, False),
        ("2001:db8::1", None, False),
        (None, None, False),
        # a reverse proxy on this host connects from loopback for remote clients
        ("127.0.0.1", {"X-Forwarded-For": "203.0.113.7"}, False),
        ("127.0.0.1", {"Forwarded": "for=203.0.113.7"}, False),
        ("127.0.0.1", {"X-Real-IP": "203.0.113.7"}, False),
        # a browser on this machine: same-machine pages only
        ("127.0.0.1", {"Host": "localhost:8080", "Origin": "http://localhost:8080"}, True),
        ("::1", {"Host": "[::1]:8080", "Origin": "http://[::1]:8080"}, True),
        ("127.0.0.1", {"Origin": "https://evil.example"}, False),  # cross-site POST
        ("127.0.0.1", {"Origin": "null"}, False),
        ("127.0.0.1", {"Host": "evil.example:8080"}, False),  # DNS rebinding
        (
            "127.0.0.1",
            {"Host": "evil.example:8080", "Origin": "http://evil.example:8080"},
            False,
        ),
    ],
)
def test_loopback_rule_without_a_token(
    peer: str | None, headers: dict[str, str] | None, allowed: bool
) -> None:
    denial = admin_denial(_request(peer, headers), None)
    if allowed:
        assert denial is None
    else:
        assert denial is not None
        assert denial.status == 403


def test_token_rule_ignores_the_peer() -> None:
    token = SecretStr(TOKEN)
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert admin_denial(_request("10.0.0.2", good), token) is None
    refused = admin_denial(_request("127.0.0.1"), token)  # loopback is not enough
    assert refused is not None
    assert refused.status == 401
    non_ascii = {"Authorization": "Bearer tökén"}
    refused = admin_denial(_request("127.0.0.1", non_ascii), token)
    assert refused is not None
    assert refused.status == 401
    # An empty token counts as none configured (never as "any empty bearer").
    assert admin_denial(_request("127.0.0.1"), SecretStr("")) is None
    assert is_loopback("127.0.0.1")
    assert not is_loopback("localhost")


# -- health and readiness ---------------------------------------------------------------------


async def test_health_and_readiness(client: Client) -> None:
    assert await _json(await client.get("/health")) == {"status": "ok"}
    ready = await _json(await client.get("/ready"))
    assert ready == {
        "ready": True,
        "avatar_root": "readable",
        "devices": ["cpu:0", "cpu:1"],
        "draining": False,
    }
    client.app[DRAINING].start()
    not_ready = await _json(await client.get("/ready"), 503)
    assert not_ready["ready"] is False
    assert any("draining" in reason for reason in not_ready["reasons"])
    assert (await client.get("/health")).status == 200  # still alive


async def test_readiness_checks_the_avatar_root(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    async with TestClient(TestServer(build_app(_settings(missing)))) as client:
        body = await _json(await client.get("/ready"), 503)
        assert body["ready"] is False
        assert any(str(missing) in reason for reason in body["reasons"])
    demo = _settings(missing, avatars={"demo": True})
    async with TestClient(TestServer(build_app(demo))) as client:
        body = await _json(await client.get("/ready"))
        assert body["avatar_root"] == "absent (demo avatar only)"


# -- the page ---------------------------------------------------------------------------------


async def test_admin_page_is_served_with_its_assets(client: Client) -> None:
    response = await client.get("/admin")
    assert response.status == 200
    assert response.content_type == "text/html"
    html = await response.text()
    for heading in ("Models", "Devices", "Sessions"):
        assert f">{heading}</h2>" in html
    for column in ("State", "Device", "Memory", "Usage", "Frames", "Mean ms", "Queue", "Busy"):
        assert f">{column}</th>" in html
    assert "/static/admin.js" in html
    script = await client.get("/static/admin.js")
    assert script.status == 200
    js = await script.text()
    assert "sessionStorage" in js
    assert "Bearer" in js
    assert "http" not in html.replace("http-equiv", "")  # no external resources
    assert (await client.get("/static/admin.css")).status == 200


# -- sessions -----------------------------------------------------------------------------------


async def test_sessions_are_listed_and_hung_up(tmp_path: Path, loopback: None) -> None:
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        caller = Caller(client)
        await caller.connect(microphone=None)
        try:
            await caller.wait_for_frames(25)
            listed = await _json(await client.get("/admin/sessions"))
            # A second read, a second of media later, measures the recent rate.
            await caller.wait_for_frames(len(caller.received.video_times) + 25)
            listed = await _json(await client.get("/admin/sessions"))
            [session] = listed["sessions"]
            assert session["id"] == caller.session_id
            assert session["avatar"] == "demo"
            assert session["state"] in {"connected", "streaming"}
            assert session["uptime_s"] > 0
            assert session["output_fps"] > 0  # frames went out between the two reads
            assert set(session["added_delay_ms"]) == {"p50", "p95", "mean", "stages", "sending"}
            # Each track is at most CATCH_UP_S late before it skips to the current slot,
            # so the next chunk and the next frame differ by that plus one slot of each.
            bound_ms = (CATCH_UP_S + 1 / 25 + AUDIO_CHUNK_S) * 1000
            assert abs(session["av_offset_ms"]) <= bound_ms
            assert session["bitrate_bps"] > 0  # our H.264 encoder is installed at once
            assert session["remote"] == "127.0.0.1"
            assert isinstance(session["frames_dropped"], dict)
            stats = await _json(await client.get("/admin/stats"))
            assert stats["global"]["live_sessions"] == 1
            assert stats["global"]["sessions_started"] == 1

            closed = await _json(await client.delete(f"/admin/sessions/{caller.session_id}"))
            assert closed == {"session_id": caller.session_id, "state": "closed"}
            assert (await _json(await client.get("/admin/sessions")))["sessions"] == []
            gone = await client.delete(f"/admin/sessions/{caller.session_id}")
            await _error(gone, 404, "session_not_found")
        finally:
            await caller.close()
