"""Many calls on one avatar, sent by ``lipstream serve`` (on uvloop, as deployed): every
caller's packets arrive in order, and the only gaps are ones the kernel reports it made.

Twenty listening calls on the demo avatar for :data:`WINDOW_S` seconds, all placed from
this process (another process than the server's), each an aiortc peer connection that
decrypts, parses and counts what arrives (RTCP reports and NACKs as usual) but decodes
nothing: twenty 720p decoders would leave the 2-core machine no CPU for the server. What
a call's packets must show, stream by stream (SSRC): sequence numbers that only go up,
by one, and a marker before every new timestamp. On loopback a datagram is lost only when
a socket's receive buffer overflows, which the kernel counts (``RcvbufErrors`` in
``/proc/net/snmp``), so the test allows that many missing packets and no more: any other
gap is one the sender made. The server is at or past its limit here (a listening call
costs about 4 ms of CPU per frame on that machine, ``docs/performance/networks.md``), so it may
skip late frames (``frames_skipped``); a skipped frame is never written, so it leaves no
sequence gap, and every frame it reports sent must have reached its caller.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiortc.rtcrtpreceiver
import pytest
from aiortc import RTCPeerConnection
from aiortc.rtp import RtpPacket

import lipstream_client as lc
from tests.live_calls import until
from tests.server_process import lipstream_serve

CALLS = 20
#: 750 frames a call, 15,000 in all, every packet checked: enough for a sender that
#: reorders or a call that stalls to show (it was 60 s, a minute of CI time).
WINDOW_S = 30.0


class _Counted:
    """What one receiver's packets showed: per SSRC, the sequence numbers in arrival
    order and the frames (timestamps) whose marker closed them."""

    def __init__(self) -> None:
        self.sequences: dict[int, list[int]] = defaultdict(list)
        self.marked: dict[int, set[int]] = defaultdict(set)
        self.opened: dict[int, list[int]] = defaultdict(list)  # new timestamps, in order

    def add(self, packet: RtpPacket) -> None:
        ssrc = packet.ssrc
        if not self.opened[ssrc] or self.opened[ssrc][-1] != packet.timestamp:
            self.opened[ssrc].append(packet.timestamp)
        self.sequences[ssrc].append(packet.sequence_number)
        if packet.marker:
            self.marked[ssrc].add(packet.timestamp)


class _NoDecoder:
    def decode(self, encoded_frame: object) -> list[object]:
        return []


def _rcvbuf_errors() -> int:
    """The kernel's count of UDP datagrams dropped for a full receive buffer."""
    lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()]
    names, values = next(pair for pair in itertools.pairwise(lines) if pair[0][0] == "Udp:")
    return int(values[names.index("RcvbufErrors")])


def _gaps(sequences: list[int]) -> tuple[int, int]:
    """(packets missing between consecutive arrivals, arrivals that went backwards)."""
    missing = backwards = 0
    for a, b in itertools.pairwise(sequences):
        step = (b - a) & 0xFFFF
        if step == 0 or step > 0x8000:
            backwards += 1
        else:
            missing += step - 1
    return missing, backwards


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[int, _Counted]:
    """Each receiver's :class:`_Counted`, by ``id`` of its RTCRtpReceiver; no decoding."""
    by_receiver: dict[int, _Counted] = defaultdict(_Counted)
    handle = aiortc.rtcrtpreceiver.RTCRtpReceiver._handle_rtp_packet

    async def counting(self: Any, packet: RtpPacket, arrival_time_ms: int) -> None:
        by_receiver[id(self)].add(packet)
        await handle(self, packet, arrival_time_ms)

    monkeypatch.setattr(aiortc.rtcrtpreceiver.RTCRtpReceiver, "_handle_rtp_packet", counting)
    monkeypatch.setattr(aiortc.rtcrtpreceiver, "get_decoder", lambda codec: _NoDecoder())
    return by_receiver


async def test_twenty_calls_get_every_packet_in_order(
    tmp_path: Path, counted: dict[int, _Counted]
) -> None:
    server_settings = {
        "ice_loopback_only": "true",
        "max_sessions": CALLS,
        "max_connections_per_client": 4 * CALLS,
        # Admission would keep room for each call to speak all the time (the worst case,
        # docs/design/delay.md §9); these calls only listen, and the subject is the send
        # path with more calls than the machine holds in real time.
        "inference_ms_per_frame_estimate": 0.1,
        "cpu_ms_per_session_frame": 1.0,
    }
    async with lipstream_serve(tmp_path, server=server_settings) as server:
        client = lc.Client("", session=server.http)
        calls: list[lc.Call] = []
        try:
            for _ in range(CALLS):
                pc = RTCPeerConnection()
                calls.append(await lc.open_call(client, "demo", pc=pc, data_channel=False))
            for call in calls:
                await call.wait_connected(timeout_s=60)
            receivers = [
                {t.kind: id(t.receiver) for t in call.pc.getTransceivers()} for call in calls
            ]
            await until(
                lambda: all(counted[r].sequences for kinds in receivers for r in kinds.values()),
                "every call's audio and video flowing",
            )
            dropped_before = _rcvbuf_errors()
            # The window is the test's subject (calls that run this long), not a wait for
            # something to happen.
            await asyncio.sleep(WINDOW_S)
            states = [await call.state() for call in calls]
        finally:
            for call in calls:  # every receiver stops before the counting
                await call.hang_up()
        dropped = _rcvbuf_errors() - dropped_before

    missing = backwards = unclosed = 0
    report = []
    for kinds, state in zip(receivers, states, strict=True):
        for receiver in kinds.values():
            for sequences in counted[receiver].sequences.values():
                gap, back = _gaps(sequences)
                missing += gap
                backwards += back
        video = counted[kinds["video"]]
        ssrc = max(video.sequences, key=lambda s: len(video.sequences[s]))  # not RTX's
        # Every video frame but the one in flight at hang-up was closed by its marker.
        unclosed += len(set(video.opened[ssrc][:-1]) - video.marked[ssrc])
        # A ladder step with a lower frame rate leaves frames out: counted as sent by the
        # track, written as nothing (docs/design/link.md §19).
        written = state["frames_sent"] - state["frames_left_out"]
        report.append((written, state["frames_skipped"], len(video.marked[ssrc])))
    assert backwards == 0, report
    assert missing <= dropped, (missing, dropped, report)
    assert unclosed <= missing, (unclosed, report)
    for written, _skipped, frames_received in report:
        # What the server said it sent reached its caller (less what a full socket
        # buffer lost); the frames sent after the state was read only add to it.
        assert frames_received >= written - dropped, report
        assert written >= WINDOW_S, report  # a call that stalls for good fails here
