"""The media path of one call, stage by stage:

    caller's audio, app audio
        ─▶ AudioMixer      one 20 ms chunk at 48 kHz per tick
        ─▶ AudioTimeline   each chunk when due: its Opus packet; 16 kHz → features →
                           speech gate; a frame to infer cropped in the same job
        ─▶ FrameRenderer   per frame to infer: batched inference, then the paste
        ─▶ SendBuffers     packets and composed frames wait for their send slot
        ─▶ the peer's tracks (``streaming.webrtc``), paced by the SessionClock

Each stage gets what it needs in its constructor, here, in that order; nothing is wired
in afterwards. The one loop that joins them is :meth:`LivePipeline.run`: it waits for
the clock to start (the first track asking for its first slot), then hands what each
timeline job made on: packets to the send buffers, frames to the renderer. The timeline
runs as an async generator inside that loop, so joining the stages costs no task or
thread hand-off of its own (``docs/architecture.md`` §1, §7).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any

import av
import numpy as np

from compositor.background_cache import AvatarFrames
from compositor.sequencer import FrameSequencer, FrameStep
from config.settings import AudioSettings, Settings
from inference_core.avatars.package import AvatarPackage
from inference_core.features.encoder import AudioEncoder
from inference_core.features.stream import AudioFeatureStream, FrameAudio
from inference_core.serving.handle import ModelHandle
from streaming.frame_pipeline import FramePipeline
from streaming.idle_loops import IdleLoopCache, LoopKey
from streaming.live.idle_sharing import IdleSharing, rung_keys
from streaming.live.mixer import AudioMixer
from streaming.live.renderer import FrameRenderer, Started
from streaming.live.reporting import (
    DelayBudget,
    FrameSending,
    FrameStages,
    SessionStats,
    delay_budget,
)
from streaming.live.send_buffers import SendBuffers
from streaming.live.snapshot import BufferedMedia
from streaming.live.speech import SpeechEvents
from streaming.live.timeline import AudioTimeline
from streaming.live.workers import Offload
from streaming.webrtc.pacing import SessionClock
from streaming.webrtc.peer import PeerMedia
from streaming.webrtc.video_encoder import EncoderFactory, LipstreamH264Encoder

logger = logging.getLogger(__name__)

OnFailure = Callable[[str, BaseException], None]


@dataclass(frozen=True)
class CallResources:
    """What the calls of one server share (the :class:`~streaming.live.manager.SessionManager`
    holds them): settings, the compositing threads, the H.264 encoder factory, the
    observers of every lip-synced frame (``/metrics``) and the encoded idle loops (None:
    every call encodes its own idle frames)."""

    settings: Settings
    executor: Offload
    encoders: EncoderFactory
    on_frame_ready: Callable[[FrameStages], None] | None = None
    on_frame_sent: Callable[[FrameSending], None] | None = None
    idle_loops: IdleLoopCache | None = None


class LivePipeline:
    """One call's stages (module doc) and the loop that joins them.

    ``speech`` hears of utterance marks and of each video frame sent (so its events go
    out with their frames); ``on_voice()`` is called for every frame at or above
    ``audio.vad_threshold_db``; ``on_failure(stage, exc)`` for a render task that fails.
    """

    def __init__(
        self,
        session_id: str,
        model: ModelHandle,
        frames: AvatarFrames,
        audio_encoder: AudioEncoder | None,
        shared: CallResources,
        *,
        speech: SpeechEvents,
        on_voice: Callable[[], None],
        on_failure: OnFailure,
    ) -> None:
        package, settings = model.package, shared.settings
        self._session_id = session_id
        self.stats = SessionStats()  # what the render path counts
        self.fps = package.manifest.fps
        self.budget = delay_budget(
            settings, fps=self.fps, kind=package.manifest.adapter.audio_feature
        )
        self.clock = SessionClock(self.budget.server_ms / 1000)
        self.mixer = AudioMixer(
            max_pushed_s=settings.session.max_queued_audio_s,
            on_marks=speech.schedule,
            on_played=speech.played,
        )
        self.buffers = SendBuffers(self.clock.delay_s, self.fps)
        self.sharing = _idle_sharing(shared, package, frames)
        self.renderer = FrameRenderer(
            session_id,
            model,
            FramePipeline(package, frames),
            shared.executor,
            self.clock,
            self.buffers,
            self.stats,
            fps=self.fps,
            lookahead_ms=self.budget.lookahead_ms,
            on_failure=on_failure,
            on_frame_ready=shared.on_frame_ready,
            on_frame_sent=shared.on_frame_sent,
            sharing=self.sharing,
        )
        self.timeline = _timeline(
            self.mixer,
            audio_encoder,
            settings.audio,
            package,
            self.budget,
            shared.executor,
            self.renderer.start,
        )
        self._speech = speech
        self._on_voice = on_voice
        self._frame_size = package.manifest.frame_size
        #: Called with ``n`` once video frame ``n`` is handed to aiortc (benchmarks time it).
        self.sent_listeners: list[Callable[[int], None]] = []

    def media(self) -> PeerMedia:
        """What the peer's tracks send, and where the caller's audio goes (the mixer)."""
        return PeerMedia(
            clock=self.clock,
            fps=self.fps,
            frame_size=self._frame_size,
            video=self,
            audio=self.buffers.take_chunk,
            caller_audio=self.mixer.feed_inbound,
        )

    async def run(self) -> None:
        """The call's media loop (the ``timeline`` stage): from the clock's start, every
        chunk when due, and what it made handed down the path."""
        start = await self.clock.wait_started()
        buffers, renderer = self.buffers, self.renderer
        async for made in self.timeline.jobs(start):
            for index, packet in enumerate(made.packets, made.first):
                buffers.put_chunk(index, packet)
            renderer.decided_until(made.decided)
            for frame in made.frames:
                if frame.voiced:
                    self._on_voice()
                if frame.step.infer:  # else the video track shows the raw frame itself
                    renderer.submit(frame.step, frame.item, frame.started)

    def interrupt(self) -> tuple[float, list[int]]:
        """Drop queued audio and frames: the avatar is idle from the next frame on, and
        ``interrupted`` tells which utterances were cut. Returns the seconds of queued
        audio dropped and those utterances."""
        dropped, cut = self.timeline.interrupt()
        self.renderer.cancel()
        self.buffers.interrupt()  # what the caller has not seen or heard yet
        utterances = self._speech.interrupted(cut, dropped)
        logger.info(
            "session interrupted: session=%s dropped_audio_s=%.2f utterances=%s",
            self._session_id,
            dropped,
            utterances,
        )
        return dropped, utterances

    @property
    def in_flight(self) -> Collection[Any]:
        """Render tasks and an encode not finished (awaited when the call ends)."""
        return self.renderer.in_flight

    def waiting(self) -> BufferedMedia:
        """Media made and waiting: for the timeline, and for its send slot."""
        chunks, frames = self.buffers.sizes()
        return BufferedMedia(chunks, frames, inbound_audio_ms=round(self.mixer.inbound_ms, 1))

    # -- the video track's source (streaming.webrtc.tracks.VideoSource) -----------------

    # The renderer's own coroutines, handed on: no coroutine of ours around each frame.

    def frame_for(self, index: int) -> Coroutine[Any, Any, np.ndarray]:
        return self.renderer.frame_for(index)

    def packet_for(
        self, index: int, encoder: LipstreamH264Encoder
    ) -> Coroutine[Any, Any, av.Packet[Any]]:
        return self.renderer.packet_for(index, encoder)

    def sent(self, index: int) -> None:
        self._speech.frame_sent(index)
        for listener in self.sent_listeners:
            listener(index)


def _idle_sharing(
    shared: CallResources, package: AvatarPackage, frames: AvatarFrames
) -> IdleSharing | None:
    """The call's choice of shared idle frames, when ``video.shared_idle`` is on and the
    server keeps idle loops (``docs/architecture.md`` §16)."""
    video = shared.settings.video
    if not video.shared_idle or shared.idle_loops is None or shared.idle_loops.max_bytes == 0:
        return None
    fps = package.manifest.fps
    width, height = package.manifest.frame_size
    config = shared.encoders.config(width, height, fps)
    base = LoopKey(
        avatar_id=package.avatar_id,
        source=frames.source,
        config=config,
        bitrate=config.bitrate,
        keyframe_every=max(1, round(video.idle_keyframe_interval_s * fps)),
        preset=video.idle_preset,
        frame_count=package.frame_count,
        constant_quality=video.idle_constant_quality,
    )
    return IdleSharing(
        shared.idle_loops, rung_keys(base, video.idle_bitrate_rungs), frames.get, fps
    )


def _timeline(
    mixer: AudioMixer,
    audio_encoder: AudioEncoder | None,
    audio: AudioSettings,
    package: AvatarPackage,
    budget: DelayBudget,
    executor: Offload,
    prepare: Callable[[FrameStep, FrameAudio], Started | None],
) -> AudioTimeline[Started]:
    """A call's timeline: the avatar's features and speech gate, ``prepare`` (the
    renderer's crop) run in its jobs."""
    fps = package.manifest.fps
    return AudioTimeline(
        mixer,
        AudioFeatureStream(
            audio_encoder,
            kind=package.manifest.adapter.audio_feature,
            fps=fps,
            right_context=audio.right_context,
        ),
        FrameSequencer(
            package.frame_count,
            threshold_db=audio.vad_threshold_db,
            hangover_frames=audio.hangover_frames,
            blend_frames=audio.blend_frames,
        ),
        executor,
        fps=fps,
        lookahead_ms=budget.lookahead_ms,
        vad_threshold_db=audio.vad_threshold_db,
        prepare=prepare,
    )
