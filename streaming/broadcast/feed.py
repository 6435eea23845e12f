"""What a session's video track sent, kept a few frames for the session's viewers.

Every H.264 frame a session sends (its caller's track, or a callerless session's own
:class:`~streaming.broadcast.station.Station`) is published here once, as the RTP
payloads its encoder made (:class:`PublishedVideo` wraps the session's video source). A
viewer's track asks for the frame of its slot (:meth:`VideoFeed.frame`); the viewers of
one session share the session's clock, so they all wait on the same publication and
wake in one turn of the event loop, and each sends the same payloads with its own
headers and encryption (``docs/design/broadcast.md`` §21).

Nothing waits for a viewer: the feed keeps the last :data:`KEPT_FRAMES` frames, a
viewer whose slot has gone gets nothing for it, and a viewer out of the frames'
reference chain (it joined, or it missed a frame) sends nothing until the next IDR
(:class:`ViewerVideo`), asking the session's encoder for one. The encoder answers such
requests at most once per :data:`VIEWER_KEYFRAME_INTERVAL_S` (or its call's own
interval), so viewers joining cannot flood the stream with IDRs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import av
import numpy as np

from streaming.idle_loops import carries_idr
from streaming.webrtc.tracks import VideoSource
from streaming.webrtc.video_encoder import LipstreamH264Encoder, payload_packet

logger = logging.getLogger(__name__)

#: Frames the feed keeps for viewers whose slot comes a little after the session's.
KEPT_FRAMES = 8
#: The least time between two IDRs viewers may ask a callerless session's encoder for.
VIEWER_KEYFRAME_INTERVAL_S = 1.0
#: Seconds a viewer watches the session's own stream before its link picks its step.
STEPS_AFTER_S = 5.0


@dataclass(frozen=True, slots=True)
class SentFrame:
    """Frame ``index`` as the session sent it; ``previous`` is the index of the frame
    sent before it (None for the first), which a decoder must have had."""

    index: int
    previous: int | None
    packet: av.Packet[Any]

    @property
    def payloads(self) -> list[bytes]:
        payloads = self.packet.opaque
        assert isinstance(payloads, list)
        return payloads

    @property
    def keyframe(self) -> bool:
        """Whether the frame is an IDR: a decoder can start at it."""
        return carries_idr(self.payloads)


class VideoFeed:
    """The session's sent frames (module doc). Event-loop only."""

    def __init__(self, kept: int = KEPT_FRAMES) -> None:
        self._kept = kept
        self._frames: OrderedDict[int, SentFrame] = OrderedDict()
        self._waiting: dict[int, list[asyncio.Future[SentFrame | None]]] = {}
        self._last: int | None = None
        self._encoder: LipstreamH264Encoder | None = None
        self._closed = False
        self.published = 0
        self.keyframes_asked = 0

    @property
    def last(self) -> int | None:
        """The index of the last frame published (None before the first)."""
        return self._last

    def publish(self, index: int, packet: av.Packet[Any], encoder: LipstreamH264Encoder) -> None:
        """The session sent frame ``index`` as ``packet`` (payloads in its ``opaque``),
        encoded by ``encoder``: viewers waiting for it, or for a slot it passed, wake."""
        self._encoder = encoder
        if not isinstance(packet.opaque, list) or not packet.opaque:
            return  # nothing sent for this slot (a ladder step's frame rate)
        frame = SentFrame(index, self._last, packet)
        self._last = index
        self._frames[index] = frame
        self.published += 1
        while len(self._frames) > self._kept:
            self._frames.popitem(last=False)
        if self._waiting:
            for slot in [i for i in self._waiting if i <= index]:
                for future in self._waiting.pop(slot):
                    if not future.done():
                        future.set_result(frame if slot == index else None)

    async def frame(self, index: int) -> SentFrame | None:
        """Frame ``index`` once the session sent it; None if it sent a later one instead
        (the slot was skipped), if the frame is no longer kept, or once the feed closed."""
        frame = self._frames.get(index)
        if frame is not None:
            return frame
        if self._closed or (self._last is not None and index <= self._last):
            return None
        future: asyncio.Future[SentFrame | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(index, []).append(future)
        return await future

    def request_keyframe(self) -> None:
        """A viewer needs an IDR: the session's encoder is asked (it throttles)."""
        encoder = self._encoder
        if encoder is None:
            return
        self.keyframes_asked += 1
        encoder.keyframe_interval_s = max(encoder.keyframe_interval_s, VIEWER_KEYFRAME_INTERVAL_S)
        encoder.peer_requests_keyframe()

    def close(self) -> None:
        """The session ended: every waiting viewer gets None, and later ones at once."""
        self._closed = True
        waiting, self._waiting = self._waiting, {}
        for futures in waiting.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)


class PublishedVideo:
    """The session's video source (``VideoSource``), each H.264 frame it hands out
    published to ``feed``."""

    def __init__(self, source: VideoSource, feed: VideoFeed) -> None:
        self._source = source
        self._feed = feed

    def frame_for(self, index: int) -> Coroutine[Any, Any, np.ndarray]:
        return self._source.frame_for(index)  # VP8: aiortc encodes; nothing to publish

    async def packet_for(self, index: int, encoder: LipstreamH264Encoder) -> av.Packet[Any]:
        packet = await self._source.packet_for(index, encoder)
        self._feed.publish(index, packet, encoder)
        return packet

    def sent(self, index: int) -> None:
        self._source.sent(index)


class StepChoice(Protocol):
    """Where a viewer's step's frames come from (:class:`~streaming.broadcast.rungs.Rungs`)."""

    def choose(self, current: int, budget_bps: int) -> int: ...

    def feed(self, step: int, viewer: int, budget_bps: int) -> VideoFeed: ...


class ViewerVideo:
    """A viewer's video source: the session's frame for each slot, from ``feed``.

    A frame goes to the viewer only if the viewer has the frame it references (the one
    the session sent before it) or it is an IDR; otherwise the slot sends nothing and
    the session's encoder is asked for an IDR. A PLI or FIR from the viewer (its
    ``encoder``'s keyframe request) is passed on the same way; the viewer keeps getting
    frames meanwhile. With ``steps``, the viewer watches the quality step its link's
    budget (its ``encoder``'s target) buys, moving to another step's feed at that
    feed's next IDR; not in its first :data:`STEPS_AFTER_S`, while its link's estimate
    still climbs from its start value (every viewer would otherwise join at the lowest
    step), and never on an estimate no feedback has measured (a viewer whose client
    sends none would be stepped down to the start value's step for good).
    """

    def __init__(
        self,
        feed: VideoFeed,
        steps: StepChoice | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._top = self._feed = feed
        self._steps = steps
        self._clock = clock
        self._joined_at: float | None = None
        self.step = 0
        self._last_sent: int | None = None
        self.frames_relayed = 0
        self.slots_empty = 0  # slots that sent nothing: no frame, or out of the chain

    async def frame_for(self, index: int) -> np.ndarray:
        raise RuntimeError("a viewer is sent the session's H.264 frames; it must accept H.264")

    async def packet_for(self, index: int, encoder: LipstreamH264Encoder) -> av.Packet[Any]:
        steps = self._steps
        now = self._clock()
        if self._joined_at is None:
            self._joined_at = now
        if (
            steps is not None
            and encoder.estimate_measured  # a viewer that sends no feedback keeps its step
            and now - self._joined_at >= STEPS_AFTER_S
        ):
            budget = encoder.target_bitrate
            step = steps.choose(self.step, budget)
            feed = steps.feed(step, id(self), budget)
            if feed is not self._feed:  # another step: from its next IDR on
                self.step, self._feed, self._last_sent = step, feed, None
        frame = await self._feed.frame(index)
        if encoder.keyframe_wanted:  # the viewer's PLI/FIR (throttled by its encoder)
            encoder.take_keyframe_request()
            self._feed.request_keyframe()
        if frame is None:  # the session skipped this slot, or it has gone: nothing to send
            self.slots_empty += 1
            return payload_packet([], 0)
        last = self._last_sent
        if frame.keyframe or (last is not None and frame.previous == last):
            self._last_sent = frame.index
            self.frames_relayed += 1
            return frame.packet
        self.slots_empty += 1  # out of the chain (joined, or missed a frame): wait for an IDR
        self._feed.request_keyframe()
        return payload_packet([], 0)

    def resync(self) -> None:
        """The viewer lost what it was sent last (an output dropped it): from the next IDR
        on again."""
        self._last_sent = None

    def sent(self, index: int) -> None:
        pass
