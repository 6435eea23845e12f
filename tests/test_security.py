"""Session tokens, the offer rate limit and CORS."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from config.settings import Settings
from tests.webrtc_client import Caller
from web.app import build_app
from web.app_keys import SETTINGS
from web.cli.main import main
from web.rate_limit import RateLimiter
from web.session_tokens import mint_token

SECRET = "test-secret-" + "0123456789abcdef" * 4  # HS512 needs 64 bytes too
SDP = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n"  # passes auth, then fails the offer check


def _settings(tmp_path: Path, **extra: object) -> Settings:
    return Settings.model_validate(
        {"avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "data")}, **extra}
    )


@pytest.fixture
async def secured(tmp_path: Path, loopback: None) -> AsyncIterator[TestClient[object, object]]:
    settings = _settings(tmp_path, auth={"jwt_secret": SECRET})
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        yield client


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_offers_need_a_valid_token_for_that_avatar(
    secured: TestClient[object, object],
) -> None:
    auth = secured.app[SETTINGS].auth  # type: ignore[index]
    now = int(time.time())
    tokens = {
        "missing": None,
        "other avatar": mint_token(auth, "alice", ttl_s=60),
        "expired": jwt.encode({"avatar": "demo", "iat": now - 200, "exp": now - 100}, SECRET),
        "wrong key": jwt.encode({"avatar": "demo", "iat": now, "exp": now + 60}, "x" * 40),
        "unsigned": jwt.encode({"avatar": "demo", "iat": now, "exp": now + 60}, None, "none"),
        "other algorithm": jwt.encode(
            {"avatar": "demo", "iat": now, "exp": now + 60}, SECRET, algorithm="HS512"
        ),
        "no expiry": jwt.encode({"avatar": "demo", "iat": now}, SECRET),
        "too long": jwt.encode({"avatar": "demo", "iat": now, "exp": now + 10**7}, SECRET),
    }
    for case, token in tokens.items():
        headers = _bearer(token) if token else {}
        response = await secured.post(
            "/offer", json={"sdp": SDP, "type": "offer", "avatar": "demo"}, headers=headers
        )
        assert response.status == 401, case
        assert (await response.json())["error"]["code"] == "unauthorized"
    good = mint_token(auth, "demo", ttl_s=60)
    response = await secured.post(
        "/offer", json={"sdp": SDP, "type": "offer", "avatar": "demo"}, headers=_bearer(good)
    )
    assert response.status == 400  # authorised; then the offer itself is refused


async def test_session_endpoints_need_the_avatars_token(
    secured: TestClient[object, object],
) -> None:
    auth = secured.app[SETTINGS].auth  # type: ignore[index]
    token = mint_token(auth, "demo", ttl_s=60)
    caller = Caller(secured, headers=_bearer(token))
    await caller.connect(microphone=None)
    try:
        path = f"/sessions/{caller.session_id}"
        assert (await secured.get(path)).status == 401
        other = _bearer(mint_token(auth, "alice", ttl_s=60))
        assert (await secured.post(f"{path}/interrupt", headers=other)).status == 401
        assert (await secured.get(path, headers=_bearer(token))).status == 200
    finally:
        await caller.hang_up()


def test_cli_mints_a_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"auth:\n  jwt_secret: {SECRET}\n")
    assert main(["--config", str(config), "token", "mint", "--avatar", "demo", "--ttl", "90"]) == 0
    token = capsys.readouterr().out.strip()
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["avatar"] == "demo"
    assert claims["exp"] - claims["iat"] == 90
    assert main(["token", "mint", "--avatar", "demo"]) == 2  # no secret configured
    assert "jwt_secret is not set" in capsys.readouterr().err


async def test_offers_are_rate_limited_per_client(tmp_path: Path) -> None:
    settings = _settings(tmp_path, server={"offer_rate_limit_per_minute": 3})
    async with TestClient(TestServer(build_app(settings))) as client:
        statuses = []
        for _ in range(4):
            response = await client.post("/offer", json={"sdp": SDP, "type": "offer"})
            statuses.append(response.status)
        assert statuses == [400, 400, 400, 429]
        assert int(response.headers["Retry-After"]) >= 1
        assert (await response.json())["error"]["code"] == "rate_limited"


def test_rate_limiter_buckets() -> None:
    now = [0.0]
    limiter = RateLimiter(60, max_clients=2, clock=lambda: now[0])  # one per second
    assert all(limiter.retry_after("a") is None for _ in range(60))
    wait = limiter.retry_after("a")
    assert wait is not None
    assert 0.9 < wait <= 1.0
    assert limiter.retry_after("b") is None  # other clients are not affected
    now[0] += 1.0
    assert limiter.retry_after("a") is None  # refilled
    limiter.retry_after("c")  # a third client pushes the oldest bucket out
    assert len(limiter._buckets) == 2
    assert RateLimiter(0).retry_after("x") is None  # 0 = off


async def test_cors_allows_only_listed_origins(tmp_path: Path) -> None:
    settings = _settings(tmp_path, server={"cors_origins": ["https://app.example"]})
    async with TestClient(TestServer(build_app(settings))) as client:
        preflight = await client.options(
            "/offer",
            headers={
                "Origin": "https://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert preflight.status == 204
        assert preflight.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
        allowed = await client.get("/avatars", headers={"Origin": "https://app.example"})
        assert allowed.headers["Access-Control-Allow-Origin"] == "https://app.example"
        other = await client.get("/avatars", headers={"Origin": "https://evil.example"})
        assert other.status == 200
        assert "Access-Control-Allow-Origin" not in other.headers


async def _gzip_aware(request: web.Request) -> web.Response:
    """A handler whose answer varies by something else already."""
    return web.json_response({}, headers={"Vary": "Accept-Encoding"})


async def _streamed(request: web.Request) -> web.StreamResponse:
    """A handler that sends its head before it returns (as /v1/infer and the OIP do)."""
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"sent")
    return response


async def _moved(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/avatars")  # below 400: past the error middleware, as raised


async def test_every_answer_varies_by_origin_once_an_origin_is_allowed(tmp_path: Path) -> None:
    """With an allow-list, whether an answer carries the CORS headers depends on Origin,
    so a shared cache must key every answer on it: allowed, other or no origin, errors,
    refused preflights, streamed answers, and with the handler's own Vary kept."""
    app = build_app(_settings(tmp_path, server={"cors_origins": ["https://app.example"]}))
    app.router.add_get("/test/gzip-aware", _gzip_aware)
    app.router.add_get("/test/streamed", _streamed)
    app.router.add_get("/test/moved", _moved)
    allowed, other = {"Origin": "https://app.example"}, {"Origin": "https://evil.example"}
    preflight = {"Access-Control-Request-Method": "POST"}
    async with TestClient(TestServer(app)) as client:
        for method, path, headers, status in (
            ("GET", "/avatars", allowed, 200),
            ("GET", "/avatars", other, 200),
            ("GET", "/avatars", {}, 200),
            ("GET", "/no/such/path", other, 404),
            ("GET", "/no/such/path", {}, 404),
            ("POST", "/offer", other, 400),  # a RequestError, as JSON
            ("OPTIONS", "/offer", {**allowed, **preflight}, 204),
            ("OPTIONS", "/offer", {**other, **preflight}, 405),
            ("GET", "/test/streamed", allowed, 200),
            ("GET", "/test/streamed", other, 200),
            ("GET", "/test/moved", other, 302),
        ):
            response = await client.request(
                method, path, headers=headers, data=b"{}", allow_redirects=False
            )
            what = f"{method} {path} {headers}"
            assert response.status == status, what
            assert response.headers.getall("Vary") == ["Origin"], what
            cors = response.headers.get("Access-Control-Allow-Origin")
            assert cors == (
                allowed["Origin"] if headers.get("Origin") in allowed.values() else None
            )
            if status >= 400:
                assert "error" in await response.json(), what
        for headers in (allowed, other, {}):
            merged = await client.get("/test/gzip-aware", headers=headers)
            assert merged.headers.getall("Vary") == ["Accept-Encoding, Origin"]

    # No origin allowed: no answer depends on it, and none says it does.
    async with TestClient(TestServer(build_app(_settings(tmp_path)))) as client:
        for headers in (allowed, {}):
            response = await client.get("/avatars", headers=headers)
            assert "Vary" not in response.headers
            assert "Access-Control-Allow-Origin" not in response.headers
