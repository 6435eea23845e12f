"""Whether a call's next idle frame goes out from the avatar's shared loop or its encoder.

A call that is not speaking shows the same pictures as every other call of its avatar
(frame ``n`` is loop position ``n % length``), so it can send the shared, pre-encoded
loop instead of encoding its own (``docs/architecture.md`` §16). A decoder can only
change streams at an IDR, so:

* an idle call keeps encoding its own frames until its position is a shared keyframe
  (of the rung its target bitrate wants), then sends the loop from there;
* the first frame with a face (speech) leaves the loop: the call's own encoder makes an
  IDR;
* a keyframe request (PLI/FIR) while sharing is answered by the nearer keyframe: the
  loop's, when this position is one, else the call's own IDR (it rejoins at the next
  shared keyframe);
* a skipped slot while sharing leaves the loop too (the decoder would miss a picture the
  next one refers to);
* a new target bitrate (REMB) moves the call to another rung at that rung's next
  keyframe.

Frames are decided in the order they are sent, one call at a time, on the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import av

from streaming.idle_loops.cache import FrameSource, IdleLoopCache
from streaming.idle_loops.loop import EncodedLoop, LoopKey
from streaming.webrtc.video_encoder import LipstreamH264Encoder

logger = logging.getLogger(__name__)


class IdleSharing:
    """One call's choice between the shared idle loop and its own encoder.

    ``keys`` are the avatar's loops by rung, highest bitrate first (see :func:`rung_keys`).
    """

    def __init__(
        self, loops: IdleLoopCache, keys: Sequence[LoopKey], frames: FrameSource, fps: int
    ) -> None:
        if not keys:
            raise ValueError("idle sharing needs at least one bitrate rung")
        self._loops = loops
        self._keys = tuple(sorted(keys, key=lambda k: k.bitrate, reverse=True))
        self._frames = frames
        self._fps = fps
        self._loop: EncodedLoop | None = None  # the loop being sent, None while encoding
        self._last = -1  # the last frame decided
        self._left_at = -2  # the last frame where the call left the loop (an own IDR)

    @property
    def sharing(self) -> bool:
        """Whether the call is sending the shared loop now."""
        return self._loop is not None

    @property
    def rung_bitrate(self) -> int | None:
        """The bitrate of the loop being sent, None while the call encodes its frames."""
        return None if self._loop is None else self._loop.key.bitrate

    def prepare(self) -> None:
        """Ask for the top rung's loop now (built in the background if it is missing)."""
        self._loops.get(self._keys[0], self._frames)

    def idle(self, index: int, encoder: LipstreamH264Encoder) -> av.Packet[Any] | None:
        """The shared packet for idle frame ``index``, or None: ``encoder`` encodes it
        (asked for an IDR when the call just left the loop)."""
        gap = index != self._last + 1
        self._last = index
        loop = self._loop
        if loop is not None and loop.key.config != encoder.config:
            self._leave(index, encoder)  # the live stream was re-opened (size, NVENC)
            return None
        if loop is None:
            return self._join(index, encoder)
        position = index % loop.length
        if gap or (encoder.keyframe_wanted and not loop.is_keyframe(position)):
            self._leave(index, encoder)
            return None
        wanted = self._rung(encoder)
        if wanted != loop.key:
            other = self._loops.get(wanted, self._frames)
            if other is not None and other.is_keyframe(index % other.length):
                logger.debug("frame %d moves to bitrate %d", index, other.key.bitrate)
                loop = self._loop = other
        if loop.is_keyframe(index % loop.length):
            encoder.take_keyframe_request()  # a shared IDR answers a PLI as well
        return loop.packet(index, self._fps)

    def live(self, index: int, encoder: LipstreamH264Encoder) -> None:
        """Frame ``index`` carries a face: ``encoder`` sends it (an IDR if the call was
        sharing)."""
        self._last = index
        if self._loop is not None:
            self._leave(index, encoder)

    def _join(self, index: int, encoder: LipstreamH264Encoder) -> av.Packet[Any] | None:
        if index <= self._left_at + 1:  # never two IDRs in a row (H.264 7.4.3 idr_pic_id)
            return None
        loop = self._loops.get(self._rung(encoder), self._frames)
        if loop is None or not loop.is_keyframe(index % loop.length):
            return None
        self._loop = loop
        encoder.take_keyframe_request()
        logger.debug("frame %d joins the shared loop (bitrate %d)", index, loop.key.bitrate)
        return loop.packet(index, self._fps)

    def _leave(self, index: int, encoder: LipstreamH264Encoder) -> None:
        logger.debug("frame %d leaves the shared loop", index)
        self._loop = None
        self._left_at = index
        encoder.request_keyframe()

    def _rung(self, encoder: LipstreamH264Encoder) -> LoopKey:
        """The highest rung at or below the call's target bitrate (the lowest if none is)."""
        target = encoder.target_bitrate
        chosen = self._keys[-1]
        for key in reversed(self._keys):
            if key.bitrate <= target:
                chosen = key
        if chosen.config != encoder.config:
            chosen = replace(chosen, config=encoder.config)
        return chosen


def rung_keys(base: LoopKey, rungs: Sequence[float]) -> list[LoopKey]:
    """``base`` at each rung, a fraction of its config's bitrate, highest first."""
    return [replace(base, bitrate=round(base.config.bitrate * r)) for r in sorted(rungs)[::-1]]
