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
frame's audio is complete and it has been computed, or it is shown idle (never late;
``docs/architecture.md`` §2, §8).

:class:`Session` owns the parts and every task, and wires them; each part is its own
module: the audio timeline (:mod:`~streaming.live.timeline`), the audio apps bring and its
events (:mod:`~streaming.live.app_audio`), the render tasks (:mod:`~streaming.live.renderer`),
the send buffers, the watchdogs and the report.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError

from compositor.background_cache import AvatarFrames
from compositor.sequencer import FrameSequencer
from config.settings import Settings
from inference_core.features.encoder import AudioEncoder
from inference_core.features.stream import AudioFeatureStream
from inference_core.serving.handle import ModelHandle
from streaming.frame_pipeline import FramePipeline
from streaming.live.app_audio import AppAudio
from streaming.live.data_channel import serve_data_channel
from streaming.live.events import SessionEvents
from streaming.live.mixer import AudioMixer
from streaming.live.renderer import FrameRenderer
from streaming.live.reporting import (
    FrameSending,
    FrameStages,
    SessionReport,
    delay_budget,
    sends_track,
    target_bitrate_bps,
)
from streaming.live.send_buffers import SendBuffers
from streaming.live.snapshot import BufferedMedia, SessionSnapshot
from streaming.live.speech import SpeechEvents
from streaming.live.timeline import AudioTimeline
from streaming.live.watchdogs import (
    PEER_CHECK_S,
    PEER_SILENCE_S,
    AudioActivity,
    ice_failure,
    peer_silent,
)
from streaming.live.workers import Offload
from streaming.webrtc.compat import close_peer_connection
from streaming.webrtc.tracks import (
    OUT_RATE,
    AvatarAudioTrack,
    AvatarVideoTrack,
    SessionClock,
)
from streaming.webrtc.video_encoder import LipstreamH264Encoder

__all__ = ["PEER_CHECK_S", "PEER_SILENCE_S", "Session"]

#: Seconds a closing session gives its data channels to send ``session_ended``.
FLUSH_EVENTS_S = 1.0

logger = logging.getLogger(__name__)


class Session:
    """Owns a peer connection, its tracks and tasks, and a held model.

    ``on_closed`` is called once the session ended; ``on_frame_ready(stages)`` for every
    inferred frame, with the time from its audio being complete to it being composed,
    split by stage (:class:`~streaming.live.reporting.FrameStages`); ``on_frame_sent``
    for every lip-synced frame handed to aiortc encoded, with its wait for its slot and
    its encode (:class:`~streaming.live.reporting.FrameSending`).
    """

    def __init__(
        self,
        session_id: str,
        pc: RTCPeerConnection,
        model: ModelHandle,
        frames: AvatarFrames,
        encoder: AudioEncoder | None,
        settings: Settings,
        executor: Offload,
        *,
        remote: str | None = None,
        on_closed: Callable[[Session], None] | None = None,
        on_frame_ready: Callable[[FrameStages], None] | None = None,
        on_frame_sent: Callable[[FrameSending], None] | None = None,
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
        self.delay_budget = delay_budget(settings, fps=self.fps, kind=spec.audio_feature)
        self.lookahead_ms = self.delay_budget.lookahead_ms
        self.delay_s = self.delay_budget.server_ms / 1000
        self.state = "new"
        self.end_reason: str | None = None
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
        self._executor = executor
        self._on_closed = on_closed
        self.events = SessionEvents(session_id, queue_size=settings.session.event_queue_size)
        self._speech = SpeechEvents(self.events, self.fps)
        self._mixer = AudioMixer(
            max_pushed_s=settings.session.max_queued_audio_s,
            on_marks=self._speech.schedule,
            on_played=lambda queued_s: self.app_audio.played(queued_s),
        )
        self._activity = AudioActivity()
        self.app_audio = AppAudio(
            self._mixer,
            self.events,
            self._speech,
            max_stream_buffer_s=settings.session.max_stream_buffer_s,
            on_audio=self._activity.heard,
        )
        self._buffers = SendBuffers(self.delay_s, self.fps)
        self._clock = SessionClock(self.delay_s, self._on_clock_start)
        self._renderer = FrameRenderer(
            session_id,
            model,
            FramePipeline(package, frames),
            executor,
            self._clock,
            self._buffers,
            self.stats,
            fps=self.fps,
            lookahead_ms=self.lookahead_ms,
            on_frame_ready=on_frame_ready,
            on_frame_sent=on_frame_sent,
        )
        self._timeline = AudioTimeline(
            self._mixer,
            AudioFeatureStream(
                encoder,
                kind=spec.audio_feature,
                fps=self.fps,
                right_context=settings.audio.right_context,
            ),
            FrameSequencer(
                package.frame_count,
                threshold_db=settings.audio.vad_threshold_db,
                hangover_frames=settings.audio.hangover_frames,
                blend_frames=settings.audio.blend_frames,
            ),
            executor,
            self._buffers,
            fps=self.fps,
            lookahead_ms=self.lookahead_ms,
            vad_threshold_db=settings.audio.vad_threshold_db,
            start=self._renderer.start,
            on_frame=self._renderer.submit,
            on_voice=self._activity.heard,
        )
        self._renderer.decided = lambda: self._timeline.frames_decided
        self.video = AvatarVideoTrack(
            self._clock, self.fps, self._renderer.frame_for, on_sent=self._speech.frame_sent
        )
        self.audio = AvatarAudioTrack(self._clock, self._buffers.take_chunk)
        self._tasks: set[asyncio.Task[None]] = set()
        self._event_channels: list[asyncio.Task[None]] = []  # data channels' forwarders
        self._closed = False

    @property
    def last_audio_at(self) -> float:
        """When the session last had audio (``time.monotonic()``): pushed or spoken audio,
        or caller audio above ``audio.vad_threshold_db``."""
        return self._activity.last_audio_at

    # -- inputs ---------------------------------------------------------------------

    def encode_video_with(self, encoder: LipstreamH264Encoder) -> None:
        """Send the video encoded by ``encoder`` (the sender's own, see
        :func:`~streaming.webrtc.video_encoder.install_encoder`), each frame encoded in
        the job that fetches it: one hand-off per frame instead of aiortc's own."""
        renderer = self._renderer
        self.video.send_from(lambda index: renderer.packet_for(index, encoder))

    def hear_caller(self, samples: np.ndarray) -> None:
        """The caller's audio, decoded as it arrived (float32, 48 kHz mono)."""
        self._mixer.feed_inbound(samples)

    def add_remote_track(self, track: MediaStreamTrack) -> None:
        """Consume a track the caller sends: audio in a codec the receive buffer does not
        decode itself (not Opus) feeds the mixer; anything else is drained."""
        name = f"inbound-{track.kind}-{self.session_id[:8]}"
        self._spawn(self._consume(track), name)

    def watch_connection(self, timeout_s: float) -> None:
        """End the session if ICE has not connected within ``timeout_s``, or once the
        connected peer has sent nothing for ``PEER_SILENCE_S``."""

        async def ice_watchdog() -> None:
            reason = await ice_failure(self.pc, timeout_s, self.session_id)
            if reason is not None:
                await self.close(reason)

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
            for index in range(len(self.frames)):
                await self._executor.run(self.frames.get, index)

        self._spawn(preload(), f"preload-{self.session_id[:8]}")

    def interrupt(self) -> tuple[float, list[int]]:
        """Drop queued audio and frames: the avatar is idle from the next frame on.

        Returns the seconds of queued audio dropped and the utterances cut short.
        """
        dropped, cut = self._timeline.interrupt()
        self._renderer.cancel()
        self._buffers.interrupt()  # what the caller has not seen or heard yet
        utterances = self._speech.interrupted(cut, dropped)
        logger.info(
            "session interrupted: session=%s dropped_audio_s=%.2f utterances=%s",
            self.session_id,
            dropped,
            utterances,
        )
        return dropped, utterances

    def serve_data_channel(self, channel: RTCDataChannel) -> None:
        """Send this session's events on the caller's ``lipstream`` data channel and take
        its ``interrupt`` messages (``docs/apps.md``)."""
        self._event_channels.append(
            self._spawn(
                serve_data_channel(channel, self.events.listen(), self.interrupt),
                f"data-channel-{self.session_id[:8]}",
            )
        )

    @property
    def queued_audio_s(self) -> float:
        return self._mixer.pushed_seconds

    # -- media ----------------------------------------------------------------------

    def _on_clock_start(self, start: float) -> None:
        self.state = "streaming"
        self._spawn(self._timeline.run(start), f"timeline-{self.session_id[:8]}")
        logger.info(
            "session media started: session=%s avatar=%s delay_ms=%.0f lookahead_ms=%.1f",
            self.session_id,
            self.avatar_id,
            self.delay_s * 1000,
            self.lookahead_ms,
        )

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

    def _spawn(self, coro: Coroutine[object, object, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

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
        self.events.end(reason)
        if self._event_channels:  # session_ended goes out before the connection closes
            await asyncio.wait(self._event_channels, timeout=FLUSH_EVENTS_S)
        current = asyncio.current_task()  # close() may be called from one of our tasks
        tasks = [t for t in (*self._tasks, *self._renderer.in_flight) if t is not current]
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
        self._report.log_end(
            reason,
            frames_sent=self.video.frames_sent,
            frames_skipped=self.video.frames_skipped,
            inbound_skipped_ms=self._mixer.inbound_skipped_ms,
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
            buffered=BufferedMedia(
                *self._buffers.sizes(), inbound_audio_ms=round(self._mixer.inbound_ms, 1)
            ),
            inbound_skipped_ms=self._mixer.inbound_skipped_ms,
            bitrate_bps=target_bitrate_bps(self.pc, self.video),
            app_audio=self.app_audio.state(),
        )
