"""Render tasks: each frame the sequencer wants inferred, prepared, inferred and composed.

One task per frame (``docs/design/threads.md`` §7): the avatar crop and the model's visual
input are prepared on the executor, the inference core runs the frame in a batch with
other sessions' frames by its deadline (its send time less a little compositing time,
§8), and the face is composed into the background on the executor. The composed frame
waits in the :class:`~streaming.live.send_buffers.SendBuffers` for its slot; the video
track's source, :meth:`FrameRenderer.frame_for`, sends the idle avatar frame for a slot
that has none. At most :data:`MAX_FRAMES_IN_FLIGHT` frames are in flight.

A frame not sent with its face is counted in ``SessionStats.frames_dropped`` by reason:
``overload`` (too many in flight, never started), ``late`` (composed after its slot was
sent, or its features came after its inference deadline, so it was not started),
``not_ready`` (its slot came while it was in flight), or the class name of the
:class:`~inference_core.exceptions.InferenceError` that stopped it (a missed deadline, a
full queue, a core shutting down). Each frame counts once: one counted ``not_ready`` is
not counted again when it then fails or comes too late.

Any other error in a render task (the crop, the paste, a broken frame) is a fault, not
a drop to live with: every task's exception is retrieved, counted once (``error``) and
reported as the ``render`` stage failing, which ends the call (``docs/design/threads.md``
§7).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import av
import numpy as np

from compositor.crossfade import crossfade, fade_weight
from compositor.sequencer import FrameStep
from compositor.yuv import Frame
from inference_core.exceptions import InferenceError
from inference_core.features.stream import FrameAudio
from streaming.frame_pipeline import PreparedFrame
from streaming.live.avatar import CallAvatar
from streaming.live.idle_sharing import IdleSharing
from streaming.live.reporting import FrameSending, FrameStages, SessionStats
from streaming.live.send_buffers import SendBuffers
from streaming.live.workers import Offload
from streaming.webrtc.pacing import SessionClock
from streaming.webrtc.tracks import VIDEO_CLOCK, video_frame
from streaming.webrtc.video_encoder import LipstreamH264Encoder, payload_packet

logger = logging.getLogger(__name__)

MAX_FRAMES_IN_FLIGHT = 8
# Leave the compositing a little time before the frame is sent.
COMPOSE_S = 0.008


@dataclass(frozen=True)
class _Ahead:
    """A frame whose encode started before its slot (:meth:`FrameRenderer.packet_for`),
    or whose shared packet was picked then."""

    index: int
    packet: asyncio.Future[av.Packet[Any]] | av.Packet[Any]
    lip_synced: bool
    ready_at: float | None


@dataclass(frozen=True)
class Started:
    """A frame cropped and its model input built (:meth:`FrameRenderer.start`), and how
    long that took."""

    prepared: PreparedFrame
    prepare_s: float


class FrameRenderer:
    """Runs one session's render tasks and gives its video track each frame.

    ``on_frame_ready(stages)`` is called for every composed frame kept for its slot, with
    the time from its audio being complete to it being composed, split by stage
    (:class:`~streaming.live.reporting.FrameStages`, on ``clock``, the monotonic clock the
    session clock also uses); ``on_frame_sent(sending)`` for every such frame once
    encoded at its slot (:meth:`packet_for`). ``on_failure(stage, exc)`` hears of a
    render task that failed (module doc).
    """

    def __init__(
        self,
        session_id: str,
        avatar: CallAvatar,
        executor: Offload,
        schedule: SessionClock,
        buffers: SendBuffers,
        stats: SessionStats,
        *,
        fps: int,
        lookahead_ms: float,
        on_failure: Callable[[str, BaseException], None],
        on_frame_ready: Callable[[FrameStages], None] | None = None,
        on_frame_sent: Callable[[FrameSending], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._session_id = session_id
        # The avatars by first frame shown, oldest first: the call's one, or during a
        # switch the outgoing and the incoming one (``switch``); swapped whole, since a
        # timeline job adds one while the loop reads them.
        self._avatars: tuple[tuple[int, CallAvatar], ...] = ((0, avatar),)
        self._fade: tuple[int, int] = (0, 0)  # the last switch: first frame, dissolve frames
        self._executor = executor
        self._schedule = schedule
        self._buffers = buffers
        self._stats = stats
        self._fps = fps
        self._lookahead_s = lookahead_ms / 1000
        self._on_failure = on_failure
        self._on_frame_ready = on_frame_ready
        self._on_frame_sent = on_frame_sent
        self._ready_at: dict[int, float] = {}  # frames kept for their slot: when ready
        self._clock = clock
        self._pending: dict[int, asyncio.Task[None]] = {}
        self._not_ready: set[int] = set()  # in flight, already counted not_ready
        # Encoding ahead of the slot (packet_for): the sender's encoder once known, the
        # last slot handed out, and the next frame's encode if it started early.
        self._encoder: LipstreamH264Encoder | None = None
        self._last_sent = -1
        self._ahead: _Ahead | None = None
        # The last frame the speech gate has decided on (every later one may still be
        # submitted), as the timeline tells it (decided_until).
        self._decided = -1

    @property
    def in_flight(self) -> Collection[asyncio.Future[Any]]:
        """The render tasks and the encode ahead not finished yet (the session awaits
        them when it closes)."""
        ahead = self._ahead
        if ahead is None or isinstance(ahead.packet, av.Packet):
            return list(self._pending.values())
        return [*self._pending.values(), ahead.packet]

    @property
    def avatar(self) -> CallAvatar:
        """The avatar of the frames being decided now (the incoming one during a switch)."""
        return self._avatars[-1][1]

    @property
    def sharing(self) -> IdleSharing | None:
        """The current avatar's choice of shared idle loop (None: the call encodes)."""
        return self.avatar.sharing

    def switch(self, first: int, avatar: CallAvatar, fade_frames: int) -> None:
        """Frames from ``first`` on show ``avatar``, dissolving from the current one over
        ``fade_frames`` frames (``docs/design/switching.md`` §18). Called by the timeline's job
        before it decides frame ``first``; the outgoing avatar stays for the frames before
        it and the dissolve, until :meth:`retire`."""
        self._avatars = (self._avatars[-1], (first, avatar))
        self._fade = (first, fade_frames)

    def retire(self) -> CallAvatar | None:
        """Forget the outgoing avatar once the dissolve was sent; returns it (None if
        there is none). Its frames still in flight keep their avatar until they end."""
        if len(self._avatars) < 2:
            return None
        outgoing = self._avatars[0][1]
        self._avatars = self._avatars[-1:]
        return outgoing

    def in_flight_before(self, index: int) -> list[asyncio.Task[None]]:
        """Render tasks of frames before ``index`` not finished yet."""
        return [task for i, task in self._pending.items() if i < index]

    def _avatar(self, index: int) -> CallAvatar:
        avatars = self._avatars
        for first, avatar in reversed(avatars):
            if index >= first:
                return avatar
        return avatars[0][1]

    def _mixing(self, index: int) -> bool:
        """Whether frame ``index`` mixes two avatars (the switch frame counts even
        without a dissolve: the stream changes pictures there)."""
        first, frames = self._fade
        return len(self._avatars) > 1 and first <= index < first + max(frames, 1)

    def decided_until(self, index: int) -> None:
        """The speech gate has decided every frame up to ``index`` (to infer, or idle)."""
        self._decided = max(self._decided, index)

    def start(self, step: FrameStep, item: FrameAudio) -> Started | None:
        """Off the loop, in the job that completed the frame's features: its crop and model
        input, or None when it can no longer make its inference deadline (no work for
        nothing). One thread hand-off less per frame than a job of its own."""
        send_at = self._schedule.due(item.index / self._fps)
        begun = self._clock()
        if begun > send_at - COMPOSE_S:
            return None
        prepared = self._avatar(step.output_index).pipeline.prepare(step)
        return Started(prepared, self._clock() - begun)

    def submit(self, step: FrameStep, item: FrameAudio, started: Started | None) -> None:
        """Render frame ``item.index`` (``step`` says on which avatar frame, how much),
        started by :meth:`start`: inference, then compositing."""
        if started is None:  # its features came after its deadline
            self._stats.drop("late")
            return
        if len(self._pending) >= MAX_FRAMES_IN_FLIGHT:
            self._stats.drop("overload")
            return
        task = asyncio.create_task(self._render(item, started), name=f"frame-{item.index}")
        self._pending[item.index] = task
        task.add_done_callback(functools.partial(self._forget, item.index))

    def cancel(self) -> None:
        """Cancel every frame in flight (an interrupt, or the session closing)."""
        for task in self._pending.values():
            task.cancel()

    def _forget(self, index: int, task: asyncio.Task[None]) -> None:
        self._pending.pop(index, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._drop_in_flight(index, "error")
            self._on_failure("render", exc)
        self._not_ready.discard(index)

    def _drop_in_flight(self, index: int, reason: str) -> None:
        """Count a frame in flight that will not be shown, once: one already counted
        ``not_ready`` (its slot came first) is not counted again when it then fails."""
        if index not in self._not_ready:
            self._stats.drop(reason)

    async def _render(self, item: FrameAudio, started: Started) -> None:
        """Infer (with the frame's deadline) and compose one started frame."""
        index = item.index
        start = self._schedule.started()
        send_at = self._schedule.due(index / self._fps)
        audio_complete = start + index / self._fps + self._lookahead_s
        avatar = self._avatar(index)
        prepared = started.prepared
        prepared_at = self._clock()
        # The crop ran at the end of the features job; the rest of the way here is the
        # features' stage (the job, its hand-back, this task's start).
        begun = prepared_at - started.prepare_s
        try:
            future = avatar.model.submit(
                prepared.visual,  # type: ignore[arg-type]
                item.features,
                deadline=send_at - COMPOSE_S,
                session_id=self._session_id,
            )
            face = await future
            inferred_at = self._clock()
            frame = await self._executor.run(self._compose, avatar, prepared, face, index)
        except InferenceError as exc:
            self._drop_in_flight(index, type(exc).__name__)
            return
        if not self._buffers.put_frame(index, frame):
            self._drop_in_flight(index, "late")
            return
        self._stats.frames_inferred += 1
        composed_at = self._clock()
        self._ready_at[index] = composed_at
        self._encode_ahead(index)  # composed after the frame before it went out
        stages = FrameStages(
            features=begun - audio_complete,
            prepare=prepared_at - begun,
            inference=inferred_at - prepared_at,
            compose=composed_at - inferred_at,
        )
        self._stats.record_frame(stages)
        if self._on_frame_ready is not None:
            self._on_frame_ready(stages)

    async def frame_for(self, index: int) -> np.ndarray:
        """The frame to send for slot ``index``: composed if ready, else the idle frame."""
        frame, _ = self._take(index)
        self._stats.frames_encoded += 1  # by aiortc's encoder (a VP8 call)
        if frame is not None:
            return frame
        return await self._executor.run(self._idle_frame, index)

    async def packet_for(self, index: int, encoder: LipstreamH264Encoder) -> av.Packet[Any]:
        """Slot ``index``'s frame (as :meth:`frame_for`) encoded by ``encoder`` into RTP
        payloads: the idle frame's fetch, the encode and the packetising are one job off
        the loop, so a frame costs the loop one hand-off (``docs/design/webrtc.md`` §6).

        The next frame is encoded ahead, as soon as this one is out, when it is known
        already: composed, or decided idle by the speech gate. Then its slot only hands
        the packet over, and the frame leaves at its slot instead of an encode later. An
        idle frame may come from the avatar's shared loop instead (:meth:`_commit`). A
        frame encoded ahead is always sent (a skipped slot sends it late instead: the
        decoder needs every frame the encoder made). A lip-synced frame's wait for its
        slot and the time from its slot to its payloads are recorded
        (:class:`~streaming.live.reporting.FrameSending`)."""
        self._encoder = encoder
        slot_at = self._clock()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.index <= index:  # earlier only if slots were skipped
            made = ahead.packet
            sent, lip_synced, ready_at = ahead.index, ahead.lip_synced, ahead.ready_at
        else:
            frame, ready_at = self._take(index)
            lip_synced = frame is not None and ready_at is not None
            made = self._commit(encoder, frame, index)
            sent = index
        packet = made if isinstance(made, av.Packet) else await made
        self._last_sent = index  # after a skip, ahead again from the slot asked for
        if lip_synced and ready_at is not None:
            sending = FrameSending(slot_at - ready_at, self._clock() - slot_at)
            self._stats.record_sending(sending)
            if self._on_frame_sent is not None:
                self._on_frame_sent(sending)
        if sent < index:
            logger.debug("slot %d sends frame %d, encoded ahead before the skip", index, sent)
        self._encode_ahead(index + 1)
        return packet

    def _encode_ahead(self, index: int) -> None:
        """Start encoding frame ``index`` now if it is the next to send and known."""
        encoder = self._encoder
        if encoder is None or self._ahead is not None or index != self._last_sent + 1:
            return
        if index in self._ready_at:  # composed
            frame, ready_at = self._take(index)
        elif index <= self._decided and index not in self._pending:  # idle for sure
            frame, ready_at = None, None
        else:  # in flight, or the speech gate has not got to it: decide at its slot
            return
        lip_synced = frame is not None and ready_at is not None
        self._ahead = _Ahead(index, self._commit(encoder, frame, index), lip_synced, ready_at)

    def _commit(
        self, encoder: LipstreamH264Encoder, frame: np.ndarray | None, index: int
    ) -> av.Packet[Any] | asyncio.Future[av.Packet[Any]]:
        """Frame ``index`` is the next to go out: an idle frame (``frame`` None) as the
        shared loop's packet when the call can share it, else its encode on the executor.
        Called once per frame sent, in order. A frame a ladder step with a lower frame
        rate leaves out is an empty packet: nothing is sent (``docs/design/link.md`` §19)."""
        if not encoder.sends(index):
            self._stats.frames_left_out += 1
            return payload_packet([], index * VIDEO_CLOCK // self._fps)
        sharing = self._avatar(index).sharing
        if self._mixing(index):
            # A dissolve is the call's own picture: every avatar's loop is left (the
            # outgoing one asks this encoder for an IDR) and the incoming one's waits.
            for _, avatar in self._avatars:
                if avatar.sharing is not None:
                    avatar.sharing.live(index, encoder)
        elif sharing is not None:
            if frame is not None:
                sharing.live(index, encoder)
            elif (packet := sharing.idle(index, encoder)) is not None:
                self._stats.frames_shared += 1
                return packet
        self._stats.frames_encoded += 1
        return self._executor.run(self._encode, encoder, frame, index)

    def _take(self, index: int) -> tuple[np.ndarray | None, float | None]:
        """The composed frame for slot ``index`` and when it became ready, if it did (a
        frame still in flight for the slot is counted ``not_ready``). Earlier slots'
        ready times go too: a skipped slot is never taken."""
        ready = self._ready_at
        for earlier in [i for i in ready if i < index]:
            del ready[earlier]
        ready_at = ready.pop(index, None)
        frame = self._buffers.take_frame(index)
        if frame is None and index in self._pending:
            self._stats.drop("not_ready")
            self._not_ready.add(index)
        return frame, ready_at

    def _idle_frame(self, index: int) -> np.ndarray:
        return self._faded(index, _background(self._avatar(index), index))

    def _compose(
        self, avatar: CallAvatar, prepared: PreparedFrame, face: np.ndarray, index: int
    ) -> Frame:
        return self._faded(index, avatar.pipeline.compose(prepared, face))

    def _faded(self, index: int, frame: Frame) -> Frame:
        """``frame`` of the incoming avatar, mixed with the outgoing one's picture of the
        same slot while a switch dissolves (off the loop)."""
        if not self._mixing(index):
            return frame
        first, frames = self._fade
        outgoing = _background(self._avatars[0][1], index)
        return crossfade(outgoing, frame, fade_weight(index - first, frames))

    def _encode(
        self, encoder: LipstreamH264Encoder, frame: np.ndarray | None, index: int
    ) -> av.Packet[Any]:
        image = self._idle_frame(index) if frame is None else frame
        return encoder.encode_packet(video_frame(image, index, self._fps))


def _background(avatar: CallAvatar, index: int) -> Frame:
    """``avatar``'s background frame for output frame ``index`` (its idle picture)."""
    return avatar.frames.get(avatar.plan.at(index))
