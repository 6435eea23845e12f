"""The quality ladder: what picture a call's video budget buys.

When the estimate cannot carry the current picture, its bitrate goes down first; when
that leaves the picture coarse, a smaller frame at the same bitrate looks better, and
below the smallest, fewer frames (``docs/design/link.md`` §19). A :class:`Ladder` is a
call's steps, from the avatar's own size down: each a frame size (a fraction of the
avatar's, :data:`SCALES`, its aspect kept, even dimensions for 4:2:0) at the avatar's
frame rate, and last the smallest size at :data:`LOW_FPS`.

How coarse a picture is depends on what it shows (the demo avatar, flat colours, is
sharper at 720p and 150 kbit/s than at any smaller size; a filmed face is not), so the
steps are chosen the way libwebrtc's quality scaler chooses them, by the encoder's own
quantiser: the mean QP of the call's last :data:`QP_FRAMES` live P-frames above
:data:`QP_HIGH` means the budget cannot carry this size; below :data:`QP_LOW`, a larger
one would still look good. A budget below a step's floor (:data:`FLOOR_BITS_PER_PIXEL`,
far below where any content looks right) leaves it whatever the QP says. The QP is
judged for a step down only once the estimate has settled: during a call's first climb
from its start rate every picture is coarse for a second. For a step up it is judged
during a climb too: a budget that is rising only makes the picture finer, and a climb
of chained probes keeps the estimate unsettled for as long as it lasts (after a dip,
540p stayed at its ceiling for 7 s with a QP of 11 while the estimate had room for
720p: ``docs/performance/networks.md``).

:meth:`Ladder.decide` moves between steps: down at once on the floor, or when the QP
has been high over a full window at this step; up only when the budget clears the
larger step's floor by :data:`UP_MARGIN`, the QP is low, this has lasted
:data:`UP_HOLD_S` and the last step down is :data:`DOWN_HOLD_S` old. A step left
downwards within :data:`BOUNCE_S` of being reached doubles its hold (up to
:data:`MAX_HOLD_S`), so a picture does not flip back and forth.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

#: The frame sizes, as fractions of the avatar's (720p → 540p, 360p, 270p).
SCALES = (1.0, 0.75, 0.5, 0.375)
#: The reduced frame rate of the last step.
LOW_FPS = 15
#: A step's floor, bits per pixel per frame (720p25: 138 kbit/s; 270p25: 19 kbit/s).
FLOOR_BITS_PER_PIXEL = 0.006
#: H.264 QP bounds of libwebrtc's quality scaler: coarser than HIGH steps down, finer
#: than LOW allows a step up.
QP_HIGH, QP_LOW = 37.0, 24.0
QP_FRAMES = 25
UP_MARGIN = 1.2
UP_HOLD_S = 1.5
DOWN_HOLD_S = 4.0
BOUNCE_S = 8.0
MAX_HOLD_S = 30.0


def even(value: float) -> int:
    """``value`` rounded to an even number, at least 2 (4:2:0 frames)."""
    return max(2, 2 * round(value / 2))


@dataclass(frozen=True)
class Step:
    """One rung of the ladder: a picture, its floor, and the most it is given."""

    index: int
    width: int
    height: int
    fps: int
    floor_bps: int
    ceiling_bps: int

    @property
    def name(self) -> str:
        return f"{self.height}p{self.fps}"


def steps_for(width: int, height: int, fps: int, top_bps: int) -> tuple[Step, ...]:
    """The ladder of a ``width``×``height`` avatar at ``fps`` sent at up to ``top_bps``.

    Sizes under 90 lines are left out; the last size is repeated at :data:`LOW_FPS`
    (when that is below ``fps``). Each step's ceiling is ``top_bps`` scaled by its pixel
    rate (the configured bitrate per pixel, never more).
    """
    pictures: list[tuple[int, int, int]] = []
    for scale in SCALES:
        size = (even(width * scale), even(height * scale))
        if size[1] >= 90 and (not pictures or size != pictures[-1][:2]):
            pictures.append((*size, fps))
    if not pictures:
        pictures.append((width, height, fps))
    if fps > LOW_FPS:
        pictures.append((*pictures[-1][:2], LOW_FPS))
    top_rate = pictures[0][0] * pictures[0][1] * pictures[0][2]
    steps = []
    for index, (w, h, f) in enumerate(pictures):
        ceiling = round(top_bps * w * h * f / top_rate)
        floor = min(round(FLOOR_BITS_PER_PIXEL * w * h * f), ceiling)
        steps.append(Step(index, w, h, f, floor, ceiling))
    return tuple(steps)


@dataclass
class _StepHistory:
    reached_at: float = -math.inf
    hold_s: float = UP_HOLD_S


@dataclass
class Ladder:
    """A call's place on its steps (module doc). Time is seconds, passed in."""

    steps: tuple[Step, ...]
    current: int = 0
    changes: int = 0
    _qps: deque[float] = field(default_factory=lambda: deque(maxlen=QP_FRAMES))
    _good_since: float | None = None
    _last_down: float = -math.inf
    _history: dict[int, _StepHistory] = field(default_factory=dict)

    @property
    def step(self) -> Step:
        return self.steps[self.current]

    @property
    def qp(self) -> float | None:
        """The mean QP of the last live P-frames at this step (None until a window)."""
        return sum(self._qps) / len(self._qps) if len(self._qps) == QP_FRAMES else None

    def frame_qp(self, qp: float) -> None:
        """The encoder made a P-frame at the current step with quantiser ``qp``."""
        self._qps.append(qp)

    def bitrate(self, budget_bps: int) -> int:
        """What the encoder is given at the current step for ``budget_bps``."""
        return min(budget_bps, self.step.ceiling_bps)

    def decide(self, budget_bps: int, now: float, *, settled: bool = True) -> Step:
        """The step for a video budget of ``budget_bps`` now. While the estimate is not
        ``settled`` (a call's first climb, a probe's lift on trial) a high QP is not
        judged: it was made at a budget about to change (module doc)."""
        steps, index = self.steps, self.current
        qp = self.qp
        last = len(steps) - 1
        if index < last and (
            budget_bps < steps[index].floor_bps or (settled and qp is not None and qp > QP_HIGH)
        ):
            index += 1
            while index < last and budget_bps < steps[index].floor_bps:
                index += 1
            self._move(index, now, down=True)
            return self.step
        upper = steps[index - 1] if index > 0 else None
        if (
            upper is None
            or budget_bps < upper.floor_bps * UP_MARGIN
            or (qp is not None and qp >= QP_LOW)
            or (qp is None and budget_bps < upper.ceiling_bps)
        ):
            self._good_since = None
            return self.step
        if self._good_since is None:
            self._good_since = now
        hold = self._history.setdefault(index - 1, _StepHistory()).hold_s
        if now - self._good_since >= hold and now - self._last_down >= DOWN_HOLD_S:
            self._move(index - 1, now, down=False)
        return self.step

    def _move(self, index: int, now: float, *, down: bool) -> None:
        left = self._history.setdefault(self.current, _StepHistory())
        if down:
            self._last_down = now
            if now - left.reached_at < BOUNCE_S:  # reached and lost again: a bounce
                left.hold_s = min(2 * left.hold_s, MAX_HOLD_S)
        self.current = index
        self._history.setdefault(index, _StepHistory()).reached_at = now
        self._good_since = None
        self._qps.clear()
        self.changes += 1
