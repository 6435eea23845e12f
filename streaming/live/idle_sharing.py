"""Whether a call's next idle frame goes out from the avatar's shared loop or its encoder.

A call that is not speaking shows the same pictures as every other call of its avatar
playing the same idle clip (frame ``n`` is the clip's loop at the bounce position its
``ClipPlan`` gives, ``docs/design/compositing.md`` §5), so it can send the shared, pre-encoded
loop of that clip instead of encoding its own (§16). A decoder can only change streams
at an IDR, so:

* an idle call keeps encoding its own frames until its position is a shared keyframe
  (of the rung its target bitrate wants), then sends the loop from there;
* each rung has two loops of the same pictures: the **joining** loop, with an IDR every
  ``video.idle_keyframe_interval_s`` (0.48 s) so that a call that stops speaking is back
  on a shared loop soon, and the **steady** loop, with an IDR only every
  ``video.idle_steady_keyframe_interval_s`` (1.92 s). A call on the joining loop moves to
  the steady one at the steady loop's next keyframe and stays there: on the demo avatar
  an IDR is 23 packets and 27 KB against a P-frame's 2 and 1.7 KB, so a listening call
  sends 0.65 of the bytes and 0.70 of the packets it sent on the joining loop alone
  (``docs/design/idle-loops.md`` §16). A call joins whichever of the two has a keyframe where
  it is, the steady one first. Only a call whose link estimate is its own
  (transport-cc feedback, as every browser sends) and at the full rate settles on the
  steady loop; the link says so (``LipstreamH264Encoder.steady_idle``). Below the full
  rate the link is what limits the call, and a call that sends less while it listens
  stops finding out what the link carries: on a 600 kbit/s link the estimate rose to
  950 kbit/s and the answer's first frames overran the link. A caller that sends only
  REMB (aiortc) keeps to the joining loop: its estimate starts from what it received in
  its first 5 s and then swings with what it receives, and the steady loop's rare
  keyframes walked it down until the call stepped down the quality ladder;
* the first frame with a face (speech) leaves the loop: the call's own encoder makes an
  IDR;
* a keyframe request (PLI/FIR) while sharing is answered by the nearer keyframe: the
  loop's, when this position is one (the call goes back to the joining loop for it if
  that one has it), else the call's own IDR (it rejoins at the next shared keyframe);
* a skipped slot while sharing leaves the loop too (the decoder would miss a picture the
  next one refers to);
* a new target bitrate (the call's link) moves the call to another rung at that rung's
  next keyframe; rungs are fractions of the ladder step's bitrate, and a rung is taken
  only if its loop, as built, needs no more than the target on average (a listening
  call on a slow link must fit it, keyframes included: ``docs/design/link.md`` §19);
  when no rung fits, the call encodes its own frames at the target;
* a step of the quality ladder is another config: the call leaves the loop (its own
  encoder makes the IDR at the new size) and joins the step's loop at its next
  keyframe; at a step with a lower frame rate the call does not share (a loop's
  P-frames refer to every frame before them, and that step sends only some);
* another idle clip leaves the loop (the call's own encoder makes an IDR) and joins the
  new clip's loop at its next keyframe.

Frames are decided in the order they are sent, one call at a time, on the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import av

from compositor.clips import Clip
from streaming.idle_loops.cache import FrameSource, IdleLoopCache
from streaming.idle_loops.loop import EncodedLoop, LoopKey
from streaming.webrtc.video_encoder import LipstreamH264Encoder

logger = logging.getLogger(__name__)


class IdleSharing:
    """One call's choice between the shared idle loop and its own encoder.

    ``keys`` are the avatar's loops by rung, highest bitrate first (see :func:`rung_keys`),
    at the full picture; at another ladder step the rungs are the same fractions of that
    step's bitrate. ``position(n)`` the clip frame ``n`` plays and its bounce position
    there (the call's ``ClipPlan.loop_position``; default: every frame, position ``n``).
    ``steady_every`` is the steady loops' keyframe interval in frames (module doc); None,
    or not more than the keys' own interval, sends the joining loops only.
    """

    def __init__(
        self,
        loops: IdleLoopCache,
        keys: Sequence[LoopKey],
        frames: FrameSource,
        fps: int,
        position: Callable[[int], tuple[Clip, int]] | None = None,
        steady_every: int | None = None,
    ) -> None:
        if not keys:
            raise ValueError("idle sharing needs at least one bitrate rung")
        self._loops = loops
        self._keys = tuple(sorted(keys, key=lambda k: k.bitrate, reverse=True))
        top = self._keys[0]
        self._fractions = tuple(k.bitrate / top.config.bitrate for k in self._keys)
        self._frames = frames
        self._fps = fps
        self._position = position
        joining = top.keyframe_every
        self._joining_every = joining
        self._steady_every = steady_every if steady_every and steady_every > joining else None
        self._loop: EncodedLoop | None = None  # the loop being sent, None while encoding
        self._last = -1  # the last frame decided
        self._left_at = -2  # the last frame where the call left the loop (an own IDR)
        self._idr_at = -2  # the last frame that was a loop's IDR

    @property
    def sharing(self) -> bool:
        """Whether the call is sending the shared loop now."""
        return self._loop is not None

    @property
    def rung_bitrate(self) -> int | None:
        """The bitrate of the loop being sent, None while the call encodes its frames."""
        return None if self._loop is None else self._loop.key.bitrate

    @property
    def keyframe_every(self) -> int | None:
        """The keyframe interval of the loop being sent (joining or steady), None while
        the call encodes its frames."""
        return None if self._loop is None else self._loop.key.keyframe_every

    def prepare(self, clip: Clip | None = None) -> None:
        """Ask for the top rung's loop of ``clip`` (default: the one the call starts
        with) now, built in the background if it is missing."""
        self._loops.get(self._for(self._keys[0], clip), self._frames)

    def idle(self, index: int, encoder: LipstreamH264Encoder) -> av.Packet[Any] | None:
        """The shared packet for idle frame ``index``, or None: ``encoder`` encodes it
        (asked for an IDR when the call just left the loop)."""
        gap = index != self._last + 1
        self._last = index
        clip, position = self._where(index)
        loop = self._loop
        if loop is not None and (loop.key.config != encoder.config or not _plays(loop, clip)):
            self._leave(index, encoder)  # re-opened (size, ladder step, NVENC) or another clip
            return None
        if loop is None:
            return self._join(index, clip, position, encoder)
        if encoder.keyframe_wanted and not loop.is_keyframe(position % loop.length):
            joining = self._keyframe_of(self._joining(loop.key), position)
            if joining is not None:
                loop = self._loop = joining  # its IDR answers the request
        if gap or (encoder.keyframe_wanted and not loop.is_keyframe(position % loop.length)):
            self._leave(index, encoder)
            return None
        wanted = self._rung(encoder, clip)
        if wanted is None:  # no loop fits the target any more
            self._leave(index, encoder)
            return None
        movable = index > self._idr_at + 1  # never two IDRs in a row, as in _join
        if movable and wanted != self._joining(loop.key):
            other = self._keyframe_of(wanted, position)
            if other is not None:
                logger.debug("frame %d moves to bitrate %d", index, other.key.bitrate)
                loop = self._loop = other
        settle = self._steady(wanted, encoder) or wanted  # the loop the call settles on
        if movable and loop.key != settle and self._joining(loop.key) == wanted:
            other = self._keyframe_of(settle, position)
            if other is not None:
                loop = self._loop = other
        if loop.is_keyframe(position % loop.length):
            self._idr_at = index
            encoder.take_keyframe_request()  # a shared IDR answers a PLI as well
        return loop.packet(index, self._fps, position)

    def live(self, index: int, encoder: LipstreamH264Encoder) -> None:
        """Frame ``index`` carries a face: ``encoder`` sends it (an IDR if the call was
        sharing)."""
        self._last = index
        if self._loop is not None:
            self._leave(index, encoder)

    def _where(self, index: int) -> tuple[Clip | None, int]:
        return (None, index) if self._position is None else self._position(index)

    def _join(
        self, index: int, clip: Clip | None, position: int, encoder: LipstreamH264Encoder
    ) -> av.Packet[Any] | None:
        if index <= self._left_at + 1:  # never two IDRs in a row (H.264 7.4.3 idr_pic_id)
            return None
        key = self._rung(encoder, clip)
        if key is None:
            return None
        steady = self._steady(key, encoder)
        loop = None if steady is None else self._keyframe_of(steady, position)
        if loop is None:
            loop = self._keyframe_of(key, position)
        if loop is None:
            return None
        self._loop = loop
        self._idr_at = index
        encoder.take_keyframe_request()
        logger.debug("frame %d joins the shared loop (bitrate %d)", index, loop.key.bitrate)
        return loop.packet(index, self._fps, position)

    def _leave(self, index: int, encoder: LipstreamH264Encoder) -> None:
        logger.debug("frame %d leaves the shared loop", index)
        self._loop = None
        self._left_at = index
        encoder.request_keyframe()

    def _keyframe_of(self, key: LoopKey, position: int) -> EncodedLoop | None:
        """``key``'s loop if it is built and has a keyframe at ``position`` (asked for,
        and so built in the background, either way)."""
        loop = self._loops.get(key, self._frames)
        return loop if loop is not None and loop.is_keyframe(position % loop.length) else None

    def _joining(self, key: LoopKey) -> LoopKey:
        return replace(key, keyframe_every=self._joining_every)

    def _steady(self, key: LoopKey, encoder: LipstreamH264Encoder) -> LoopKey | None:
        """``key``'s steady twin, None when the call may not settle on one."""
        every = self._steady_every
        if every is None or not encoder.steady_idle:
            return None
        return replace(key, keyframe_every=every)

    def _rung(self, encoder: LipstreamH264Encoder, clip: Clip | None) -> LoopKey | None:
        """The highest rung of ``clip``'s loop at the encoder's step that fits its target:
        at or below it, and, once built, no more than it on average. None when none
        does, or when the step sends only some frames (module doc). The loop judged is
        the one the call settles on, the steady one once it is built (the joining loop's
        extra keyframes last only until the steady loop's next keyframe)."""
        config, target = encoder.config, encoder.target_bitrate
        if not encoder.sends_every_frame:
            return None
        top = self._keys[0]
        for fraction in self._fractions:
            bitrate = round(config.bitrate * fraction)
            if bitrate > target:
                continue
            key = self._for(replace(top, config=config, bitrate=bitrate), clip)
            steady = self._steady(key, encoder)
            built = (None if steady is None else self._loops.peek(steady)) or self._loops.peek(key)
            if built is None or fits(built, target):
                return key
        return None

    @staticmethod
    def _for(key: LoopKey, clip: Clip | None) -> LoopKey:
        return key if clip is None else key.for_clip(clip)


#: A loop fits a call when its largest frame leaves within this much of the call's
#: target (five frame times at 25 fps), and its average within the target.
LOOP_PEAK_S = 0.2


def fits(loop: EncodedLoop, target_bps: int) -> bool:
    """Whether a call aiming at ``target_bps`` can send ``loop`` (module doc)."""
    return loop.bitrate_bps <= target_bps and 8 * loop.max_frame_bytes <= LOOP_PEAK_S * target_bps


def _plays(loop: EncodedLoop, clip: Clip | None) -> bool:
    """Whether ``loop`` is the loop of ``clip`` (None: the avatar's only loop)."""
    return clip is None or (loop.key.clip_start, loop.key.clip_stop) == clip.range


def rung_keys(base: LoopKey, rungs: Sequence[float]) -> list[LoopKey]:
    """``base`` at each rung, a fraction of its config's bitrate, highest first."""
    return [replace(base, bitrate=round(base.config.bitrate * r)) for r in sorted(rungs)[::-1]]
