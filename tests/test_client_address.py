"""The client behind a reverse proxy: trusted proxies' forwarding headers, nobody else's.

Real HTTP through aiohttp's test server; requests come from 127.0.0.1, which plays the
proxy when it is listed in ``server.trusted_proxies``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import ValidationError

from config.settings import Settings
from web.app import build_app
from web.client_address import client_address, forwarded_hops, parse_networks

PROXIES = parse_networks(["127.0.0.1", "10.0.0.0/8", "fd00::/8"])


def _hops(header: str = "x-forwarded-for", **headers: str) -> list[str]:
    names = {k.replace("_", "-"): v for k, v in headers.items()}
    return forwarded_hops(CIMultiDictProxy(CIMultiDict(names)), header)


@pytest.mark.parametrize(
    ("peer", "hops", "client"),
    [
        ("127.0.0.1", ["203.0.113.7"], "203.0.113.7"),
        # A client's own (forged) entries sit left of what our proxies appended.
        ("127.0.0.1", ["198.51.100.1", "203.0.113.7", "10.1.2.3"], "203.0.113.7"),
        ("10.9.9.9", ["2001:db8::5"], "2001:db8::5"),
        ("198.51.100.9", ["203.0.113.7"], "198.51.100.9"),  # not a proxy: headers ignored
        ("127.0.0.1", [], "127.0.0.1"),  # a proxy's own request
        ("127.0.0.1", ["10.0.0.1", "10.0.0.2"], "10.0.0.1"),  # only proxies: the first
    ],
)
def test_the_rightmost_untrusted_hop_is_the_client(peer: str, hops: list[str], client: str) -> None:
    assert client_address(peer, hops, PROXIES) == client
    assert client_address(peer, hops, []) == peer  # trusting nobody: the peer, always


def test_forwarding_headers_are_parsed() -> None:
    assert _hops(X_Forwarded_For="198.51.100.1, 203.0.113.7") == ["198.51.100.1", "203.0.113.7"]
    forwarded = 'for=198.51.100.1;proto=https, for="[2001:db8::5]:4711", for=_hidden'
    assert _hops("forwarded", Forwarded=forwarded, X_Forwarded_For="ignored") == [
        "198.51.100.1",
        "2001:db8::5",
        "_hidden",
    ]
    # Only the configured header is read: a client's own copy of the other one is not.
    assert _hops(Forwarded="for=203.0.113.9", X_Forwarded_For="198.51.100.1") == ["198.51.100.1"]
    assert _hops(Forwarded="for=203.0.113.9") == []
    assert _hops("forwarded", X_Forwarded_For="198.51.100.1") == []


def test_a_bad_proxy_entry_is_refused_naming_the_key() -> None:
    with pytest.raises(ValidationError, match="trusted_proxies"):
        Settings.model_validate({"server": {"trusted_proxies": ["not-an-address"]}})


def _settings(tmp_path: Path, **server: object) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "data"), "demo": False},
            "server": {"offer_rate_limit_per_minute": 1, **server},
        }
    )


async def _offer_statuses(client: TestClient[object, object], *forwarded: str) -> list[int]:
    statuses = []
    for address in forwarded:
        response = await client.post(
            "/offer", json={"sdp": "v=0", "type": "offer"}, headers={"X-Forwarded-For": address}
        )
        statuses.append(response.status)
    return statuses


async def test_rate_limits_follow_the_client_behind_a_trusted_proxy(tmp_path: Path) -> None:
    settings = _settings(tmp_path, trusted_proxies=["127.0.0.1"])
    async with TestClient(TestServer(build_app(settings))) as client:
        # One offer a minute per client: two clients behind the proxy are two buckets.
        assert await _offer_statuses(client, "203.0.113.7", "203.0.113.8") == [
            404,
            404,
        ]  # no avatar "demo" here: past the limiter
        assert await _offer_statuses(client, "203.0.113.7") == [429]
        # Through the proxy, admin is never "local": the token rule applies.
        admin = await client.get("/admin/stats", headers={"X-Forwarded-For": "203.0.113.7"})
        assert admin.status == 403


async def test_forged_headers_from_an_untrusted_peer_are_ignored(tmp_path: Path) -> None:
    async with TestClient(TestServer(build_app(_settings(tmp_path)))) as client:
        # No trusted proxies: every "client" is 127.0.0.1, one bucket.
        assert await _offer_statuses(client, "203.0.113.7", "203.0.113.8") == [404, 429]


async def test_only_the_configured_forwarding_header_is_read(tmp_path: Path) -> None:
    """nginx appends to X-Forwarded-For and passes a client's own Forwarded on: a forged
    Forwarded must not move the client into another rate-limit bucket."""
    settings = _settings(tmp_path, trusted_proxies=["127.0.0.1"])
    async with TestClient(TestServer(build_app(settings))) as client:
        statuses = []
        for forged in ("for=198.51.100.1", "for=198.51.100.2"):
            response = await client.post(
                "/offer",
                json={"sdp": "v=0", "type": "offer"},
                headers={"X-Forwarded-For": "203.0.113.7", "Forwarded": forged},
            )
            statuses.append(response.status)
        assert statuses == [404, 429]  # both counted as 203.0.113.7
    settings = _settings(tmp_path, trusted_proxies=["127.0.0.1"], forwarded_header="forwarded")
    async with TestClient(TestServer(build_app(settings))) as client:
        for forwarded in ("for=198.51.100.1", "for=198.51.100.2"):
            response = await client.post(
                "/offer",
                json={"sdp": "v=0", "type": "offer"},
                headers={"Forwarded": forwarded, "X-Forwarded-For": "203.0.113.7"},
            )
            assert response.status == 404  # two clients, two buckets: past the limiter
