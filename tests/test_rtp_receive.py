"""The caller's RTP, handled in aioice's callback (``streaming/webrtc/rtp_receive.py``):
a real call's microphone takes that path and reaches the mixer; a handling that
suspends keeps the packets behind it in order, bounded; SRTP still refuses a replay."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pylibsrtp
import pytest
from aiohttp.test_utils import TestClient
from aiortc.rtp import RtcpRrPacket, RtpPacket

from streaming.live.manager import SessionManager
from streaming.webrtc.compat import ReceiveHooks
from streaming.webrtc.rtp_receive import MAX_BEHIND, DirectReceive
from tests.live_calls import demo_app, until
from tests.media import write_wav
from tests.webrtc_client import Caller
from web.app_keys import SESSIONS

_PROFILE = pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80


@pytest.fixture
async def client(tmp_path: Path, loopback: None) -> AsyncIterator[TestClient[Any, Any]]:
    async with demo_app(tmp_path) as test_client:
        yield test_client


async def test_a_callers_microphone_is_taken_from_the_socket_to_the_mixer(
    client: TestClient[Any, Any],
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
    tmp_path: Path,
) -> None:
    pcm, _ = speech_16k
    caller = Caller(client)
    await caller.connect(microphone=write_wav(tmp_path / "speech.wav", np.tile(pcm, 4), 16_000))
    try:
        manager: SessionManager = client.app[SESSIONS]
        session = manager.get(caller.session_id)
        (receive,) = session.peer.receives  # one transport: BUNDLE
        await until(lambda: receive.handled >= 150, "the caller's packets")
        await until(lambda: len(session.pipeline.stats.caller_audio_ms) >= 20, "its audio, out")
        stats = list((await session.peer._pc.getStats()).values())
        inbound = sum(s.packetsReceived for s in stats if s.type == "inbound-rtp")
        transport = sum(s.packetsReceived for s in stats if s.type == "transport")
    finally:
        await caller.hang_up()
    # Every RTP packet aiortc's receiver counted came this way; the transport's stats
    # count them as well as what went aioice's way (DTLS, the caller's RTCP).
    assert inbound > 0
    assert receive.handled >= inbound - 2  # a packet or two may arrive between the reads
    assert transport >= receive.handled + receive.passed_on - 4
    assert receive.passed_on > 0
    assert (receive.refused, receive.dropped) == (0, 0)


class Rig:
    """A DirectReceive on hand-made hooks: a real SRTP pair, a handling that records the
    sequence numbers it finishes and waits, for the packets in ``hold``, on ``gate``."""

    def __init__(self) -> None:
        key = os.urandom(30)
        self.tx = pylibsrtp.Session(
            pylibsrtp.Policy(
                key=key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND, srtp_profile=_PROFILE
            )
        )
        self.keyed = True
        self.rx = pylibsrtp.Session(
            pylibsrtp.Policy(
                key=key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND, srtp_profile=_PROFILE
            )
        )
        self.queued: list[bytes] = []
        self.finished: list[int] = []
        self.hold: set[int] = set()
        self.fail: set[int] = set()
        self.gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.counted = 0
        self.direct = DirectReceive(self._connect)

    def _connect(self, receive: Any) -> ReceiveHooks:
        def counted(size: int) -> None:
            self.counted += 1

        return ReceiveHooks(
            queue=lambda data, component: self.queued.append(data),
            srtp=lambda: self.rx if self.keyed else None,
            handle_rtp=self._handle,
            counted=counted,
            now_ms=lambda: 0,
        )

    def _handle(self, data: bytes, arrival_time_ms: int) -> Coroutine[Any, Any, None]:
        async def handle() -> None:
            sequence = RtpPacket.parse(data).sequence_number
            if sequence in self.hold:
                await self.gate
            if sequence in self.fail:
                raise ValueError("a receiver that fails")
            self.finished.append(sequence)

        return handle()

    def rtp(self, sequence: int) -> bytes:
        packet = RtpPacket(payload_type=111, sequence_number=sequence, timestamp=sequence * 960)
        packet.ssrc = 1234
        packet.payload = b"\xfc" + bytes(20)
        return bytes(self.tx.protect(packet.serialize()))


async def test_packets_behind_a_handling_that_waits_keep_their_order() -> None:
    rig = Rig()
    rig.hold = {2}
    packets = {n: rig.rtp(n) for n in range(1, 8)}
    rig.direct.datagram(packets[1], 1)
    assert rig.finished == [1]  # handled in the callback itself
    rig.direct.datagram(packets[2], 1)  # its handling waits
    rig.direct.datagram(packets[3], 1)
    rig.direct.datagram(packets[4], 1)
    assert rig.finished == [1]  # 3 and 4 wait behind 2, as behind the transport's task
    rig.gate.set_result(None)
    await until(lambda: rig.finished == [1, 2, 3, 4], "the packets behind it")
    rig.fail = {5}
    for n in (5, 6):  # a handling that raises loses its packet only
        rig.direct.datagram(packets[n], 1)
    assert rig.finished == [1, 2, 3, 4, 6]
    rig.direct.datagram(packets[6], 1)  # a replay: SRTP refuses it
    assert (rig.direct.refused, rig.finished[-1]) == (1, 6)
    assert rig.direct.handled == 5
    assert rig.counted == 7


async def test_what_is_not_the_callers_rtp_goes_aioices_way_and_a_backlog_is_bounded() -> None:
    rig = Rig()
    rtcp = bytes(RtcpRrPacket(ssrc=1234))
    dtls = b"\x16\xfe\xfd" + bytes(30)
    rig.direct.datagram(rtcp, 1)
    rig.direct.datagram(dtls, 1)
    rig.keyed = False  # before DTLS keyed SRTP
    early = rig.rtp(1)
    rig.direct.datagram(early, 1)
    assert rig.queued == [rtcp, dtls, early]
    assert rig.direct.passed_on == 3
    assert rig.finished == []

    rig.keyed = True
    rig.hold = {2}
    rig.direct.datagram(rig.rtp(2), 1)  # waits: the next ones queue behind it
    for n in range(3, 3 + MAX_BEHIND + 5):
        rig.direct.datagram(rig.rtp(n), 1)
    assert rig.direct.dropped == 5
    rig.gate.set_result(None)
    want = list(range(2, 3 + MAX_BEHIND))
    await until(lambda: rig.finished == want, "the packets kept behind it")
    await rig.direct.close()
