"""streaming.link's wire formats against aiortc's own serialisers and parsers."""

from __future__ import annotations

import pytest
from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtp import (
    RTCP_PSFB_APP,
    RTCP_RTPFB_NACK,
    HeaderExtensionsMap,
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

from streaming.link.rtcp_bytes import (
    RR,
    SR,
    nacked_sequences,
    remb,
    report_blocks,
    sender_report_lsr,
    split_compound,
    transport_feedback,
)
from streaming.link.rtp_bytes import (
    ABS_SEND_TIME_URI,
    TRANSPORT_CC_URI,
    abs_send_time,
    extension_elements,
    is_rtcp,
    padding_packet,
    parse_rtp,
    rtx_packet,
    with_extensions,
)
from tests.link_wire import transport_feedback as feedback_bytes

MID, ABS, TWCC = 4, 2, 3


def extension_map(*ids: tuple[int, str]) -> HeaderExtensionsMap:
    extensions = HeaderExtensionsMap()
    extensions.configure(
        RTCRtpParameters(
            headerExtensions=[RTCRtpHeaderExtensionParameters(id=i, uri=u) for i, u in ids]
        )
    )
    return extensions


EXTENSIONS = extension_map(
    (MID, "urn:ietf:params:rtp-hdrext:sdes:mid"), (ABS, ABS_SEND_TIME_URI), (TWCC, TRANSPORT_CC_URI)
)


def aiortc_packet(payload: bytes = b"\x65" * 900, *, marker: int = 1) -> bytes:
    """A video packet as aiortc's sender serialises it (mid and abs-send-time)."""
    packet = RtpPacket(payload_type=102, sequence_number=4321, timestamp=90_000, ssrc=1234)
    packet.marker = marker
    packet.payload = payload
    packet.extensions.mid = "1"
    packet.extensions.abs_send_time = 0x123456
    return packet.serialize(EXTENSIONS)


def test_a_packet_is_read_as_aiortc_wrote_it() -> None:
    data = aiortc_packet()
    header = parse_rtp(data)
    assert (header.payload_type, header.sequence, header.timestamp, header.ssrc) == (
        102,
        4321,
        90_000,
        1234,
    )
    assert header.marker
    assert data[header.payload_start :] == b"\x65" * 900
    assert extension_elements(data, header) == {MID: b"1", ABS: b"\x12\x34\x56"}
    assert not is_rtcp(data)
    with pytest.raises(ValueError, match="not an RTP packet"):
        parse_rtp(b"\x00" * 8)


def test_the_send_time_and_transport_sequence_are_written_where_aiortc_reads_them() -> None:
    data = aiortc_packet()
    stamped = with_extensions(
        data, parse_rtp(data), {ABS: abs_send_time(10.5), TWCC: (65_000).to_bytes(2, "big")}
    )
    packet = RtpPacket.parse(stamped, EXTENSIONS)
    assert packet.extensions.abs_send_time == int(10.5 * (1 << 18)) & 0xFFFFFF
    assert packet.extensions.transport_sequence_number == 65_000
    assert packet.extensions.mid == "1"
    assert (packet.sequence_number, packet.marker, packet.payload) == (4321, 1, b"\x65" * 900)
    # the same sizes again: overwritten in place, nothing else moves
    again = with_extensions(stamped, parse_rtp(stamped), {TWCC: b"\x00\x07"})
    assert len(again) == len(stamped)
    assert RtpPacket.parse(again, EXTENSIONS).extensions.transport_sequence_number == 7


def test_a_packet_without_extensions_gets_them() -> None:
    plain = RtpPacket(payload_type=111, sequence_number=1, timestamp=960, ssrc=5)
    plain.payload = b"opus"
    data = plain.serialize(HeaderExtensionsMap())
    stamped = with_extensions(data, parse_rtp(data), {TWCC: b"\x01\x02"})
    packet = RtpPacket.parse(stamped, EXTENSIONS)
    assert packet.extensions.transport_sequence_number == 0x0102
    assert packet.payload == b"opus"


def test_a_retransmission_unwraps_to_the_original_packet() -> None:
    data = aiortc_packet(b"\x41\x9a" + bytes(range(200)), marker=0)
    rtx = rtx_packet(data, parse_rtp(data), payload_type=103, sequence=77, ssrc=999)
    wrapped = RtpPacket.parse(rtx, EXTENSIONS)
    assert (wrapped.payload_type, wrapped.sequence_number, wrapped.ssrc) == (103, 77, 999)
    original = unwrap_rtx(wrapped, payload_type=102, ssrc=1234)
    assert (original.sequence_number, original.timestamp) == (4321, 90_000)
    assert original.payload == b"\x41\x9a" + bytes(range(200))


def test_a_padding_packet_carries_only_padding() -> None:
    data = padding_packet(payload_type=103, sequence=9, timestamp=1, ssrc=999, size=267)
    packet = RtpPacket.parse(data, EXTENSIONS)
    assert (len(data), packet.payload, packet.padding_size) == (267, b"", 255)


def test_receiver_and_sender_reports_are_read() -> None:
    block = RtcpReceiverInfo(
        ssrc=1234,
        fraction_lost=64,
        packets_lost=10,
        highest_sequence=4400,
        jitter=30,
        lsr=0xABCD1234,
        dlsr=65536 // 2,
    )
    sr = RtcpSrPacket(
        ssrc=1,
        sender_info=RtcpSenderInfo(
            ntp_timestamp=(5 << 32) | (1 << 31), rtp_timestamp=7, packet_count=1, octet_count=2
        ),
        reports=[block],
    )
    rr = RtcpRrPacket(ssrc=2, reports=[block])
    parts = list(split_compound(bytes(sr) + bytes(rr)))
    assert [p.packet_type for p in parts] == [SR, RR]
    for part in parts:
        (read,) = report_blocks(part)
        assert (read.ssrc, read.fraction_lost, read.lsr, read.dlsr_s) == (
            1234,
            0.25,
            0xABCD1234,
            0.5,
        )
    assert sender_report_lsr(parts[0]) == (1, (5 << 16) | 0x8000)
    assert sender_report_lsr(parts[1]) is None


def test_nacks_and_remb_are_read_as_aiortc_writes_them() -> None:
    nack = RtcpRtpfbPacket(fmt=RTCP_RTPFB_NACK, ssrc=1, media_ssrc=1234, lost=[10, 12, 30, 65535])
    (part,) = split_compound(bytes(nack))
    assert nacked_sequences(part) == [10, 12, 30, 65535]
    message = RtcpPsfbPacket(
        fmt=RTCP_PSFB_APP, ssrc=1, media_ssrc=0, fci=pack_remb_fci(1_234_000, [1234, 99])
    )
    (part,) = split_compound(bytes(message))
    bitrate, ssrcs = remb(part) or (0, [])
    assert ssrcs == [1234, 99]
    assert abs(bitrate - 1_234_000) < 1_234_000 * 0.001  # 18-bit mantissa


@pytest.mark.parametrize("vectors", [False, True])
def test_transport_feedback_gives_each_packets_arrival(vectors: bool) -> None:
    arrivals = [1.0, 1.0005, None, None, 1.03, 1.02, None] + [1.1 + 0.001 * i for i in range(20)]
    data = feedback_bytes(65_530, arrivals, count=3, vectors=vectors)
    (part,) = split_compound(data)
    parsed = transport_feedback(part)
    assert (parsed.base_sequence, parsed.feedback_count) == (65_530, 3)
    assert len(parsed.arrivals) == len(arrivals)
    for got, sent in zip(parsed.arrivals, arrivals, strict=True):
        assert (got is None) == (sent is None)
        if got is not None and sent is not None:
            assert abs(got - sent) < 0.00026  # 250 µs deltas; 1.02 after 1.03: negative


def test_a_truncated_feedback_is_refused() -> None:
    data = feedback_bytes(0, [1.0] * 20)
    (part,) = split_compound(data)
    with pytest.raises(ValueError, match="transport-cc"):
        transport_feedback(type(part)(part.packet_type, part.fmt, part.data[:24]))
