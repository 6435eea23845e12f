"""Idle clips: which avatar frame output frame ``n`` of a call shows
(``docs/design/compositing.md`` §5).

An avatar package may name segments of its frames (``"clips": {"idle": [0, 60], ...}``,
half-open ranges). A call plays one clip at a time, bouncing inside it: the ``idle`` clip
(or the one :meth:`ClipPlan.choose` picked) while silent, the ``speaking`` range while a
face is inferred. Without clips both are every frame, and the plan is today's
``bounce_index(n, frame_count)`` exactly.

The plan is a list of segments ``(first, clip, offset)``: from output frame ``first`` on,
frame ``n`` shows ``clip.start + bounce_index(n - first + offset, clip.length)``. So the
frame of any ``n`` is a pure lookup, and the sequencer (inferred frames), the renderer
(idle frames) and the shared idle loop (its position) agree on it. A new segment starts
when the wanted range changes, entering the new clip at the frame nearest to the one
shown just before (by a frame distance, :mod:`compositor.frame_similarity`) with the
bounce direction continuing, so the viewer sees one ordinary step, not a jump.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from compositor.exceptions import CompositorError

#: How far apart two avatar frames look (0 = the same picture); see
#: :meth:`compositor.frame_similarity.FrameThumbnails.distance`.
FrameDistance = Callable[[int, int], float]

IDLE = "idle"
SPEAKING = "speaking"


def bounce_index(n: int, count: int) -> int:
    """Return the avatar frame for output frame ``n``: 0, 1, …, count−1, count−2, …, 1, 0, 1, …

    End points are not repeated. ``count = 1`` always gives 0.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if count == 1:
        return 0
    period = 2 * (count - 1)
    m = n % period
    return m if m < count else period - m


class ClipNotFoundError(CompositorError):
    """A clip name the avatar does not have; ``clips`` lists those it has."""

    def __init__(self, name: str, clips: tuple[str, ...]) -> None:
        self.name = name
        self.clips = clips
        super().__init__(f"the avatar has no clip {name!r}; its clips: {', '.join(clips)}")


@dataclass(frozen=True)
class Clip:
    """Frames ``[start, stop)`` of an avatar, played back and forth."""

    name: str
    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ValueError(
                f"clip {self.name!r}: need 0 <= start < stop, got [{self.start}, {self.stop})"
            )

    @property
    def length(self) -> int:
        return self.stop - self.start

    @property
    def period(self) -> int:
        """Bounce positions before the clip's frames repeat."""
        return 1 if self.length == 1 else 2 * (self.length - 1)

    @property
    def range(self) -> tuple[int, int]:
        return self.start, self.stop

    def frame(self, position: int) -> int:
        """The avatar frame at bounce ``position`` of this clip."""
        return self.start + bounce_index(position, self.length)

    def __contains__(self, frame: object) -> bool:
        return isinstance(frame, int) and self.start <= frame < self.stop


@dataclass(frozen=True)
class Segment:
    """From output frame ``first`` on, frame ``n`` is ``clip.frame(n - first + offset)``."""

    first: int
    clip: Clip
    offset: int

    def position(self, n: int) -> int:
        return n - self.first + self.offset


class ClipPlan:
    """One call's avatar frame for every output frame ``n``; one per call, not thread-safe.

    ``ranges`` are the package's clips (``AvatarPackage.clips``: name → ``(start, stop)``);
    ``idle`` missing means every frame. Speech plays over ``speaking`` if declared, else
    over every frame (whatever idle clip is chosen). ``distance`` finds the entry frame
    of a clip; without it (thumbnails not built yet) a clip is entered at the frame shown
    before if the clip holds it, else at the frame of the same relative position.
    ``keep_segments`` bounds memory even if :meth:`forget_before` is never called.
    """

    def __init__(
        self,
        frame_count: int,
        ranges: Mapping[str, tuple[int, int]] | None = None,
        *,
        distance: FrameDistance | None = None,
        keep_segments: int = 256,
    ) -> None:
        if frame_count < 1:
            raise ValueError(f"frame_count must be >= 1, got {frame_count}")
        if keep_segments < 1:
            raise ValueError(f"keep_segments must be >= 1, got {keep_segments}")
        self.frame_count = frame_count
        self.distance = distance
        self._keep = keep_segments
        clips = {name: Clip(name, start, stop) for name, (start, stop) in (ranges or {}).items()}
        for clip in clips.values():
            if clip.stop > frame_count:
                raise ValueError(
                    f"clip {clip.name!r} [{clip.start}, {clip.stop}) is past the avatar's "
                    f"{frame_count} frames"
                )
        clips.setdefault(IDLE, Clip(IDLE, 0, frame_count))
        self.clips: Mapping[str, Clip] = clips
        self.speaking: Clip = clips.get(SPEAKING, Clip(SPEAKING, 0, frame_count))
        self._idle = IDLE
        # (first frames, segments), replaced whole: the timeline's job adds segments
        # while the event loop and the compositing threads look frames up.
        self._state: tuple[tuple[int, ...], tuple[Segment, ...]] = (
            (0,),
            (Segment(0, clips[IDLE], 0),),
        )
        self._floor = 0  # forget_before's frame: segments ending before it go next time
        self._last: int | None = None  # the last n given to advance

    @property
    def current_idle(self) -> str:
        """The clip played while silent."""
        return self._idle

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The kept segments, oldest first."""
        return self._state[1]

    def choose(self, name: str) -> None:
        """Play clip ``name`` while silent, from the next silent frame :meth:`advance`
        decides; raises :class:`ClipNotFoundError` for a clip the avatar does not have."""
        if name not in self.clips:
            raise ClipNotFoundError(name, tuple(sorted(self.clips)))
        self._idle = name

    def at(self, n: int) -> int:
        """The avatar frame output frame ``n`` shows (``n`` at or after the oldest kept
        segment; the newest one extends forever)."""
        segment = self._segment(n)
        return segment.clip.frame(segment.position(n))

    def loop_position(self, n: int) -> tuple[Clip, int]:
        """The clip frame ``n`` plays and its bounce position there: the shared idle loop
        of that clip sends its position ``p % loop.length`` (``p >= 0``)."""
        segment = self._segment(n)
        return segment.clip, segment.position(n)

    def advance(self, n: int, speaking: bool) -> int:
        """Decide frame ``n`` (called in order of ``n``): start a new segment at ``n`` if
        the wanted range changed (speech ↔ silence with different ranges, another idle
        clip chosen), and return the avatar frame ``n`` shows."""
        if self._last is not None and n <= self._last:
            raise ValueError(f"advance: frame {n} after frame {self._last}; call it in order")
        self._last = n
        target = self.speaking if speaking else self.clips[self._idle]
        current = self._segment(n)
        if target.range != current.clip.range:
            self._start(n, target)
        return self.at(n)

    def forget_before(self, n: int) -> None:
        """Let the segments that end before output frame ``n`` go (the newest is kept):
        dropped when :meth:`advance` next adds one, so only the deciding thread writes."""
        self._floor = max(self._floor, n)

    def _segment(self, n: int) -> Segment:
        firsts, segments = self._state
        at = bisect.bisect_right(firsts, n) - 1
        if at < 0:
            raise ValueError(
                f"frame {n} is before the oldest kept segment (from frame {firsts[0]})"
            )
        return segments[at]

    def _start(self, n: int, clip: Clip) -> None:
        offset = 0
        firsts, segments = self._state
        if n - 1 >= firsts[0]:
            previous = self._segment(n - 1)
            q = previous.position(n - 1)
            shown, coming = previous.clip.frame(q), previous.clip.frame(q + 1)
            rising = coming > shown or previous.clip.length == 1
            if shown in clip:  # go on from it, one ordinary step
                offset = _entry_position(clip, shown, rising) + 1
            else:  # show its nearest frame, then move the way the picture was moving
                entry = self._entry(shown, previous.clip, clip)
                if self.distance is not None:
                    rising = self._rises_towards(clip, entry, coming, self.distance)
                offset = _entry_position(clip, entry, rising)
        segment = Segment(n, clip, offset % clip.period)
        if firsts[-1] == n:  # nothing shown of the last one yet: replace it
            firsts, segments = firsts[:-1], segments[:-1]
        firsts, segments = (*firsts, n), (*segments, segment)
        drop = max(bisect.bisect_right(firsts, self._floor) - 1, len(firsts) - self._keep, 0)
        self._state = (firsts[drop:], segments[drop:])

    def _entry(self, shown: int, left: Clip, clip: Clip) -> int:
        """The frame of ``clip`` (which does not hold ``shown``, a frame of ``left``)
        closest to ``shown``."""
        if self.distance is not None:
            distance = self.distance
            return min(range(clip.start, clip.stop), key=lambda f: (distance(shown, f), f))
        if left.length == 1:
            return clip.start
        relative = (shown - left.start) / (left.length - 1)
        return clip.start + round(relative * (clip.length - 1))

    @staticmethod
    def _rises_towards(clip: Clip, entry: int, coming: int, distance: FrameDistance) -> bool:
        """Whether, after ``entry``, the rising frame numbers of ``clip`` look more like
        ``coming`` (what the left clip would have shown next) than the falling ones."""
        up = clip.frame(_entry_position(clip, entry, True) + 1)
        down = clip.frame(_entry_position(clip, entry, False) + 1)
        return distance(coming, up) <= distance(coming, down)


def _entry_position(clip: Clip, frame: int, rising: bool) -> int:
    """The bounce position of ``clip`` showing ``frame`` while moving the way ``rising``
    says (turning at an end, as the bounce does)."""
    k = frame - clip.start
    last = clip.length - 1
    if last == 0:
        return 0
    if rising:
        return k if k < last else last
    return clip.period - k if k > 0 else 0
