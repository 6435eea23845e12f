"""Shared encoded idle loops: each avatar's idle frames H.264-encoded once, for every call
that is not speaking (``docs/design/idle-loops.md`` §16).

:mod:`~streaming.idle_loops.loop` encodes one loop into RTP payloads;
:mod:`~streaming.idle_loops.cache` builds loops in the background and keeps them within a
byte bound. Which frames of a call go out from a loop is the live call's choice
(:mod:`streaming.live.idle_sharing`). This package imports nothing of ``streaming.live``.
"""

from streaming.idle_loops.cache import IdleLoopCache, IdleLoopStats
from streaming.idle_loops.loop import (
    EncodedLoop,
    LoopKey,
    carries_idr,
    encode_loop,
    loop_length,
    parameter_sets,
)

__all__ = [
    "EncodedLoop",
    "IdleLoopCache",
    "IdleLoopStats",
    "LoopKey",
    "carries_idr",
    "encode_loop",
    "loop_length",
    "parameter_sets",
]
