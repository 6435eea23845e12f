"""RTP packets as bytes: read a header, rewrite its extensions, wrap for retransmission.

The link controller sees every packet a call sends as the plaintext bytes aiortc
serialised (RFC 3550 §5.1), just before they are encrypted. It reads the header without
building an object, and writes what only the moment of sending knows into the header
extension (RFC 8285): the absolute send time, and the transport-wide sequence number
that transport-cc feedback refers to (``docs/design/link.md`` §19). A retransmission is
the original packet wrapped in RTX (RFC 4588 §4: the original sequence number, then the
payload) on the retransmission stream; a padding packet carries nothing but padding.

One-byte extension elements are written whenever every element fits them (ids 1–14,
values of 1–16 bytes), as aiortc does; two-byte elements otherwise.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

#: RFC 8285 extension profiles.
ONE_BYTE_PROFILE = 0xBEDE
TWO_BYTE_PROFILE = 0x1000
_FIXED_HEADER = 12

#: The header extensions the link writes (their ids come from the caller's offer).
MID_URI = "urn:ietf:params:rtp-hdrext:sdes:mid"
ABS_SEND_TIME_URI = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"
TRANSPORT_CC_URI = "http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01"


@dataclass(frozen=True, slots=True)
class RtpHeader:
    """What the link reads of one RTP packet (offsets into its bytes)."""

    payload_type: int
    marker: bool
    sequence: int
    timestamp: int
    ssrc: int
    csrc_end: int  # where the fixed header and CSRCs end (the extension, if any, starts)
    payload_start: int
    padding: int  # trailing padding bytes (0 without the P bit)


def is_rtcp(data: bytes) -> bool:
    """Whether ``data`` is RTCP rather than RTP (RFC 5761 §4: packet types 192–223)."""
    return len(data) > 1 and 192 <= data[1] <= 223


def parse_rtp(data: bytes) -> RtpHeader:
    """The header of the RTP packet ``data``; ``ValueError`` if it is not one."""
    if len(data) < _FIXED_HEADER or data[0] >> 6 != 2:
        raise ValueError(f"not an RTP packet ({len(data)} bytes)")
    first, second, sequence, timestamp, ssrc = struct.unpack_from("!BBHII", data)
    csrc_end = _FIXED_HEADER + 4 * (first & 0x0F)
    start = csrc_end
    if first & 0x10:
        if len(data) < csrc_end + 4:
            raise ValueError("RTP header extension is truncated")
        words = struct.unpack_from("!H", data, csrc_end + 2)[0]
        start = csrc_end + 4 + 4 * words
    padding = data[-1] if first & 0x20 else 0
    if start + padding > len(data):
        raise ValueError("RTP header or padding is longer than the packet")
    return RtpHeader(
        second & 0x7F, bool(second & 0x80), sequence, timestamp, ssrc, csrc_end, start, padding
    )


def extension_elements(data: bytes, header: RtpHeader) -> dict[int, bytes]:
    """The header extension's elements by id (empty without an extension)."""
    return {
        ident: bytes(data[start : start + length])
        for ident, start, length in element_spans(data, header.csrc_end, header.payload_start)
    }


def element_spans(data: bytes | bytearray, at: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(id, where its value starts, its length) of each element of the header extension
    in ``data[at:end]`` (its profile word first), one-byte or two-byte."""
    if at >= end:
        return
    profile = struct.unpack_from("!H", data, at)[0]
    at += 4
    if profile == ONE_BYTE_PROFILE:
        while at < end:
            byte = data[at]
            if byte == 0:  # padding between elements
                at += 1
                continue
            ident, length = byte >> 4, (byte & 0x0F) + 1
            if ident == 15:  # reserved: stop reading (RFC 8285 §4.2)
                return
            yield ident, at + 1, length
            at += 1 + length
    elif profile & 0xFFF0 == TWO_BYTE_PROFILE:
        while at + 1 < end:
            ident = data[at]
            if ident == 0:
                at += 1
                continue
            length = data[at + 1]
            yield ident, at + 2, length
            at += 2 + length


def pack_extension(elements: dict[int, bytes]) -> bytes:
    if not elements:
        return b""
    one_byte = all(1 <= i <= 14 and 1 <= len(v) <= 16 for i, v in elements.items())
    if one_byte:
        body = b"".join(bytes([(i << 4) | (len(v) - 1)]) + v for i, v in elements.items())
        profile = ONE_BYTE_PROFILE
    else:
        body = b"".join(bytes([i, len(v)]) + v for i, v in elements.items())
        profile = TWO_BYTE_PROFILE
    body += b"\x00" * (-len(body) % 4)
    return struct.pack("!HH", profile, len(body) // 4) + body


def with_extensions(data: bytes, header: RtpHeader, values: dict[int, bytes]) -> bytes:
    """``data`` with its extension elements ``values`` set (added or replaced)."""
    if not values:
        return data
    elements = extension_elements(data, header)
    if all(elements.get(ident) is not None and len(elements[ident]) == len(value)
           for ident, value in values.items()):  # fmt: skip
        # Same sizes: overwrite in place, no new packet layout.
        out = bytearray(data)
        _overwrite(out, header, values)
        return bytes(out)
    elements.update(values)
    extension = pack_extension(elements)
    first = data[0] | 0x10
    return bytes([first]) + data[1 : header.csrc_end] + extension + data[header.payload_start :]


def _overwrite(out: bytearray, header: RtpHeader, values: dict[int, bytes]) -> None:
    for ident, start, length in element_spans(out, header.csrc_end, header.payload_start):
        if ident in values:
            out[start : start + length] = values[ident]


def abs_send_time(now_s: float) -> bytes:
    """The 3-byte abs-send-time of ``now_s`` (seconds, any epoch): 6.18 fixed point."""
    return (int(now_s * (1 << 18)) & 0xFFFFFF).to_bytes(3, "big")


def rtx_packet(
    data: bytes, header: RtpHeader, *, payload_type: int, sequence: int, ssrc: int
) -> bytes:
    """``data`` as an RTX retransmission (RFC 4588): same timestamp, marker and
    extensions, the original sequence number in front of the payload."""
    second = (data[1] & 0x80) | payload_type
    fixed = struct.pack("!BBHII", data[0] & ~0x20 & 0xFF, second, sequence, header.timestamp, ssrc)
    payload = data[header.payload_start : len(data) - header.padding]
    return (
        fixed
        + data[_FIXED_HEADER : header.payload_start]
        + struct.pack("!H", header.sequence)
        + payload
    )


def padding_packet(
    *, payload_type: int, sequence: int, timestamp: int, ssrc: int, size: int
) -> bytes:
    """An RTP packet of ``size`` bytes (at most 255 of padding after the 12-byte header)
    that carries only padding: what a probe is made of when there is nothing to resend."""
    padding = max(1, min(255, size - _FIXED_HEADER))
    fixed = struct.pack("!BBHII", 0xA0, payload_type & 0x7F, sequence, timestamp, ssrc)
    return fixed + b"\x00" * (padding - 1) + bytes([padding])
