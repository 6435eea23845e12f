"""The sample rates of a call's audio, in one place (``docs/design/audio-in.md`` §2).

A call's audio has two rates. :data:`OUT_RATE` (48 kHz) is the rate of the mixer, the
timeline and the Opus packets that go out: every source is brought to it once, at the
door (the caller's Opus is 48 kHz already; audio apps push, speak or stream is decoded
straight to it), so what an app sends up to 24 kHz reaches the caller whole.
:data:`FEATURE_RATE` (16 kHz) is what the models' features are computed from; it is
:mod:`inference_core.features`' own and only re-exported here, and the timeline's
48 → 16 kHz resampler is the one place a call's audio is brought down to it.

Imports nothing of :mod:`streaming`, so every sub-package may import it.
"""

from __future__ import annotations

from typing import Final

from inference_core.features import FEATURE_RATE

__all__ = ["AUDIO_CHUNK_S", "CHUNK_SAMPLES", "FEATURE_RATE", "OUT_RATE"]

#: The mixer's, the timeline's and the outgoing Opus stream's rate (Opus's own): mono.
OUT_RATE: Final = 48_000
#: Samples in one 20 ms chunk: one mixer tick, one Opus packet, one send slot.
CHUNK_SAMPLES: Final = 960
#: Seconds in one chunk.
AUDIO_CHUNK_S: Final = CHUNK_SAMPLES / OUT_RATE
