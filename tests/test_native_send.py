"""lipstream's own RTP send path (``docs/design/rtp-send.md`` §20): the bytes it writes are
the ones aiortc's path wrote, and a real call's packets, decrypted by the caller's own
SRTP session, are what a peer expects of them."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiortc.rtp import HeaderExtensionsMap, RtcpPacket, RtcpSrPacket, RtpPacket

from config.settings import Settings
from streaming.link.rtp_bytes import (
    ABS_SEND_TIME_URI,
    MID_URI,
    TRANSPORT_CC_URI,
    abs_send_time,
    extension_elements,
    parse_rtp,
    with_extensions,
)
from streaming.link.rtp_writer import RtpWriter, StreamLayout
from streaming.live.manager import SessionManager
from tests.live_calls import demo_app, until
from tests.test_link_wire import extension_map
from tests.webrtc_client import Caller
from web.app import build_app
from web.app_keys import SESSIONS
from web.serve import event_loop_factory

MID, ABS, TWCC = 4, 2, 3
PAYLOADS = [b"\x7c\x85" + bytes(range(200)) * 5, b"\x7c\x05" + b"\x11" * 700, b"\x7c\x45" + b"\x22"]


def _old_path(
    payload_type: int, sequence: int, timestamp: int, extensions: HeaderExtensionsMap, **ids: int
) -> list[bytes]:
    """What aiortc's sender serialised, then the link stamped (the path before §20)."""
    out = []
    for i, payload in enumerate(PAYLOADS):
        packet = RtpPacket(
            payload_type=payload_type, sequence_number=(sequence + i) & 0xFFFF, timestamp=timestamp
        )
        packet.ssrc = 0xDEADBEEF
        packet.payload = payload
        packet.marker = int(i == len(PAYLOADS) - 1)
        packet.extensions.abs_send_time = 0  # aiortc writes its own; the link overwrites it
        packet.extensions.mid = "1"
        data = packet.serialize(extensions)
        values = {}
        if "abs_id" in ids:
            values[ids["abs_id"]] = abs_send_time(7.25)
        if "tcc_id" in ids:
            values[ids["tcc_id"]] = (100 + i).to_bytes(2, "big")
        out.append(with_extensions(data, parse_rtp(data), values))
    return out


def _new_path(writer: RtpWriter, timestamp: int) -> list[bytes]:
    packets = writer.write(PAYLOADS, timestamp)
    for i, packet in enumerate(packets):  # as MediaSender.send_written stamps them
        if writer.abs_send_time_at >= 0:
            packet[writer.abs_send_time_at : writer.abs_send_time_at + 3] = abs_send_time(7.25)
        if writer.transport_cc_at >= 0:
            packet[writer.transport_cc_at : writer.transport_cc_at + 2] = (100 + i).to_bytes(2)
    return [bytes(p) for p in packets]


@pytest.mark.parametrize(
    ("uris", "ids"),
    [
        ((MID_URI, ABS_SEND_TIME_URI), {"abs_id": ABS, "tcc_id": TWCC}),  # video, transport-cc
        ((MID_URI, ABS_SEND_TIME_URI), {"abs_id": ABS}),  # video, REMB only
        ((MID_URI,), {"tcc_id": TWCC}),  # audio
        ((MID_URI,), {}),
    ],
)
def test_written_packets_are_byte_for_byte_the_old_paths(
    uris: tuple[str, ...], ids: dict[str, int]
) -> None:
    id_of = {MID_URI: MID, ABS_SEND_TIME_URI: ABS}
    extensions = extension_map(*((id_of[u], u) for u in uris), (TWCC, TRANSPORT_CC_URI))
    layout = StreamLayout(
        ssrc=0xDEADBEEF,
        payload_type=102,
        mid="1",
        mid_id=MID,
        abs_send_time_id=ids.get("abs_id"),
        transport_cc_id=ids.get("tcc_id"),
    )
    writer = RtpWriter(layout, first_sequence=65_534)  # wraps within the frame
    old = _old_path(102, 65_534, 123_456, extensions, **ids)
    assert _new_path(writer, 123_456) == old
    assert writer.sequence == (65_534 + len(PAYLOADS)) & 0xFFFF
    parsed = [RtpPacket.parse(p, extensions) for p in _new_path(writer, 127_056)]
    assert [p.sequence_number for p in parsed] == [1, 2, 3]  # it goes on from the last
    assert [p.marker for p in parsed] == [0, 0, 1]
    assert {p.timestamp for p in parsed} == {127_056}
    assert [p.payload for p in parsed] == PAYLOADS


def _manager(client: TestClient[Any, Any]) -> SessionManager:
    manager: SessionManager = client.app[SESSIONS]
    return manager


@pytest.fixture
async def client(tmp_path: Path, loopback: None) -> AsyncIterator[TestClient[Any, Any]]:
    async with demo_app(tmp_path) as test_client:
        yield test_client


class Recorded:
    """A caller's packets after its own SRTP session decrypted them, in arrival order:
    RTP as (header, extension elements, payload), and sender reports."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []

    def tap(self, transport: Any) -> None:
        handle_rtp, handle_rtcp = transport._handle_rtp_data, transport._handle_rtcp_data

        async def on_rtp(data: bytes, arrival_time_ms: int) -> None:
            header = parse_rtp(data)
            payload = data[header.payload_start : len(data) - header.padding]
            self.items.append(("rtp", (header, extension_elements(data, header), payload)))
            await handle_rtp(data, arrival_time_ms)

        async def on_rtcp(data: bytes) -> None:
            for packet in RtcpPacket.parse(data):
                if isinstance(packet, RtcpSrPacket):
                    self.items.append(("sr", packet))
            await handle_rtcp(data)

        transport._handle_rtp_data = on_rtp
        transport._handle_rtcp_data = on_rtcp

    def rtp(self) -> list[tuple[Any, dict[int, bytes], bytes]]:
        return [item for kind, item in self.items if kind == "rtp"]


async def test_a_calls_packets_are_what_a_peer_expects(client: TestClient[Any, Any]) -> None:
    """The caller's own SRTP session decrypts every packet; per stream the numbers run
    on with no gap the sender made, each frame ends with a marker, the negotiated
    extensions are there, each sender report counts what was sent before it, and a
    NACKed packet comes back as RTX with the same bytes."""
    caller = Caller(client)
    recorded = Recorded()
    await caller.connect(microphone=None)
    try:
        mids = {t.kind: t.mid for t in caller.pc.getTransceivers()}
        for transport in {t.receiver.transport for t in caller.pc.getTransceivers()}:
            recorded.tap(transport)
        start = len(caller.received.video_times)
        await caller.wait_for_frames(start + 100)
        link = _manager(client).get(caller.session_id).peer.link
        assert link is not None
        received = len(recorded.rtp())
        # Every packet went out our way, none through aiortc's send (no TURN here).
        assert link.sender.direct_packets >= received
        # The caller asks again for a video packet it got: it comes back as RTX, the
        # original sequence number, then the same payload.
        media = {header.ssrc for header, _, _ in recorded.rtp()}
        video = next(t for t in caller.pc.getTransceivers() if t.kind == "video")
        sent = [p for p in recorded.rtp() if p[1].get(1) == video.mid.encode()]
        old, _, payload = sent[-1]  # a recent one: the history is kept for 1.5 s
        await video.receiver._send_rtcp_nack(old.ssrc, [old.sequence])

        def resent() -> list[tuple[Any, dict[int, bytes], bytes]]:
            return [p for p in recorded.rtp() if p[0].ssrc not in media]

        await until(lambda: bool(resent()), "the retransmission")
    finally:
        await caller.hang_up()
    ((rtx, _, rtx_payload),) = resent()
    assert rtx_payload == old.sequence.to_bytes(2) + payload
    assert (rtx.timestamp, rtx.marker) == (old.timestamp, old.marker)

    streams: dict[int, list[tuple[Any, dict[int, bytes], bytes]]] = defaultdict(list)
    last_report: dict[int, tuple[int, int, int]] = {}  # ssrc: (packets, octets, received)
    reports = 0
    for kind, item in recorded.items:
        if kind == "rtp":
            if item[0].ssrc in media:
                streams[item[0].ssrc].append(item)
            continue
        sent, info = streams[item.ssrc], item.sender_info
        if item.ssrc in last_report:  # what was sent between two reports
            count, octets, seen = last_report[item.ssrc]
            assert info.packet_count - count == len(sent) - seen
            assert info.octet_count - octets == sum(len(p) for _, _, p in sent[seen:])
            assert info.rtp_timestamp == sent[-1][0].timestamp  # the last frame sent
            reports += 1
        last_report[item.ssrc] = (info.packet_count, info.octet_count, len(sent))
    assert reports >= 2
    assert len(streams) == 2  # audio and video
    for packets in streams.values():
        headers = [h for h, _, _ in packets]
        assert len(headers) > 50
        assert all((b.sequence - a.sequence) & 0xFFFF == 1 for a, b in itertools.pairwise(headers))
        for a, b in itertools.pairwise(headers):  # a new timestamp only after a marker
            assert (a.timestamp != b.timestamp) == a.marker
        elements = [e for _, e, _ in packets]
        (mid,) = {e.get(1) for e in elements}  # aiortc's mid extension id, on every packet
        kind = "video" if mid == mids["video"].encode() else "audio"
        assert mid == mids[kind].encode()
        if kind == "video":  # abs-send-time (aiortc's id 3), as the link stamps it
            assert all(len(e.get(3, b"")) == 3 for e in elements)


def test_a_call_on_uvloop_sends_its_packets_our_way(tmp_path: Path, loopback: None) -> None:
    """The server's default event loop (server.event_loop): uvloop's UDP transport keeps
    a reference to what it cannot send at once, so it is given copies; every packet
    still goes the direct way and the caller decodes the call."""
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
        }
    )

    async def call() -> tuple[str, int, int, int]:
        server = TestServer(build_app(settings), host="127.0.0.1")
        async with TestClient(server) as client:
            caller = Caller(client)
            await caller.connect(microphone=None)
            try:
                await caller.wait_for_frames(30)
                link = _manager(client).get(caller.session_id).peer.link
                assert link is not None
                sent = link.sender.video_packets
                return (
                    type(asyncio.get_running_loop()).__module__,
                    link.sender.direct_packets,
                    sent,
                    len(caller.received.video_times),
                )
            finally:
                await caller.hang_up()

    factory = event_loop_factory("uvloop")
    assert factory is not None
    with asyncio.Runner(loop_factory=factory) as runner:
        module, direct, video_packets, frames = runner.run(call())
    assert module.startswith("uvloop")
    assert frames >= 30
    assert direct > video_packets >= frames  # the audio's packets went direct too
    assert event_loop_factory("asyncio") is None
