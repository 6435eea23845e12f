"""When a frame's audio features are final: the integer index arithmetic of the feature
stream (:mod:`~inference_core.features.stream`) and the lookahead it implies.

A frame ``i`` of ``fps`` video sees mel windows starting at ``floor(i · 80 / fps)`` (the
mel runs at 80 frames per second) and its speech level over half a frame either side;
:func:`lookahead_ms` is how much audio past a frame's own time it waits for
(``docs/design/model.md`` §3).
"""

from __future__ import annotations

from typing import Literal

from inference_core.features.encoder import MEL_WINDOW
from inference_core.features.mel import MelConfig

FeatureKind = Literal["ave", "mel"]

CONTEXT_ROWS = 16  # extended feature rows per video frame
CONTEXT_LEFT = 8  # rows before the frame's own row
MAX_RIGHT_CONTEXT = CONTEXT_ROWS - CONTEXT_LEFT - 1


def check_args(kind: str, fps: int, right_context: int) -> None:
    if kind not in ("ave", "mel"):
        raise ValueError(f"kind must be 'ave' or 'mel', got {kind!r}")
    if not isinstance(fps, int) or fps <= 0:
        raise ValueError(f"fps must be a positive integer, got {fps!r}")
    if not 0 <= right_context <= MAX_RIGHT_CONTEXT:
        raise ValueError(
            f"right_context must be in 0..{MAX_RIGHT_CONTEXT} (future feature rows per frame), "
            f"got {right_context}"
        )


class FrameTiming:
    """Integer index arithmetic shared by the stream and :func:`lookahead_ms`.

    Exact integers instead of ``int(80.0 * m / fps)``: the float form lands a hair below
    an integer for some ``m`` and fps, which would pick the previous mel frame.
    """

    def __init__(self, cfg: MelConfig, fps: int) -> None:
        self.cfg = cfg
        self.fps = fps

    def window_start(self, m: int) -> int:
        """First mel frame of window ``m``: ``floor(m · mel_fps / fps)``."""
        return (m * self.cfg.sample_rate) // (self.cfg.hop * self.fps)

    def window_count(self, n_mel: int) -> int:
        """Windows of a finished "ave" stream: ``int((n_mel − 16) / 3.2) + 2``."""
        usable = max(n_mel, MEL_WINDOW) - MEL_WINDOW
        return (usable * self.fps * self.cfg.hop) // self.cfg.sample_rate + 2

    def span(self, i: int) -> tuple[int, int]:
        """Samples ``[start, end)`` that frame ``i`` covers: half a frame either side."""
        sr, fps = self.cfg.sample_rate, self.fps
        return ((2 * i - 1) * sr) // (2 * fps), ((2 * i + 1) * sr) // (2 * fps)

    def level_span(self, i: int) -> tuple[int, int]:
        """Samples whose level decides whether frame ``i`` shows speech: its own span and
        the next half frame. Lips move with a sound's onset, not a frame after it: speech
        starting in the second half of a frame's interval shows from that frame on, up to
        half a frame (20 ms at 25 fps) before it is heard, the side audio-visual sync
        tolerates best (lips lead in natural speech too)."""
        start, end = self.span(i)
        return start, end + self.cfg.sample_rate // (2 * self.fps)

    def samples_for_mel(self, t: int) -> int:
        """Samples that must have arrived before mel frame ``t`` is final (not at flush)."""
        half = self.cfg.n_fft // 2
        return max(t * self.cfg.hop + half, half + 1)

    def samples_needed(self, i: int, kind: FeatureKind, right_context: int) -> int:
        """Samples that must have arrived before frame ``i`` can be emitted mid-stream."""
        if kind == "ave":
            # Frame i's last row is extended row i+R = window i+R−1 (row 0 repeats window 0).
            window = max(i + right_context - 1, 0)
        else:
            window = i
        last_mel = self.window_start(window) + MEL_WINDOW - 1
        return max(self.samples_for_mel(last_mel), self.level_span(i)[1])


def lookahead_ms(
    right_context: int = MAX_RIGHT_CONTEXT, fps: int = 25, *, kind: FeatureKind = "ave"
) -> float:
    """Audio (ms) past frame ``i``'s own time ``i / fps`` needed before it can be emitted.

    The maximum over all frames, STFT half window included: 452.5 ms for "ave" with the
    full right context at 25 fps, 40 ms less per row of right context dropped. R=0 gives
    the same 212.5 ms as R=1 because frame 0's own row is window 0 either way; after
    frame 0, R=0 frames need only 172.5 ms. Kind "mel" needs 212.5 ms.
    """
    check_args(kind, fps, right_context)
    timing = FrameTiming(MelConfig(), fps)
    sr = timing.cfg.sample_rate
    # The window starts repeat every fps/gcd(80, fps) frames and the level spans every
    # 2·fps frames, so frame 0 (the start-up case) plus 2·fps + 1 frames cover every case.
    # Integer numerators (in units of 1/(sr·fps) s) so the figure has no rounding noise.
    worst = max(
        timing.samples_needed(i, kind, right_context) * fps - i * sr for i in range(2 * fps + 2)
    )
    return 1000.0 * worst / (sr * fps)
