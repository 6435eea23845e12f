"""The link controller between aiortc and the wire: what it takes, sends and rewrites."""

from __future__ import annotations

import asyncio
import struct

from aiortc.rtp import (
    RTCP_PSFB_APP,
    RTCP_PSFB_PLI,
    RTCP_RTPFB_NACK,
    RtcpPsfbPacket,
    RtcpReceiverInfo,
    RtcpRrPacket,
    RtcpRtpfbPacket,
    RtcpSenderInfo,
    RtcpSrPacket,
    RtpPacket,
    pack_remb_fci,
    unwrap_rtx,
)

from streaming.link import LinkController, MediaSender, Mode, Pacer, Streams
from streaming.link.controller import AUDIO_BPS, KEYFRAME_MIN_INTERVAL_S, steady_idle
from streaming.link.rtcp_bytes import PSFB, split_compound
from streaming.link.rtp_bytes import parse_rtp
from streaming.link.sender import NTP_EPOCH_OFFSET
from tests.link_sim import Clock, FakeEncoder
from tests.test_link_wire import EXTENSIONS, TWCC, aiortc_packet

VIDEO, RTX, RTX_PT = 1234, 4321, 103


class InstantClock(Clock):
    """Virtual time whose sleeps end at once, moving it on (one caller at a time)."""

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


class Wire:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, data: bytes) -> None:
        self.sent.append(data)


def link(
    *, transport_cc: bool = True, audio: bool = False
) -> tuple[LinkController, Wire, FakeEncoder, Clock, list[float]]:
    clock, wire, encoder, audio_loss = InstantClock(), Wire(), FakeEncoder(), []
    sender = MediaSender(
        Streams(
            VIDEO, RTX, RTX_PT, abs_send_time_id=2, transport_cc_id=TWCC if transport_cc else None
        ),
        wire.send,
        Pacer(2_500_000),
        clock=clock,
        wall_clock=lambda: 1000.0 + clock.now,
        sleep=clock.sleep,
    )
    controller = LinkController(
        sender,
        encoder,
        top_bps=2_500_000,
        fps=25,
        audio=audio,
        on_audio_loss=audio_loss.append,
        clock=clock,
        sleep=clock.sleep,
    )
    return controller, wire, encoder, clock, audio_loss


async def test_every_packet_gets_a_transport_sequence_and_rtcp_passes_untouched() -> None:
    controller, wire, *_ = link()
    for _ in range(3):
        await controller.sender.send(aiortc_packet())
    rr = bytes(RtcpRrPacket(ssrc=5, reports=[]))
    await controller.sender.send(rr)
    numbers = [
        RtpPacket.parse(p, EXTENSIONS).extensions.transport_sequence_number for p in wire.sent[:3]
    ]
    assert numbers == [0, 1, 2]
    assert wire.sent[3] == rr


async def test_without_transport_cc_the_packets_keep_their_header() -> None:
    controller, wire, *_ = link(transport_cc=False)
    packet = aiortc_packet()
    await controller.sender.send(packet)
    assert RtpPacket.parse(wire.sent[0], EXTENSIONS).extensions.transport_sequence_number is None
    assert len(wire.sent[0]) == len(packet)


async def test_a_nack_is_answered_with_rtx_and_kept_from_aiortc() -> None:
    controller, wire, _, _clock, _ = link()
    packets = []
    for sequence in range(10):
        data = bytearray(aiortc_packet(bytes([sequence]) * 300))
        struct.pack_into("!H", data, 2, sequence)
        packets.append(bytes(data))
        await controller.sender.send(bytes(data))
    nack = bytes(RtcpRtpfbPacket(fmt=RTCP_RTPFB_NACK, ssrc=9, media_ssrc=VIDEO, lost=[3, 7]))
    pli = bytes(RtcpPsfbPacket(fmt=RTCP_PSFB_PLI, ssrc=9, media_ssrc=VIDEO))
    kept = controller.rtcp(nack + pli)
    assert [p.packet_type for p in split_compound(kept)] == [PSFB]  # the PLI is aiortc's
    for _ in range(5):  # the retransmission task's turn (it never waits: an instant clock)
        await asyncio.sleep(0)
    resent = [RtpPacket.parse(p, EXTENSIONS) for p in wire.sent[10:]]
    assert [p.ssrc for p in resent] == [RTX, RTX]
    originals = [unwrap_rtx(p, payload_type=102, ssrc=VIDEO) for p in resent]
    assert [o.sequence_number for o in originals] == [3, 7]
    assert [o.payload for o in originals] == [bytes([3]) * 300, bytes([7]) * 300]
    assert (controller.nacks, controller.retransmitted) == (2, 2)


async def test_remb_is_the_links_without_transport_cc() -> None:
    controller, _, encoder, *_ = link(transport_cc=False)

    def remb(bps: int) -> bytes:
        fci = pack_remb_fci(bps, [VIDEO])
        return bytes(RtcpPsfbPacket(fmt=RTCP_PSFB_APP, ssrc=9, media_ssrc=0, fci=fci))

    assert encoder.steady_idle is False  # not before transport-cc drives the estimate
    assert encoder.estimate_measured is False  # the ceiling, guessed: nothing reported yet
    assert controller.rtcp(remb(1_500_000)) == b""
    assert encoder.estimate_measured is True
    assert controller.estimator.estimate_bps == 2_631_579  # a lagging first REMB: kept
    assert encoder.steady_idle is False  # a REMB-only caller keeps to the joining loops
    assert controller.rtcp(remb(800_000)) == b""  # a drop: the caller's overuse
    assert controller.estimator.estimate_bps == 800_000
    assert encoder.target_bitrate == round(800_000 * 0.95)  # less the headers
    assert controller.snapshot().remb_bps == 800_000


async def test_the_video_budget_leaves_the_audio_its_share() -> None:
    controller, _, encoder, *_ = link(audio=True)
    assert controller.budget_bps() == round((300_000 - AUDIO_BPS) * 0.95)
    assert encoder.target_bitrate == controller.budget_bps()


async def test_a_video_sr_says_when_its_frame_was_handed_over_and_gives_the_round_trip() -> None:
    controller, wire, encoder, clock, audio_loss = link()
    data = bytearray(aiortc_packet())
    struct.pack_into("!I", data, 4, 777_000)  # RTP timestamp
    await controller.sender.send(bytes(data))  # handed over at wall time 1000.0
    clock.now = 0.3  # aiortc's SR comes later, stamped with when it sent it
    sr = RtcpSrPacket(
        ssrc=VIDEO,
        sender_info=RtcpSenderInfo(
            ntp_timestamp=int((1000.3 + NTP_EPOCH_OFFSET) * 2**32),
            rtp_timestamp=777_000,
            packet_count=1,
            octet_count=900,
        ),
    )
    await controller.sender.send(bytes(sr))
    (part,) = split_compound(wire.sent[-1])
    ntp = struct.unpack_from("!Q", part.data, 8)[0]
    assert abs(ntp / 2**32 - NTP_EPOCH_OFFSET - 1000.0) < 1e-6
    lsr = (ntp >> 16) & 0xFFFFFFFF
    clock.now = 0.5  # the caller held the SR 100 ms before its report
    report = RtcpReceiverInfo(
        ssrc=VIDEO,
        fraction_lost=0,
        packets_lost=0,
        highest_sequence=1,
        jitter=0,
        lsr=lsr,
        dlsr=65536 // 10,
    )
    audio = RtcpReceiverInfo(
        ssrc=55, fraction_lost=26, packets_lost=3, highest_sequence=9, jitter=0, lsr=0, dlsr=0
    )
    controller.rtcp(bytes(RtcpRrPacket(ssrc=9, reports=[report, audio])))
    assert abs(controller.estimator.rtt_s - 0.1) < 0.002  # 0.5 - 0.3 - 0.1
    assert encoder.keyframe_interval_s == max(KEYFRAME_MIN_INTERVAL_S, 1.5 * 0.1)
    assert audio_loss == [26 / 256]  # the audio's loss, for its FEC
    assert parse_rtp(wire.sent[0]).ssrc == VIDEO


def test_a_call_moves_to_the_steady_loops_at_the_full_rate_and_stays_through_a_waver() -> None:
    full = 2_631_579
    assert steady_idle(Mode.TRANSPORT_CC, full, full, was=False)
    assert not steady_idle(Mode.TRANSPORT_CC, full - 1, full, was=False)  # below: joining
    assert steady_idle(Mode.TRANSPORT_CC, round(0.95 * full), full, was=True)  # a waver
    assert not steady_idle(Mode.TRANSPORT_CC, round(0.8 * full), full, was=True)  # a drop
    assert not steady_idle(Mode.REMB, full, full, was=True)  # never on a REMB
