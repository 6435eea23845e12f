"""``server.ice_public_address``: answers offer every host candidate at the public address
too (a 1:1 NAT), on numbers and from a real server to a real aiortc caller."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from config.settings import Settings
from streaming.webrtc.public_address import with_public_address
from tests.packages import make_package
from tests.webrtc_client import Caller
from web.app import build_app
from web.cluster.worker import PUBLIC_ADDRESS_ENV, worker_settings

ANSWER = "\r\n".join(
    [
        "v=0",
        "m=video 9 UDP/TLS/RTP/SAVPF 102",
        "a=candidate:0f2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d 1 udp 2130706431 10.0.0.5 40001 typ host",
        "a=candidate:1a 1 udp 2130706430 fd00::5 40002 typ host",
        "a=candidate:2b 1 udp 1694498815 198.51.100.7 40001 typ srflx raddr 10.0.0.5 rport 40001",
        "a=candidate:3c 1 udp 2130706431 host-1234.local 40003 typ host",
        "a=end-of-candidates",
        "",
    ]
)


def test_every_host_candidate_of_the_family_gets_a_twin_at_the_public_address() -> None:
    sdp = with_public_address(ANSWER, "203.0.113.9")
    candidates = [line for line in sdp.split("\r\n") if line.startswith("a=candidate:")]
    assert len(candidates) == 5  # one twin: for the IPv4 host candidate only
    twin = candidates[1]
    foundation, component, transport, priority, address, port, typ, kind = twin[12:].split()
    assert (address, port, typ, kind) == ("203.0.113.9", "40001", "typ", "host")
    assert (component, transport, priority) == ("1", "udp", "2130706430")  # one step lower
    assert len(foundation) <= 32
    assert foundation != candidates[0][12:].split()[0]
    # The rest of the answer is unchanged, in order.
    assert sdp.replace(twin + "\r\n", "") == ANSWER
    # An IPv6 public address twins the IPv6 candidate; the public address itself is not.
    assert "fd00::5" in with_public_address(ANSWER, "2001:db8::9")
    assert with_public_address(ANSWER, "10.0.0.5") == ANSWER


def test_a_worker_takes_its_nodes_public_address() -> None:
    settings = Settings.model_validate({"cluster": {"workers": 2}})
    node = worker_settings(settings, {PUBLIC_ADDRESS_ENV: "203.0.113.9"})
    assert str(node.server.ice_public_address) == "203.0.113.9"
    assert worker_settings(settings, {}).server.ice_public_address is None
    with pytest.raises(ValueError, match=PUBLIC_ADDRESS_ENV):
        worker_settings(settings, {PUBLIC_ADDRESS_ENV: "not-an-address"})


async def test_a_real_answer_offers_the_public_twin_and_the_call_connects(
    tmp_path: Path, loopback: None
) -> None:
    make_package(tmp_path / "alice")
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "data"), "demo": False},
            "video": {"preset": "ultrafast"},
            "server": {"ice_public_address": "203.0.113.9"},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        caller = Caller(client, "alice")
        answers: list[str] = []
        original = caller.pc.setRemoteDescription

        async def keep(description: object) -> None:
            answers.append(description.sdp)  # type: ignore[attr-defined]
            await original(description)  # type: ignore[arg-type]

        caller.pc.setRemoteDescription = keep  # type: ignore[method-assign]
        try:
            await caller.connect()
            await caller.wait_for_frames(3)  # the twin breaks nothing for a direct caller
        finally:
            await caller.hang_up()
    hosts = re.findall(r"a=candidate:\S+ 1 udp \d+ (\S+) (\d+) typ host", answers[0])
    local = {port for address, port in hosts if address == "127.0.0.1"}
    public = {port for address, port in hosts if address == "203.0.113.9"}
    assert local
    assert public == local  # the same ports: what a 1:1 NAT forwards
