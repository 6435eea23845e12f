"""One live call: caller audio in, the avatar lip-syncing it out, on one session clock.

    microphone track ──▶ AudioMixer ◀── pushed audio / text-to-speech
                             │ 20 ms chunks at 48 kHz (the session timeline)
               ┌─────────────┴──────────────┐
      outbound audio (delayed)     16 kHz → AudioFeatureStream → FrameAudio i
                                                   │ sequencer: infer or idle
                                                   ▼
                      prepare → inference core (batched, deadline) → compose
                                                   │
                      AvatarVideoTrack sends frame i at start + delay + i/fps

``delay`` = the model's lookahead + one 20 ms tick + ``pipeline_margin_ms``: by then a
frame's audio is complete and it has been computed, or it is shown idle (never late).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError

from compositor.background_cache import AvatarFrames
from compositor.sequencer import FrameSequencer, FrameStep, bounce_index
from config.settings import Settings
from inference_core.exceptions import InferenceError
from inference_core.features.encoder import AudioEncoder
from inference_core.features.stream import AudioFeatureStream, FrameAudio, lookahead_ms
from inference_core.serving.handle import ModelHandle
from streaming.audio_in.resample import MonoResampler, resample_mono
from streaming.frame_pipeline import FramePipeline
from streaming.live.mixer import AudioMixer
from streaming.live.reporting import SessionReport, sends_track, target_bitrate_bps
from streaming.live.snapshot import BufferedMedia, SessionSnapshot
from streaming.live.watchdogs import (
    PEER_CHECK_S,
    PEER_SILENCE_S,
    AudioActivity,
    connect_timed_out,
    peer_silent,
)
from streaming.webrtc.compat import close_peer_connection
from streaming.webrtc.tracks import (
    AUDIO_CHUNK_S,
    OUT_RATE,
    SILENCE,
    AvatarAudioTrack,
    AvatarVideoTrack,
    OpusChunkEncoder,
    SessionClock,
    stamped,
)

logger = logging.getLogger(__name__)

FEATURE_RATE = 16_000
MAX_FRAMES_IN_FLIGHT = 8
STALE_SLOTS = 50  # slots kept past their send time before a buffer drops them

__all__ = ["PEER_CHECK_S", "PEER_SILENCE_S", "Session"]


class Session:
    """Owns a peer connection, its tracks and tasks, and a held model.

    ``on_closed`` is called once the session ended; ``on_frame_ready(delay_s)`` for every
    inferred frame, with the time from its audio being complete to it being composed.
    """

    def __init__(
        self,
        session_id: str,
        pc: RTCPeerConnection,
        model: ModelHandle,
        frames: AvatarFrames,
        encoder: AudioEncoder | None,
        settings: Settings,
        executor: Executor,
        *,
        remote: str | None = None,
        on_closed: Callable[[Session], None] | None = None,
        on_frame_ready: Callable[[float], None] | None = None,
    ) -> None:
        package = model.package
        spec = package.manifest.adapter
        self.session_id = session_id
        self.avatar_id = package.avatar_id
        self.remote = remote
        self.pc = pc
        self.model = model
        self.frames = frames
        self.settings = settings
        self.fps = package.manifest.fps
        self.lookahead_ms = lookahead_ms(
            settings.audio.right_context, self.fps, kind=spec.audio_feature
        )
        delay_ms = self.lookahead_ms + AUDIO_CHUNK_S * 1000 + settings.session.pipeline_margin_ms
        self.delay_s = delay_ms / 1000
        self._report = SessionReport(
            session_id,
            self.avatar_id,
            remote,
            delay_s=self.delay_s,
            lookahead_ms=self.lookahead_ms,
            fps=self.fps,
        )
        self.stats = self._report.stats
        self.created_at = self._report.created_at
        self.state = "new"
        self._executor = executor
        self._on_closed = on_closed
        self._on_frame_ready = on_frame_ready
        self._pipeline = FramePipeline(package, frames)
        self._features = AudioFeatureStream(
            encoder,
            kind=spec.audio_feature,
            fps=self.fps,
            right_context=settings.audio.right_context,
        )
        self._sequencer = FrameSequencer(
            package.frame_count,
            threshold_db=settings.audio.vad_threshold_db,
            hangover_frames=settings.audio.hangover_frames,
            blend_frames=settings.audio.blend_frames,
        )
        self._mixer = AudioMixer(max_pushed_s=settings.session.max_queued_audio_s)
        self._to_features = MonoResampler(OUT_RATE, FEATURE_RATE)
        self._opus = OpusChunkEncoder()
        self._clock = SessionClock(self.delay_s, self._on_clock_start)
        self.video = AvatarVideoTrack(self._clock, self.fps, self._frame_for)
        self.audio = AvatarAudioTrack(self._clock, self._chunk_for)
        self._ready: dict[int, np.ndarray] = {}  # composed frames waiting to be sent
        self._pending: dict[int, asyncio.Task[None]] = {}
        self._outbound: dict[int, av.Packet[Any]] = {}  # Opus chunks waiting to be sent
        self._interrupts = 0
        self._chunks_made = 0
        self._silent_until = -1  # frames up to here were cut by an interrupt
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.end_reason: str | None = None
        self._activity = AudioActivity()

    @property
    def last_audio_at(self) -> float:
        """When the session last had audio (``time.monotonic()``): pushed or spoken audio,
        or caller audio above ``audio.vad_threshold_db``."""
        return self._activity.last_audio_at

    # -- inputs ---------------------------------------------------------------------

    def add_remote_track(self, track: MediaStreamTrack) -> None:
        """Consume a track the caller sends (audio feeds the mixer; anything else is drained)."""
        name = f"inbound-{track.kind}-{self.session_id[:8]}"
        self._spawn(self._consume(track), name)

    def watch_connection(self, timeout_s: float) -> None:
        """End the session if ICE has not connected within ``timeout_s``, or once the
        connected peer has sent nothing for ``PEER_SILENCE_S``."""

        async def ice_watchdog() -> None:
            if await connect_timed_out(self.pc, timeout_s):
                logger.info(
                    "session not connected after %.0f s: session=%s state=%s",
                    timeout_s,
                    self.session_id,
                    self.pc.connectionState,
                )
                await self.close("ICE timeout")

        async def peer_watchdog() -> None:
            quiet_s = await peer_silent(self.pc)
            logger.info("nothing from the peer for %.0f s: session=%s", quiet_s, self.session_id)
            await self.close("peer silent")

        self._spawn(ice_watchdog(), f"ice-watchdog-{self.session_id[:8]}")
        self._spawn(peer_watchdog(), f"peer-watchdog-{self.session_id[:8]}")

    def watch_idle(self, timeout_s: float) -> None:
        """End the session ("idle") after ``timeout_s`` with no audio; 0 means never.

        Audio is pushed or spoken audio, or caller audio above ``audio.vad_threshold_db``
        (see ``last_audio_at``).
        """
        if timeout_s <= 0:
            return

        async def watchdog() -> None:
            await self._activity.idle(timeout_s)
            logger.info("session idle for %g s: session=%s", timeout_s, self.session_id)
            await self.close("idle")

        self._spawn(watchdog(), f"idle-watchdog-{self.session_id[:8]}")

    def preload_frames(self) -> None:
        """Decode the avatar's background frames into the cache while ICE connects."""

        async def preload() -> None:
            loop = asyncio.get_running_loop()
            for index in range(len(self.frames)):
                await loop.run_in_executor(self._executor, self.frames.get, index)

        self._spawn(preload(), f"preload-{self.session_id[:8]}")

    def push_audio(self, samples_16k: np.ndarray) -> float:
        """Queue 16 kHz mono audio to be spoken; returns the seconds now queued."""
        queued = self._mixer.push(resample_mono(samples_16k, FEATURE_RATE, OUT_RATE))
        self._activity.heard()
        return queued

    def interrupt(self) -> float:
        """Drop queued audio and frames: the avatar is idle from the next frame on.

        Returns the seconds of queued audio dropped.
        """
        dropped = self._mixer.clear_pushed()
        # Frames whose features may hold the dropped audio are forced silent.
        frame_s = 1.0 / self.fps
        audio_now = self._chunks_made * AUDIO_CHUNK_S
        self._silent_until = int((audio_now + self.lookahead_ms / 1000) / frame_s) + 1
        self._sequencer.reset()
        for task in self._pending.values():
            task.cancel()
        self._ready.clear()
        self._interrupts += 1
        # A fresh encoder: the old one holds the last speech in its look-ahead and would
        # put it into the next packet it makes, heard a session delay from now.
        self._opus = OpusChunkEncoder()
        for index in self._outbound:  # what the caller has not heard yet goes quiet
            self._outbound[index] = stamped(SILENCE, index)
        logger.info(
            "session interrupted: session=%s dropped_audio_s=%.2f", self.session_id, dropped
        )
        return dropped

    @property
    def queued_audio_s(self) -> float:
        return self._mixer.pushed_seconds

    # -- timeline -------------------------------------------------------------------

    def _on_clock_start(self, start: float) -> None:
        self.state = "streaming"
        self._spawn(self._run_timeline(start), f"timeline-{self.session_id[:8]}")
        logger.info(
            "session media started: session=%s avatar=%s delay_ms=%.0f lookahead_ms=%.1f",
            self.session_id,
            self.avatar_id,
            self.delay_s * 1000,
            self.lookahead_ms,
        )

    async def _run_timeline(self, start: float) -> None:
        """Make one 20 ms chunk per tick (at the end of its interval) and its features."""
        loop = asyncio.get_running_loop()
        while True:
            due = start + (self._chunks_made + 1) * AUDIO_CHUNK_S
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            chunk = self._mixer.next_chunk()
            index = self._chunks_made
            self._chunks_made += 1
            interrupts = self._interrupts
            packet, ready = await loop.run_in_executor(
                self._executor, self._process_chunk, self._opus, chunk, index
            )
            # An interrupt while the chunk was being encoded silences it too.
            self._outbound[index] = (
                packet if interrupts == self._interrupts else stamped(SILENCE, index)
            )
            self._prune(index)
            for item in ready:
                self._on_features(item)

    def _process_chunk(
        self, opus: OpusChunkEncoder, chunk: np.ndarray, index: int
    ) -> tuple[av.Packet[Any], list[FrameAudio]]:
        """Off the loop: the chunk's Opus packet, and the features it completes (16 kHz)."""
        packet = opus.encode(chunk, index)
        return packet, self._features.push(self._to_features.push(chunk))

    def _prune(self, chunk_index: int) -> None:
        """Bound the send buffers even if a track is never pulled (not negotiated)."""
        keep_chunks = round(self.delay_s / AUDIO_CHUNK_S) + STALE_SLOTS
        oldest_chunk = chunk_index - keep_chunks
        for stale in [i for i in self._outbound if i < oldest_chunk]:
            del self._outbound[stale]
        oldest_frame = int(oldest_chunk * AUDIO_CHUNK_S * self.fps)
        for stale in [i for i in self._ready if i < oldest_frame]:
            del self._ready[stale]

    def _on_features(self, item: FrameAudio) -> None:
        level = item.level_db if item.index > self._silent_until else -120.0
        if level >= self.settings.audio.vad_threshold_db:
            self._activity.heard()
        step = self._sequencer.step(level)
        if not step.infer:
            return  # the video track shows the raw frame itself
        if len(self._pending) >= MAX_FRAMES_IN_FLIGHT:
            self.stats.drop("overload")
            return
        task = asyncio.create_task(self._render(step, item), name=f"frame-{item.index}")
        self._pending[item.index] = task
        task.add_done_callback(functools.partial(self._forget_pending, item.index))

    def _forget_pending(self, index: int, _task: asyncio.Task[None]) -> None:
        self._pending.pop(index, None)

    async def _render(self, step: FrameStep, item: FrameAudio) -> None:
        """Prepare, infer (with the frame's deadline) and compose one frame."""
        loop = asyncio.get_running_loop()
        index = item.index
        start = self._clock.started()
        send_at = self._clock.due(index / self.fps)
        audio_complete = start + index / self.fps + self.lookahead_ms / 1000
        try:
            prepared = await loop.run_in_executor(self._executor, self._pipeline.prepare, step)
            # Leave the compositing a little time before the frame is sent.
            deadline = send_at - 0.008
            future = self.model.submit(
                prepared.visual,  # type: ignore[arg-type]
                item.features,
                deadline=deadline,
                session_id=self.session_id,
            )
            face = await future
            frame = await loop.run_in_executor(
                self._executor, self._pipeline.compose, prepared, face
            )
        except InferenceError as exc:
            self.stats.drop(type(exc).__name__)
            return
        if index < self.video.next_index:
            self.stats.drop("late")
            return
        self._ready[index] = frame
        self.stats.frames_inferred += 1
        delay_s = time.monotonic() - audio_complete
        self.stats.processing_ms.append(delay_s * 1000)
        if self._on_frame_ready is not None:
            self._on_frame_ready(delay_s)

    async def _frame_for(self, index: int) -> np.ndarray:
        """The frame to send for slot ``index``: composed if ready, else the idle frame."""
        for stale in [i for i in self._ready if i < index]:
            del self._ready[stale]
        frame = self._ready.pop(index, None)
        if frame is not None:
            return frame
        if index in self._pending:
            self.stats.drop("not_ready")
        avatar_index = bounce_index(index, self._pipeline.package.frame_count)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.frames.get, avatar_index)

    def _chunk_for(self, index: int) -> av.Packet[Any]:
        for stale in [i for i in self._outbound if i < index]:
            del self._outbound[stale]
        packet = self._outbound.pop(index, None)
        return packet if packet is not None else stamped(SILENCE, index)

    # -- inbound media ----------------------------------------------------------------

    async def _consume(self, track: MediaStreamTrack) -> None:
        """Drain a received track (its queue is unbounded); audio goes into the mixer."""
        resampler = av.AudioResampler(format="flt", layout="mono", rate=OUT_RATE)
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if not isinstance(frame, av.AudioFrame):
                continue
            for out in resampler.resample(frame):
                self._mixer.feed_inbound(out.to_ndarray().reshape(-1))

    # -- lifetime ---------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[object, object, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, ConnectionError):
            logger.error(
                "session task %s failed: session=%s",
                task.get_name(),
                self.session_id,
                exc_info=exc,
            )

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self, reason: str) -> None:
        """Stop everything this session owns; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self.state = "closed"
        self.end_reason = reason
        current = asyncio.current_task()  # close() may be called from one of our tasks
        tasks = [t for t in (*self._tasks, *self._pending.values()) if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.video.stop()
        self.audio.stop()
        try:
            await close_peer_connection(self.pc)
        except Exception:  # aiortc can raise from close on a half-set-up connection
            logger.warning(
                "closing the peer connection failed: session=%s", self.session_id, exc_info=True
            )
        self.model.close()
        p50, p95 = self.stats.processing_percentiles()
        logger.info(
            "session ended: session=%s avatar=%s reason=%s frames_sent=%d frames_inferred=%d "
            "frames_skipped=%d dropped=%s delay_ms=%.0f lookahead_ms=%.1f "
            "added_delay_p50_ms=%.1f added_delay_p95_ms=%.1f",
            self.session_id,
            self.avatar_id,
            reason,
            self.video.frames_sent,
            self.stats.frames_inferred,
            self.video.frames_skipped,
            self.stats.frames_dropped,
            self.delay_s * 1000,
            self.lookahead_ms,
            p50,
            p95,
        )
        if self._on_closed is not None:
            self._on_closed(self)

    def snapshot(self) -> SessionSnapshot:
        """This call's state and counters (``GET /sessions/{id}``, the admin API)."""
        started_at = self._clock.start
        sends_audio = started_at is not None and sends_track(self.pc, self.audio)
        return self._report.snapshot(
            state=self.state,
            frames_sent=self.video.frames_sent,
            frames_skipped=self.video.frames_skipped,
            started_at=started_at,
            video_next_index=self.video.next_index,
            audio_next_index=self.audio.next_index if sends_audio else None,
            queued_audio_s=self.queued_audio_s,
            buffered=BufferedMedia(audio_chunks=len(self._outbound), frames=len(self._ready)),
            bitrate_bps=target_bitrate_bps(self.pc, self.video),
        )
