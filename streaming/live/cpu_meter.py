"""What a frame sent really costs this process: its CPU time over the frames it sent.

Admission's CPU model (``docs/design/delay.md`` §9) prices a session from constants
measured once per preset on one machine. The live cost depends on much more (the CPU
model and its clock that day, what else the machine runs, the callers' codecs, the
number of calls sharing the loop), and a model that prices a call too low lets in calls
that then all miss frames: with 4–5 admitted 720p calls on the 2-core development VM
0–2.5% of frames were lip-synced (``docs/changelog.md``, issue 12), because the constants
said 12 ms of CPU per frame where the live server spent 17–21.

:class:`CpuMeter` measures that cost: the process's CPU time (every thread, user and
system) over a recent window divided by the video frames sent in it, once enough frames
went out for the figure to mean something. It samples the counters when made, when
asked (an offer, a snapshot) and whenever :meth:`CpuMeter.sample` is called (the session
manager does, once a second while calls are live, so that a call's set-up leaves the
window), at most once a second; samples older than the window are dropped, so it
holds about ``window_s`` of them.
Everything the process did in the window counts, a model being loaded included: the
figure errs on the side of the calls already running.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

#: How far back the figure looks.
WINDOW_S = 20.0
#: Frames that must have been sent in the window for a figure: 5 s of one 25 fps call.
MIN_FRAMES = 125


@dataclass(frozen=True)
class _Sample:
    at: float  # monotonic seconds
    cpu_s: float  # process CPU seconds
    frames: int  # frames sent since start-up


class CpuMeter:
    """Process CPU milliseconds per video frame sent, over the last ``window_s``.

    ``frames()`` is the number of frames sent since start-up (never decreasing);
    ``cpu`` and ``clock`` default to the process's CPU clock and the monotonic clock.
    """

    def __init__(
        self,
        frames: Callable[[], int],
        *,
        window_s: float = WINDOW_S,
        min_frames: int = MIN_FRAMES,
        cpu: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._frames = frames
        self._window_s = window_s
        self._min_frames = min_frames
        self._cpu = cpu
        self._clock = clock
        self._samples: deque[_Sample] = deque([self._sample()])

    def _sample(self) -> _Sample:
        return _Sample(self._clock(), self._cpu(), self._frames())

    def sample(self) -> None:
        """Take a sample now, unless one was taken less than a second ago."""
        self._take()

    def _take(self) -> _Sample:
        now = self._sample()
        if now.at - self._samples[-1].at >= 1.0:
            self._samples.append(now)
        return now

    def ms_per_frame(self) -> float | None:
        """The measured figure, or None until ``min_frames`` were sent within a window."""
        now = self._take()
        # The reference is the oldest sample within the window, or the newest older one
        # when nothing was sampled lately (a figure over a longer span, still measured).
        while len(self._samples) > 2 and now.at - self._samples[1].at >= self._window_s:
            self._samples.popleft()
        first = self._samples[0]
        frames = now.frames - first.frames
        if frames < self._min_frames:
            return None
        return (now.cpu_s - first.cpu_s) * 1000.0 / frames
