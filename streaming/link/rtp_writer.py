"""A stream's RTP packets written straight into bytes, header laid out once.

aiortc makes an ``RtpPacket`` object per packet and serialises it, and the link then
parsed those bytes back to stamp the send time and the transport-wide sequence number
(``docs/design/rtp-send.md`` §20). Here a stream's header is laid out once
(:class:`RtpWriter`): the fixed header with its SSRC and payload type, then the header
extension with the elements the call negotiated, in aiortc's order (mid, abs-send-time)
and transport-cc last, as the link used to add it, so the bytes are the ones the old path
sent. Each packet is that template and its payload in one buffer, with its sequence
number, timestamp and marker packed in place; the values only the moment of sending
knows are left as zeros at offsets that are the same for every packet of the stream
(:attr:`RtpWriter.abs_send_time_at`, :attr:`RtpWriter.transport_cc_at`), where the link
writes them (:meth:`~streaming.link.sender.MediaSender.send_written`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from streaming.link.rtp_bytes import element_spans, pack_extension

_FIXED = struct.Struct("!BBHII")
_SEQUENCE_AND_TIMESTAMP = struct.Struct("!BHI")


@dataclass(frozen=True, slots=True)
class StreamLayout:
    """What every packet of one stream carries the same: who it is, and the extension
    ids its m-section negotiated (None: not negotiated)."""

    ssrc: int
    payload_type: int
    mid: str | None = None
    mid_id: int | None = None
    abs_send_time_id: int | None = None
    transport_cc_id: int | None = None


class RtpWriter:
    """One stream's packets (module doc); it owns the stream's sequence numbers."""

    def __init__(self, layout: StreamLayout, first_sequence: int) -> None:
        self.layout = layout
        self.sequence = first_sequence & 0xFFFF  # the next packet's
        elements: dict[int, bytes] = {}
        if layout.mid is not None and layout.mid_id is not None:
            elements[layout.mid_id] = layout.mid.encode()
        if layout.abs_send_time_id is not None:
            elements[layout.abs_send_time_id] = b"\x00\x00\x00"
        if layout.transport_cc_id is not None:
            elements[layout.transport_cc_id] = b"\x00\x00"
        extension = pack_extension(elements)
        first = 0x80 | (0x10 if extension else 0)
        self._template = _FIXED.pack(first, layout.payload_type, 0, 0, layout.ssrc) + extension
        self._payload_type = layout.payload_type
        template = self._template
        offsets = {i: at for i, at, _ in element_spans(template, _FIXED.size, len(template))}
        self.abs_send_time_at = offsets.get(layout.abs_send_time_id or -1, -1)
        self.transport_cc_at = offsets.get(layout.transport_cc_id or -1, -1)

    @property
    def header_size(self) -> int:
        return len(self._template)

    def write(self, payloads: list[bytes], timestamp: int) -> list[bytearray]:
        """One frame's packets: ``payloads`` in order, the marker on the last."""
        template, pack_into = self._template, _SEQUENCE_AND_TIMESTAMP.pack_into
        payload_type, sequence, last = self._payload_type, self.sequence, len(payloads) - 1
        packets = []
        for i, payload in enumerate(payloads):
            packet = bytearray(template)
            packet += payload
            pack_into(packet, 1, payload_type | (0x80 if i == last else 0), sequence, timestamp)
            sequence = (sequence + 1) & 0xFFFF
            packets.append(packet)
        self.sequence = sequence
        return packets
