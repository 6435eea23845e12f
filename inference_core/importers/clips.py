"""Clips an import names: ``--clip NAME=START:STOP``, in frames or seconds.

``thinking=120:180`` is frames 120 to 179 of the imported avatar (half-open, as in
``avatar.json``); ``thinking=4.8s:7.2s`` the same at 25 fps, rounded to the nearest
frame. A build from a video counts both in the video's time, before the kept segment is
cut out (:func:`~.build.build_from_video` keeps a segment that holds every clip).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inference_core.avatars.manifest import CLIP_NAME_PATTERN
from inference_core.importers.errors import ImportFailedError

OPTION = "--clip"
_BOUND = re.compile(r"(\d+)|(\d+(?:\.\d*)?|\.\d+)s")


@dataclass(frozen=True)
class ClipOption:
    """One ``--clip``: its name and bounds, each a frame number (int) or seconds (float)."""

    text: str
    name: str
    start: int | float
    stop: int | float

    def frames(self, fps: int) -> tuple[int, int]:
        """``[start, stop)`` in frames at ``fps``."""
        return _frame(self.start, fps), _frame(self.stop, fps)


def _frame(bound: int | float, fps: int) -> int:
    return bound if isinstance(bound, int) else round(bound * fps)


def parse_clip(text: str) -> ClipOption:
    """Read one ``NAME=START:STOP`` (frames, or seconds written ``2.0s``)."""
    name, equals, span = text.partition("=")
    start, colon, stop = span.partition(":")
    if not equals or not colon:
        raise ImportFailedError(
            f"{OPTION} {text!r}: write NAME=START:STOP, frames (idle=0:60) or seconds "
            "(idle=0s:2.4s)"
        )
    if not CLIP_NAME_PATTERN.fullmatch(name):
        raise ImportFailedError(
            f"{OPTION} {text!r}: the name {name!r} must be 1-32 characters of a-z, 0-9, '_' "
            "and '-', starting with a letter or digit"
        )
    bounds: list[int | float] = []
    for what, bound in (("START", start), ("STOP", stop)):
        match = _BOUND.fullmatch(bound.strip())
        if match is None:
            raise ImportFailedError(
                f"{OPTION} {text!r}: {what} {bound!r} is not a frame number (120) or seconds (4.8s)"
            )
        bounds.append(int(match.group(1)) if match.group(1) else float(match.group(2)))
    return ClipOption(text, name, bounds[0], bounds[1])


def clip_ranges(
    options: Sequence[ClipOption], fps: int, frame_count: int, *, shift: int = 0
) -> dict[str, tuple[int, int]]:
    """The clips as ``avatar.json`` ranges of an avatar of ``frame_count`` frames whose
    frame 0 is frame ``shift`` of what the options count in; every problem is refused
    naming the option."""
    ranges: dict[str, tuple[int, int]] = {}
    for option in options:
        start, stop = option.frames(fps)
        shortest = 1 if frame_count == 1 else 2
        if option.name in ranges:
            raise ImportFailedError(f"{OPTION} {option.text!r}: clip {option.name!r} given twice")
        if stop - start < shortest:
            raise ImportFailedError(
                f"{OPTION} {option.text!r}: frames [{start}, {stop}) hold {max(0, stop - start)} "
                f"frame(s) at {fps} fps; a clip needs at least {shortest}"
            )
        if start < shift or stop > shift + frame_count:
            kept = f" (frames {shift} to {shift + frame_count - 1} were kept)" if shift else ""
            raise ImportFailedError(
                f"{OPTION} {option.text!r}: frames [{start}, {stop}) are past the avatar's "
                f"{frame_count} frames{kept}"
            )
        ranges[option.name] = (start - shift, stop - shift)
    return ranges


def clips_span(options: Sequence[ClipOption], fps: int) -> tuple[int, int] | None:
    """The frames ``[first, stop)`` every clip lies in, None without clips."""
    if not options:
        return None
    spans = [option.frames(fps) for option in options]
    return min(s for s, _ in spans), max(s for _, s in spans)


def describe(ranges: Mapping[str, tuple[int, int]]) -> str:
    """``idle 0-59, thinking 120-179`` (last frames inclusive, as people count)."""
    return ", ".join(f"{name} {start}-{stop - 1}" for name, (start, stop) in ranges.items())
