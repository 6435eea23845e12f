"""The RTCP a caller sends about our media, read from the compound packet's bytes.

What the link controller needs of it (``docs/design/link.md`` §19): receiver reports
(RFC 3550 §6.4: fraction lost, and the round trip from LSR/DLSR), NACKs (RFC 4585
§6.2.1), PLI and FIR (RFC 4585 §6.3.1, RFC 5104 §4.3.1), REMB
(draft-alvestrand-rmcat-remb) and transport-wide congestion control feedback
(draft-holmer-rmcat-transport-wide-cc-extensions-01 §3.1). :func:`split_compound`
cuts a compound packet into its parts, so the parts the link handles itself (NACK,
REMB, transport-cc) can be kept from aiortc and the rest handed on unchanged.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

SR, RR, RTPFB, PSFB = 200, 201, 205, 206
NACK_FMT, TRANSPORT_CC_FMT = 1, 15
PLI_FMT, FIR_FMT, APP_FMT = 1, 4, 15
#: A transport-cc reference time unit and receive delta unit, in seconds.
REFERENCE_TIME_S = 0.064
DELTA_S = 0.000250


@dataclass(frozen=True, slots=True)
class RtcpPart:
    """One packet of a compound RTCP packet: its type, its count/format field, bytes."""

    packet_type: int
    fmt: int
    data: bytes


def split_compound(data: bytes) -> Iterator[RtcpPart]:
    """The packets of compound RTCP ``data``, in order; a truncated tail is left out."""
    at = 0
    while at + 4 <= len(data):
        first, packet_type, words = struct.unpack_from("!BBH", data, at)
        end = at + 4 * (words + 1)
        if first >> 6 != 2 or end > len(data):
            return
        yield RtcpPart(packet_type, first & 0x1F, data[at:end])
        at = end


@dataclass(frozen=True, slots=True)
class ReportBlock:
    """One receiver report block about one of our streams."""

    ssrc: int
    fraction_lost: float  # of the packets expected since the previous report
    highest_sequence: int
    jitter: int
    lsr: int
    dlsr_s: float


def report_blocks(part: RtcpPart) -> list[ReportBlock]:
    """The report blocks of an SR or RR."""
    start = 8 + (20 if part.packet_type == SR else 0)
    blocks = []
    for at in range(start, start + 24 * part.fmt, 24):
        if at + 24 > len(part.data):
            break
        ssrc, lost_word, highest, jitter, lsr, dlsr = struct.unpack_from("!IIIIII", part.data, at)
        blocks.append(
            ReportBlock(ssrc, (lost_word >> 24) / 256, highest, jitter, lsr, dlsr / 65536)
        )
    return blocks


def sender_report_lsr(part: RtcpPart) -> tuple[int, int] | None:
    """(SSRC, the middle 32 bits of the NTP time) of an SR we send: what a receiver
    report's LSR will echo."""
    if part.packet_type != SR or len(part.data) < 16:
        return None
    ssrc, ntp_seconds, ntp_fraction = struct.unpack_from("!III", part.data, 4)
    return ssrc, ((ntp_seconds & 0xFFFF) << 16) | (ntp_fraction >> 16)


def media_ssrc(part: RtcpPart) -> int:
    """The media source a feedback message (RTPFB, PSFB) is about."""
    return int(struct.unpack_from("!I", part.data, 8)[0]) if len(part.data) >= 12 else 0


def nacked_sequences(part: RtcpPart) -> list[int]:
    """The sequence numbers a generic NACK asks for, in order."""
    lost = []
    for at in range(12, len(part.data) - 3, 4):
        pid, blp = struct.unpack_from("!HH", part.data, at)
        lost.append(pid)
        lost += [(pid + bit + 1) & 0xFFFF for bit in range(16) if blp >> bit & 1]
    return lost


def remb(part: RtcpPart) -> tuple[int, list[int]] | None:
    """(bits per second, the SSRCs it is for) of a REMB message, else None."""
    data = part.data
    if part.packet_type != PSFB or part.fmt != APP_FMT or data[12:16] != b"REMB":
        return None
    if len(data) < 20:
        return None
    count, exponent_mantissa = data[16], int.from_bytes(data[17:20], "big")
    bitrate = (exponent_mantissa & 0x3FFFF) << (exponent_mantissa >> 18)
    ssrcs = [struct.unpack_from("!I", data, 20 + 4 * i)[0] for i in range(count)
             if 24 + 4 * i <= len(data)]  # fmt: skip
    return bitrate, ssrcs


@dataclass(frozen=True, slots=True)
class TransportFeedback:
    """A transport-cc feedback message: for each transport-wide sequence number from
    ``base_sequence`` on, when it arrived (seconds on the receiver's clock) or None."""

    base_sequence: int
    feedback_count: int
    arrivals: tuple[float | None, ...]


def transport_feedback(part: RtcpPart) -> TransportFeedback:
    """The transport-cc feedback in ``part`` (RTPFB, format 15); ``ValueError`` if it is
    malformed."""
    data = part.data
    if len(data) < 20:
        raise ValueError("transport-cc feedback is too short")
    base, count = struct.unpack_from("!HH", data, 12)
    reference = int.from_bytes(data[16:19], "big", signed=True)
    feedback_count = data[19]
    symbols: list[int] = []
    at = 20
    while len(symbols) < count:
        if at + 2 > len(data):
            raise ValueError("transport-cc feedback ends inside its status chunks")
        chunk = struct.unpack_from("!H", data, at)[0]
        at += 2
        if not chunk & 0x8000:  # run length
            symbols += [(chunk >> 13) & 0x3] * (chunk & 0x1FFF)
        elif not chunk & 0x4000:  # status vector, one bit per packet
            symbols += [(chunk >> (13 - i)) & 0x1 for i in range(14)]
        else:  # status vector, two bits per packet
            symbols += [(chunk >> (12 - 2 * i)) & 0x3 for i in range(7)]
    del symbols[count:]
    time_s = reference * REFERENCE_TIME_S
    arrivals: list[float | None] = []
    for symbol in symbols:
        if symbol == 1:
            if at + 1 > len(data):
                raise ValueError("transport-cc feedback ends inside its deltas")
            time_s += data[at] * DELTA_S
            at += 1
        elif symbol == 2:
            if at + 2 > len(data):
                raise ValueError("transport-cc feedback ends inside its deltas")
            time_s += struct.unpack_from("!h", data, at)[0] * DELTA_S
            at += 2
        else:
            arrivals.append(None)
            continue
        arrivals.append(time_s)
    return TransportFeedback(base, feedback_count, tuple(arrivals))


def without(data: bytes, parts_kept: list[RtcpPart]) -> bytes:
    """The compound packet made of ``parts_kept`` (the parts of ``data`` to hand on)."""
    return b"".join(part.data for part in parts_kept)
