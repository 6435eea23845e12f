"""TURN credentials in coturn's REST form: minted per client and per server connection.

The relay itself (coturn carrying a relay-only call) is issue 16's remaining test; here
the credentials are checked the way coturn checks them: HMAC-SHA1 of the username under
the shared secret, and an expiry ``ttl_s`` ahead.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import ValidationError

from config.settings import Settings
from streaming.webrtc.ice import ice_configuration
from streaming.webrtc.turn import turn_credentials
from web.app import build_app

SECRET = "north"
TURN = {"urls": ["turn:127.0.0.1:3478"], "secret": SECRET, "ttl_s": 600}


def _coturn_accepts(username: str, credential: str, now: float) -> bool:
    """What coturn's use-auth-secret does with a username and credential."""
    expiry = int(username.split(":", 1)[0])
    expected = base64.b64encode(
        hmac.new(SECRET.encode(), username.encode(), hashlib.sha1).digest()
    ).decode()
    return expiry > now and hmac.compare_digest(expected, credential)


def test_credentials_are_coturns_rest_form() -> None:
    username, credential = turn_credentials(SECRET, "alice", 600, now=1_700_000_000)
    assert username == "1700000600:alice"
    assert _coturn_accepts(username, credential, now=1_700_000_000)
    assert not _coturn_accepts(username, credential, now=1_700_000_601)  # expired
    assert not _coturn_accepts(username, credential + "x", now=1_700_000_000)


def test_turn_settings_need_urls_and_secret_together() -> None:
    with pytest.raises(ValidationError, match=r"turn\.secret"):
        Settings.model_validate({"turn": {"urls": ["turn:example.org"]}})
    with pytest.raises(ValidationError, match=r"turn\.urls is required"):
        Settings.model_validate({"turn": {"secret": "s"}})
    with pytest.raises(ValidationError, match="turn: or turns:"):
        Settings.model_validate({"turn": {"urls": ["stun:example.org"], "secret": "s"}})


async def test_each_client_and_server_connection_gets_fresh_credentials(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "d"), "demo": False},
            "server": {"ice_servers": [{"urls": "stun:127.0.0.1:3478"}]},
            "turn": TURN,
        }
    )
    async with TestClient(TestServer(build_app(settings))) as client:
        first = (await (await client.get("/webrtc-config")).json())["iceServers"]
        second = (await (await client.get("/webrtc-config")).json())["iceServers"]
    assert first[0] == {"urls": ["stun:127.0.0.1:3478"]}  # static entries kept
    turn = first[1]
    assert turn["urls"] == TURN["urls"]
    now = time.time()
    assert _coturn_accepts(turn["username"], turn["credential"], now)
    assert int(turn["username"].split(":")[0]) <= now + 600 + 1
    assert turn["username"] != second[1]["username"]  # one id per client
    servers = ice_configuration(settings).iceServers
    assert servers is not None
    own = servers[-1]
    assert own.urls == TURN["urls"]
    assert own.username.split(":", 1)[1].startswith("lipstream-server-")
    assert _coturn_accepts(own.username, own.credential, now)
    again = ice_configuration(settings).iceServers
    assert again is not None
    assert again[-1].username != own.username  # one id per connection (coturn's quotas)
