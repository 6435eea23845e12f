"""lipstream behind Debian's nginx with TLS, configured by ``docs/deploy/nginx.conf`` itself.

nginx runs as the test's subprocess (``tests/nginx_proxy.py``) with a self-signed
certificate for ``lipstream.test`` and proxies to the real application (aiohttp's test
server over ``web.app.build_app``). It connects to lipstream from 127.0.0.5, the one
address in ``server.trusted_proxies``; clients connect to nginx from other loopback
addresses (Chromium from 127.0.0.1, aiohttp clients bound to 127.0.0.2 and 127.0.0.3).
So the address lipstream gives a request says whether it came from nginx's
X-Forwarded-For, and whose: per-address offer limits and the session's ``remote`` show it.
"""

from __future__ import annotations

import math
import re
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse, ClientSession, TCPConnector
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import TestServer

from benchmarks.chromium import caller_page
from config.settings import MIB, ServerSettings, SessionSettings, Settings
from inference_core.adapter.spec import AdapterSpec
from tests.nginx_proxy import DOCUMENTED_SITE, Nginx, TlsCertificate, run_nginx, self_signed
from tests.test_demo_page import (
    TIMEOUT_MS,
    _hang_up,
    _request_to,
    _stats,
    chromium,
    data_dir,
    fake_mic_wav,
)
from web.app import build_app
from web.schemas.inference import MAX_REQUEST_FRAMES

# Without playwright the `chromium` fixture fails every browser test with the install command.
with suppress(ImportError):
    from playwright.async_api import Error, Page, expect

__all__ = ["chromium", "data_dir", "fake_mic_wav"]  # fixtures shared with the demo page test

HOSTNAME = "lipstream.test"
NGINX_ADDRESS = "127.0.0.5"  # the trusted proxy: nginx's proxy_bind
BROWSER_ADDRESS = "127.0.0.1"
CLIENT_A, CLIENT_B = "127.0.0.2", "127.0.0.3"
FORGED = "203.0.113.9"
ADMIN_TOKEN = "proxy-test-admin-token-0123456789"
OFFERS_PER_MINUTE = 2
# Valid JSON, not an offer: refused (400) after the rate limiter, before any WebRTC work.
NOT_AN_OFFER: dict[str, Any] = {"type": "offer"}


class _Hosts(AbstractResolver):
    """``lipstream.test`` is 127.0.0.1, as Chromium's ``--host-resolver-rules`` has it."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        assert host == HOSTNAME, f"only {HOSTNAME} resolves here, not {host}"
        return [
            ResolveResult(
                hostname=host,
                host="127.0.0.1",
                port=port,
                family=socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]

    async def close(self) -> None:
        pass


@asynccontextmanager
async def client_from(address: str, certificate: TlsCertificate) -> AsyncIterator[ClientSession]:
    """An HTTP client whose connections come from ``address``, trusting ``certificate``."""
    tls = ssl.create_default_context(cafile=certificate.cert)
    connector = TCPConnector(local_addr=(address, 0), ssl=tls, resolver=_Hosts())
    async with ClientSession(connector=connector) as session:
        yield session


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> TlsCertificate:
    return self_signed(tmp_path_factory.mktemp("tls"), HOSTNAME)


@pytest.fixture
async def lipstream(
    request: pytest.FixtureRequest, tmp_path: Path, data_dir: Path, loopback: None
) -> AsyncIterator[TestServer]:
    """The real application on 127.0.0.1, trusting nginx's address only.

    Indirect parametrisation overrides ``server`` settings, e.g. ``{"admin_token": None}``.
    """
    server: dict[str, Any] = {
        "trusted_proxies": [f"{NGINX_ADDRESS}/32"],
        "admin_token": ADMIN_TOKEN,
        "offer_rate_limit_per_minute": OFFERS_PER_MINUTE,
        **getattr(request, "param", {}),
    }
    settings = Settings.model_validate(
        {
            "server": server,
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(data_dir)},
            "devices": {"kind": "cpu"},
        }
    )
    test_server = TestServer(build_app(settings), host="127.0.0.1")
    async with test_server:
        yield test_server


@pytest.fixture
async def proxy(
    tmp_path: Path, lipstream: TestServer, certificate: TlsCertificate
) -> AsyncIterator[Nginx]:
    """Debian's nginx running the documented site in front of ``lipstream``."""
    async with run_nginx(
        tmp_path / "nginx",
        hostname=HOSTNAME,
        certificate=certificate,
        upstream=f"127.0.0.1:{lipstream.port}",
        proxy_address=NGINX_ADDRESS,
    ) as nginx:
        yield nginx


def _https(proxy: Nginx, path: str) -> str:
    return f"https://{HOSTNAME}:{proxy.https_port}{path}"


@pytest.fixture
async def page(
    tmp_path: Path, fake_mic_wav: Path, chromium: Path, certificate: TlsCertificate
) -> AsyncIterator[Page]:
    """A Chromium page that finds ``lipstream.test`` at 127.0.0.1 and accepts exactly the
    test's certificate (by its public key): a real https:// origin, not localhost."""
    page_errors: list[Error] = []
    browser_args = [
        f"--host-resolver-rules=MAP {HOSTNAME} {BROWSER_ADDRESS}",
        f"--ignore-certificate-errors-spki-list={certificate.spki_sha256}",
    ]
    async with caller_page(tmp_path / "chromium-profile", fake_mic_wav, browser_args) as tab:
        tab.set_default_timeout(TIMEOUT_MS)
        tab.on("pageerror", lambda error: page_errors.append(error))
        yield tab
    assert not page_errors, f"uncaught errors in the page: {page_errors}"


async def _admin_sessions(proxy: Nginx, certificate: TlsCertificate) -> list[dict[str, Any]]:
    async with client_from(CLIENT_B, certificate) as admin:
        response = await admin.get(
            _https(proxy, "/admin/sessions"), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        assert response.status == 200, await response.text()
        sessions: list[dict[str, Any]] = (await response.json())["sessions"]
        return sessions


@pytest.mark.slow
async def test_demo_page_over_https_completes_a_call_through_nginx(
    lipstream: TestServer, proxy: Nginx, certificate: TlsCertificate, page: Page
) -> None:
    await page.goto(_https(proxy, "/?raw_audio=1"))
    where = await page.evaluate(
        "() => ({secure: window.isSecureContext, protocol: location.protocol,"
        " hostname: location.hostname,"
        " http: performance.getEntriesByType('navigation')[0].nextHopProtocol})"
    )
    # getUserMedia needs a secure context; this one comes from TLS, not from "localhost".
    assert where == {"secure": True, "protocol": "https:", "hostname": HOSTNAME, "http": "h2"}

    await page.get_by_label("Avatar", exact=True).select_option("demo")
    await page.get_by_role("button", name="Start with microphone").click()
    await page.wait_for_function(
        "() => window.lipstreamStats.state === 'connected'"
        " && window.lipstreamStats.framesDecoded >= 25"
    )
    stats = await _stats(page)
    assert stats["codec"] == "video/H264"
    assert (stats["width"], stats["height"]) == (1280, 720)

    # lipstream saw the offer come from the browser's address as nginx forwarded it (the
    # connection itself came from nginx's 127.0.0.5).
    sessions = await _admin_sessions(proxy, certificate)
    assert [s["remote"] for s in sessions] == [BROWSER_ADDRESS], sessions

    # A pushed audio body passes through nginx too (request buffering off, body cap).
    async with page.expect_response(_request_to("POST", "audio")) as pushed:
        await page.get_by_role("button", name="Play sample").click()
    assert (await pushed.value).status == 202, await (await pushed.value).text()
    await expect(page.get_by_role("status")).to_contain_text("Speaking the sample")

    await _hang_up(page, lipstream)


async def _offer(client: ClientSession, url: str, **headers: str) -> ClientResponse:
    async with client.post(url, json=NOT_AN_OFFER, headers=headers) as response:
        await response.read()
        return response


async def _error_code(response: ClientResponse) -> str:
    assert response.content_type == "application/json", await response.text()
    code: str = (await response.json())["error"]["code"]
    return code


async def _exhaust_offers(client: ClientSession, url: str, **headers: str) -> ClientResponse:
    """Spend the client's offers for this minute; the refusal that follows."""
    for _ in range(OFFERS_PER_MINUTE):
        allowed = await _offer(client, url, **headers)
        assert allowed.status == 400, await allowed.text()  # lipstream refused the body
    return await _offer(client, url, **headers)


async def test_clients_behind_nginx_have_separate_offer_limits(
    proxy: Nginx, certificate: TlsCertificate
) -> None:
    url = _https(proxy, "/offer")
    async with client_from(CLIENT_A, certificate) as a, client_from(CLIENT_B, certificate) as b:
        refused = await _exhaust_offers(a, url)
        assert refused.status == 429
        assert await _error_code(refused) == "rate_limited"
        assert int(refused.headers["Retry-After"]) >= 1
        # Same proxy, same connection source towards lipstream: B's offers still count as B's.
        other = await _offer(b, url)
        assert other.status == 400
        assert await _error_code(other) != "rate_limited"


async def test_forged_forwarding_headers_do_not_name_the_client(
    lipstream: TestServer, proxy: Nginx, certificate: TlsCertificate
) -> None:
    url = _https(proxy, "/offer")
    forged = {"X-Forwarded-For": FORGED, "Forwarded": f"for={FORGED}"}
    async with client_from(CLIENT_A, certificate) as a, client_from(CLIENT_B, certificate) as b:
        # Through nginx: nginx appends A's real address (and drops Forwarded), so A's offers
        # count against A, not against the address it claimed.
        assert (await _exhaust_offers(a, url, **forged)).status == 429
        claimed_too = await _offer(b, url, **forged)
        assert claimed_too.status == 400, "B was limited as the forged address A exhausted"
        # Straight to lipstream, not through a trusted proxy: the headers are ignored and A
        # is A, whose offers are spent.
        direct = await _offer(a, str(lipstream.make_url("/offer")), **forged)
        assert direct.status == 429
        assert await _error_code(direct) == "rate_limited"


async def test_admin_through_nginx_needs_the_token(
    proxy: Nginx, certificate: TlsCertificate
) -> None:
    url = _https(proxy, "/admin/sessions")
    # From this machine, through a proxy that connects from loopback too.
    async with client_from(BROWSER_ADDRESS, certificate) as client:
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            async with client.get(url, headers=headers) as refused:
                assert refused.status == 401
                assert refused.headers["WWW-Authenticate"] == "Bearer"
                assert await _error_code(refused) == "unauthorized"
        bearer = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with client.get(url, headers=bearer) as allowed:
            assert allowed.status == 200
            assert await allowed.json() == {"sessions": []}


@pytest.mark.parametrize("lipstream", [{"admin_token": None}], indirect=True)
async def test_without_a_token_admin_is_refused_through_nginx_though_it_is_local(
    lipstream: TestServer, proxy: Nginx, certificate: TlsCertificate
) -> None:
    async with client_from(BROWSER_ADDRESS, certificate) as client:
        async with client.get(_https(proxy, "/admin/sessions")) as proxied:
            assert proxied.status == 403
            assert await _error_code(proxied) == "forbidden"
        # The same machine without the proxy is let in: it is nginx that made the difference.
        async with client.get(lipstream.make_url("/admin/sessions")) as direct:
            assert direct.status == 200


async def test_plain_http_redirects_to_https(proxy: Nginx) -> None:
    async with ClientSession() as client:
        url = f"http://127.0.0.1:{proxy.http_port}/admin?from=http"
        async with client.get(url, headers={"Host": HOSTNAME}, allow_redirects=False) as answer:
            assert answer.status == 301
            assert answer.headers["Location"] == f"https://{HOSTNAME}/admin?from=http"


def _body_caps(config: str) -> dict[str, int]:
    """``client_max_body_size`` in bytes by the block it is set in (``server``, ``location
    /v1/infer/``), from an nginx config with one directive or brace per line."""
    units = {"": 1, "k": 1024, "m": MIB, "g": 1024 * MIB}
    blocks: list[str] = []
    caps = {}
    for line in config.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.endswith("{"):
            blocks.append(line.removesuffix("{").strip())
        elif line == "}":
            blocks.pop()
        elif size := re.fullmatch(r"client_max_body_size (\d+)([kmg]?);", line, re.I):
            caps[blocks[-1]] = int(size[1]) * units[size[2].lower()]
    return caps


def test_the_documented_body_caps_cover_lipstreams_own_limits() -> None:
    """nginx must not refuse a body lipstream would take: its caps are at least the
    defaults of lipstream's own per-route limits."""
    caps = _body_caps(DOCUMENTED_SITE.read_text())
    # Every browser-facing body: audio push, offers (the server-level cap).
    assert caps["server"] >= SessionSettings().max_audio_push_bytes
    assert caps["server"] >= ServerSettings().max_offer_bytes
    # The largest remote-inference body, float32 inputs for the default model spec.
    spec = AdapterSpec()
    frame_bytes = 4 * (math.prod(spec.visual_shape) + math.prod(spec.audio_shape))
    assert caps["location /v1/infer/"] >= MAX_REQUEST_FRAMES * frame_bytes
