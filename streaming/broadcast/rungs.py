"""The session's stream at lower quality steps, for viewers whose link cannot carry it.

A session sends one stream, at its encoder's step (the avatar's full picture for a
session no caller owns). A viewer on a slower link is moved to a lower step of the same
ladder the calls use (``streaming/link/ladder.py``: 540p, 360p, 270p, then 15 fps), by
its link's budget (the target its link sets, which the pacer holds it to): down as soon
as the budget is under the step's ceiling, up once it clears the next step's by
:data:`UP_MARGIN` (docs/design/broadcast.md §21).

Each step that some viewer wants is encoded once for all its viewers: the session's own
frames are decoded once (:class:`Rungs` reads the session's feed as a viewer does, from
an IDR, in the reference chain) and each wanted step's encoder scales and encodes the
picture, at the lowest budget among its viewers, into a feed of its own. Decoding and
encoding run as one job per frame on the session's workers; a step nobody asked for in
:data:`IDLE_S` is dropped, and with no step wanted nothing is decoded. A viewer that
changes step waits for the new step's IDR (it asks for one; a new step starts with one).
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import av

from streaming.broadcast.feed import SentFrame, VideoFeed
from streaming.broadcast.h264_units import access_unit
from streaming.link.ladder import Step
from streaming.webrtc.video_encoder import EncoderFactory, LipstreamH264Encoder, payload_packet

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A viewer moves up a step only once its budget is this much over that step's ceiling.
UP_MARGIN = 1.15
#: Seconds after which a step no viewer asked for is no longer encoded.
IDLE_S = 10.0
_VIDEO_TIME_BASE = fractions.Fraction(1, 90_000)


class Offload(Protocol):
    """Runs a function off the event loop (the session's workers)."""

    def run(self, fn: Callable[..., T], /, *args: Any) -> asyncio.Future[T]: ...


@dataclass
class Rung:
    """One lower step: its encoder, its feed, and its viewers' budgets lately."""

    step: Step
    encoder: LipstreamH264Encoder
    feed: VideoFeed = field(default_factory=VideoFeed)
    budgets: dict[int, tuple[int, float]] = field(default_factory=dict)  # viewer → (bps, when)
    frames: int = 0

    def bitrate(self, now: float) -> int:
        """What the step is encoded at: the least budget of its viewers of the last
        :data:`IDLE_S`, never over the step's ceiling."""
        fresh = [bps for bps, at in self.budgets.values() if now - at < IDLE_S]
        return min([self.step.ceiling_bps, *fresh])


class Rungs:
    """The session's lower steps (module doc); :meth:`run` is its task."""

    def __init__(
        self,
        top: VideoFeed,
        steps: tuple[Step, ...],
        encoders: EncoderFactory,
        executor: Offload,
        *,
        fps: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.steps = steps
        self._top = top
        self._encoders = encoders
        self._executor = executor
        self._fps = fps
        self._clock = clock
        self._rungs: dict[int, Rung] = {}
        self._wanted = asyncio.Event()
        self.frames_decoded = 0

    @property
    def encoded(self) -> dict[str, int]:
        """Frames encoded per step name (what the counters show)."""
        return {rung.step.name: rung.frames for rung in self._rungs.values()}

    def choose(self, current: int, budget_bps: int) -> int:
        """The step a viewer on ``current`` with ``budget_bps`` should watch."""
        steps = self.steps
        step = current
        while step < len(steps) - 1 and budget_bps < steps[step].ceiling_bps:
            step += 1  # down at once: the link cannot carry this one
        while step > 0 and budget_bps >= UP_MARGIN * steps[step - 1].ceiling_bps:
            step -= 1
        return step

    def feed(self, step: int, viewer: int, budget_bps: int) -> VideoFeed:
        """The feed of ``step`` (0: the session's own), for ``viewer`` with its budget."""
        if step == 0:
            return self._top
        rung = self._rungs.get(step)
        if rung is None:
            top = self.steps[0]
            picked = self.steps[step]
            encoder = self._encoders.create(top.width, top.height, top.fps)
            encoder.set_link(picked.width / top.width, picked.fps, picked.ceiling_bps)
            rung = self._rungs[step] = Rung(picked, encoder)
            logger.info("viewers' step %s is encoded from now on", picked.name)
            self._wanted.set()
        rung.budgets[viewer] = (budget_bps, self._clock())
        return rung.feed

    async def run(self) -> None:
        """Decode the session's frames and encode each wanted step, until cancelled."""
        decoder: Any = None
        last: int | None = None
        index: int | None = None
        try:
            while True:
                if not self._current():
                    decoder = last = index = None
                    self._wanted.clear()
                    await self._wanted.wait()
                if index is None:
                    index = self._top.last + 1 if self._top.last is not None else 0
                frame = await self._top.frame(index)
                index += 1
                if frame is None:
                    continue
                if decoder is None or frame.previous != last:
                    if not frame.keyframe:
                        decoder = None
                        self._top.request_keyframe()
                        continue
                    decoder = av.CodecContext.create("h264", "r")
                last = frame.index
                now = self._clock()
                rungs = [(rung, rung.bitrate(now)) for rung in self._current()]
                made = await self._executor.run(self._transcode, decoder, frame, rungs)
                for rung, packet in made:
                    rung.feed.publish(frame.index, packet, rung.encoder)
        finally:
            for rung in self._rungs.values():
                rung.feed.close()

    def _current(self) -> list[Rung]:
        """The steps still wanted (one nobody asked for lately is dropped)."""
        now = self._clock()
        for step, rung in list(self._rungs.items()):
            if all(now - at >= IDLE_S for _, at in rung.budgets.values()):
                logger.info("viewers' step %s is no longer encoded", rung.step.name)
                rung.feed.close()
                del self._rungs[step]
        return list(self._rungs.values())

    def _transcode(
        self, decoder: Any, frame: SentFrame, rungs: list[tuple[Rung, int]]
    ) -> list[tuple[Rung, av.Packet[Any]]]:
        """On a worker: the session's frame decoded, then encoded at each step."""
        pictures = decoder.decode(av.Packet(access_unit(frame.payloads)))
        if not pictures:
            return []
        self.frames_decoded += 1
        picture = pictures[-1]
        timestamp = frame.index * 90_000 // self._fps
        picture.pts, picture.time_base = timestamp, _VIDEO_TIME_BASE
        made = []
        for rung, bitrate in rungs:
            encoder = rung.encoder
            if not encoder.sends(frame.index):
                made.append((rung, payload_packet([], timestamp)))
                continue
            encoder.target_bitrate = bitrate
            made.append((rung, encoder.encode_packet(picture)))
            rung.frames += 1
        return made
