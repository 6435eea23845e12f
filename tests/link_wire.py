"""What a caller sends back about our media, as bytes: transport-cc feedback and RTCP.

:func:`transport_feedback` writes a transport-cc feedback message
(draft-holmer-rmcat-transport-wide-cc-extensions-01 §3.1) the way a browser does, for
the tests of the link controller to feed it (``tests/test_link_wire.py`` checks it
against the parser, ``tests/link_sim.py`` drives a whole call with it).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from streaming.link.rtcp_bytes import DELTA_S, REFERENCE_TIME_S, RTPFB, TRANSPORT_CC_FMT


def transport_feedback(
    base: int,
    arrivals: Sequence[float | None],
    *,
    count: int = 0,
    sender_ssrc: int = 1,
    media_ssrc: int = 2,
    vectors: bool = False,
) -> bytes:
    """A feedback message for sequence numbers ``base``… with these arrival times
    (seconds, None: not received). Runs of one status are run-length chunks, unless
    ``vectors``: then two-bit status vector chunks throughout."""
    received = [a for a in arrivals if a is not None]
    reference = int(min(received) // REFERENCE_TIME_S) if received else 0
    time = reference * REFERENCE_TIME_S
    symbols: list[int] = []
    deltas = b""
    for arrival in arrivals:
        if arrival is None:
            symbols.append(0)
            continue
        ticks = round((arrival - time) / DELTA_S)
        time += ticks * DELTA_S
        if 0 <= ticks <= 255:
            symbols.append(1)
            deltas += bytes([ticks])
        else:
            symbols.append(2)
            deltas += struct.pack("!h", ticks)
    chunks = _vectors(symbols) if vectors else _runs(symbols)
    body = struct.pack("!IIHH", sender_ssrc, media_ssrc, base & 0xFFFF, len(arrivals))
    body += (reference & 0xFFFFFF).to_bytes(3, "big") + bytes([count & 0xFF])
    body += b"".join(struct.pack("!H", c) for c in chunks) + deltas
    body += b"\x00" * (-len(body) % 4)
    return struct.pack("!BBH", 0x80 | TRANSPORT_CC_FMT, RTPFB, len(body) // 4) + body


def _runs(symbols: list[int]) -> list[int]:
    chunks, at = [], 0
    while at < len(symbols):
        run = 1
        while at + run < len(symbols) and symbols[at + run] == symbols[at] and run < 0x1FFF:
            run += 1
        chunks.append((symbols[at] << 13) | run)
        at += run
    return chunks


def _vectors(symbols: list[int]) -> list[int]:
    chunks = []
    for at in range(0, len(symbols), 7):
        chunk = 0xC000
        for index, symbol in enumerate(symbols[at : at + 7]):
            chunk |= symbol << (12 - 2 * index)
        chunks.append(chunk)
    return chunks
