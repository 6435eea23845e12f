"""Which avatar frame to show next, and how much of the inferred face
(``docs/design/compositing.md`` §5).

The avatar video bounces back and forth so the loop has no seam. A speech gate with a
hangover decides when to infer; the inferred face fades in and out over a few frames
instead of jumping (upstream switches hard and users see the mouth snap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compositor.clips import ClipPlan, bounce_index

__all__ = ["FrameSequencer", "FrameStep", "bounce_index"]


@dataclass(frozen=True)
class FrameStep:
    """What to show for one output frame."""

    output_index: int
    """Running output frame number ``n``, from 0."""
    avatar_index: int
    """Avatar background frame to use (the call's :class:`ClipPlan` decides; without clips
    ``bounce_index(n, frame_count)``)."""
    alpha: float
    """Weight of the inferred face, 0..1; 0 means show the raw avatar frame."""

    @property
    def infer(self) -> bool:
        """Whether this frame needs a lip-sync inference."""
        return self.alpha > 0.0


class FrameSequencer:
    """Steps through output frames, gating inference on audio level.

    Speaking starts when ``level_db >= threshold_db`` and lasts ``hangover_frames`` frames
    after the level last crossed it, so short pauses between words do not flicker. While
    speaking, alpha rises by ``1/blend_frames`` per frame towards 1; otherwise it falls
    towards 0 (``blend_frames = 0`` switches at once). Not thread-safe: one per session.

    The avatar frame comes from ``plan`` (default: every frame, bounced), told for each
    frame whether it shows an inferred face (``alpha > 0``): an inferred face plays over
    the speaking range, a raw frame over the chosen idle clip, so every frame a shared
    idle loop may replace is an idle-clip frame (``docs/design/compositing.md`` §5).
    """

    def __init__(
        self,
        frame_count: int,
        *,
        threshold_db: float = -45.0,
        hangover_frames: int = 4,
        blend_frames: int = 3,
        plan: ClipPlan | None = None,
    ) -> None:
        if frame_count < 1:
            raise ValueError(f"frame_count must be >= 1, got {frame_count}")
        if hangover_frames < 0:
            raise ValueError(f"hangover_frames must be >= 0, got {hangover_frames}")
        if blend_frames < 0:
            raise ValueError(f"blend_frames must be >= 0, got {blend_frames}")
        if math.isnan(threshold_db):
            raise ValueError("threshold_db must be a number, got NaN")
        if plan is not None and plan.frame_count != frame_count:
            raise ValueError(
                f"the clip plan is for {plan.frame_count} frames, the sequencer for {frame_count}"
            )
        self.plan = plan if plan is not None else ClipPlan(frame_count)
        self.frame_count = frame_count
        self.threshold_db = threshold_db
        self.hangover_frames = hangover_frames
        self.blend_frames = blend_frames
        self._n = 0
        self._hangover_left = 0
        # Alpha kept as an integer step count so repeated ramps never drift.
        self._level = 0

    @property
    def output_index(self) -> int:
        """The output index the next :meth:`step` will return."""
        return self._n

    @property
    def resting(self) -> bool:
        """Idle with nothing carried over: no hangover left and alpha 0, so the next
        silent frames step exactly as they would after any other silence."""
        return self._hangover_left == 0 and self._level == 0

    def step(self, level_db: float) -> FrameStep:
        """Advance one output frame given the audio level (dBFS) for that frame."""
        return self._advance(level_db >= self.threshold_db)  # NaN counts as silence

    def idle(self) -> FrameStep:
        """Advance one output frame as silence."""
        return self._advance(False)

    def _advance(self, loud: bool) -> FrameStep:
        if loud:
            speaking = True
            self._hangover_left = self.hangover_frames
        elif self._hangover_left > 0:
            speaking = True
            self._hangover_left -= 1
        else:
            speaking = False

        top = max(self.blend_frames, 1)
        if self.blend_frames == 0:
            self._level = top if speaking else 0
        elif speaking:
            self._level = min(self._level + 1, top)
        else:
            self._level = max(self._level - 1, 0)

        result = FrameStep(
            output_index=self._n,
            avatar_index=self.plan.advance(self._n, self._level > 0),
            alpha=self._level / top,
        )
        self._n += 1
        return result

    def reset(self) -> None:
        """Go idle at once (alpha 0, no hangover), keeping the bounce position.

        Used when speech is interrupted: the next frame shows the raw avatar frame.
        """
        self._hangover_left = 0
        self._level = 0
