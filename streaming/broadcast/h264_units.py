"""One frame's H.264 RTP payloads back into the access unit they were cut from.

A session's encoder hands its frames out as RTP payloads (RFC 6184: single NAL units,
STAP-A aggregates of small ones, FU-A fragments of large ones, as aiortc's packetiser
makes them) and that is what the session's feed keeps. An output that is not RTP (RTMP's
FLV) needs the NAL units themselves: :func:`access_unit` joins them in Annex B form
(each after a start code), which FFmpeg's FLV muxer turns into its own.
"""

from __future__ import annotations

from collections.abc import Sequence

START_CODE = b"\x00\x00\x00\x01"
_STAP_A = 24
_FU_A = 28


def nal_units(payloads: Sequence[bytes]) -> list[bytes]:
    """The NAL units a frame's RTP payloads carry, in order. A fragment series cut
    short (a payload lost on the way in) is left out, not passed on broken."""
    units: list[bytes] = []
    fragment: bytearray | None = None
    for payload in payloads:
        if not payload:
            continue
        kind = payload[0] & 0x1F
        if kind == _STAP_A:
            at = 1
            while at + 2 <= len(payload):
                size = int.from_bytes(payload[at : at + 2], "big")
                unit = payload[at + 2 : at + 2 + size]
                if len(unit) == size and size:
                    units.append(bytes(unit))
                at += 2 + size
        elif kind == _FU_A:
            if len(payload) < 2:
                continue
            header = payload[1]
            if header & 0x80:  # start: the NAL header is rebuilt from both bytes
                fragment = bytearray([(payload[0] & 0xE0) | (header & 0x1F)])
            if fragment is None:
                continue
            fragment += payload[2:]
            if header & 0x40:  # end
                units.append(bytes(fragment))
                fragment = None
        elif 0 < kind < _STAP_A:
            units.append(bytes(payload))
    return units


def access_unit(payloads: Sequence[bytes]) -> bytes:
    """The frame's NAL units in Annex B form (empty if it carries none)."""
    return b"".join(START_CODE + unit for unit in nal_units(payloads))
