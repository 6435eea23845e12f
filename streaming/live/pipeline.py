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
thread hand-off of its own (``docs/design/map.md`` §1, ``docs/design/threads.md`` §7).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any

import av
import numpy as np

from compositor.clips import ClipPlan
from compositor.sequencer import FrameSequencer, FrameStep
from config.settings import AudioSettings, Settings
from inference_core.avatars.package import AvatarPackage
from inference_core.features.encoder import AudioEncoder
from inference_core.features.stream import AudioFeatureStream, FrameAudio
from streaming.broadcast.feed import PublishedVideo, VideoFeed
from streaming.idle_loops import IdleLoopCache
from streaming.live.avatar import CallAvatar
from streaming.live.idle_sharing import IdleSharing
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
from streaming.live.speech import Played, SpeechEvents
from streaming.live.timeline import AudioTimeline, AvatarSwitch
from streaming.live.workers import Offload
from streaming.webrtc.pacing import SessionClock
from streaming.webrtc.peer import PeerMedia
from streaming.webrtc.video_encoder import EncoderFactory, LipstreamH264Encoder

logger = logging.getLogger(__name__)

OnFailure = Callable[[str, BaseException], None]
#: Frames of the clip plan kept behind the last frame sent (a late slot may still ask).
PLAN_KEPT_FRAMES = 250
#: Seconds a switch may wait for the timeline to apply it (a job runs every 20 ms).
SWITCH_APPLY_S = 5.0
#: Sends one message back to the client that sent a control message.
Reply = Callable[[dict[str, Any]], None]
#: The server's handling of a client's control message to a call: ``(session, message,
#: reply)`` (``web/session_controls.py``; the session is typed loosely, it owns this module).
Control = Callable[[Any, object, Reply], None]


@dataclass(frozen=True)
class CallResources:
    """What the calls of one server share (the :class:`~streaming.live.manager.SessionManager`
    holds them): settings, the compositing threads, the H.264 encoder factory, the
    observers of every lip-synced frame (``/metrics``), the encoded idle loops (None:
    every call encodes its own idle frames) and what a control message from a caller's
    data channel does (None: only ``interrupt`` is taken)."""

    settings: Settings
    executor: Offload
    encoders: EncoderFactory
    on_frame_ready: Callable[[FrameStages], None] | None = None
    on_frame_sent: Callable[[FrameSending], None] | None = None
    idle_loops: IdleLoopCache | None = None
    control: Control | None = None


class LivePipeline:
    """One call's stages (module doc) and the loop that joins them.

    ``speech`` hears of utterance marks and of each video frame sent (so its events go
    out with their frames); ``on_voice()`` is called for every frame at or above
    ``audio.vad_threshold_db``; ``on_failure(stage, exc)`` for a render task that fails.
    """

    def __init__(
        self,
        session_id: str,
        avatar: CallAvatar,
        shared: CallResources,
        *,
        speech: SpeechEvents,
        on_voice: Callable[[], None],
        on_failure: OnFailure,
    ) -> None:
        package, settings = avatar.package, shared.settings
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
            clock=self.clock.now,
        )
        self.buffers = SendBuffers(self.clock.delay_s, self.fps)
        self.renderer = FrameRenderer(
            session_id,
            avatar,
            shared.executor,
            self.clock,
            self.buffers,
            self.stats,
            fps=self.fps,
            lookahead_ms=self.budget.lookahead_ms,
            on_failure=on_failure,
            on_frame_ready=shared.on_frame_ready,
            on_frame_sent=shared.on_frame_sent,
        )
        self.timeline = _timeline(
            self.mixer,
            avatar.audio_encoder,
            avatar.plan,
            settings.audio,
            package,
            self.budget,
            shared.executor,
            self.renderer.start,
            defer_silence=self._on_shared_loop,
        )
        self._speech = speech
        self._on_voice = on_voice
        self._frame_size = package.manifest.frame_size
        self._fade_frames = max(0, round(settings.video.switch_fade_s * self.fps))
        self._dtx = settings.audio.dtx
        self._switched: _Switched | None = None  # a switch applied, until its dissolve is sent
        #: Called with ``n`` once video frame ``n`` is handed to aiortc (benchmarks time it).
        self.sent_listeners: list[Callable[[int], None]] = []
        #: Every H.264 frame sent, for the session's viewers (``streaming.broadcast``).
        self.feed = VideoFeed()

    def media(self) -> PeerMedia:
        """What the peer's tracks send, and where the caller's audio goes (the mixer).

        Each audio slot taken tells the utterance ledger which samples went to the caller
        (``played_ms``, ``docs/design/speech-events.md`` §15)."""
        buffers, ledger, speech = self.buffers, self.mixer.utterances, self._speech
        arrivals, stats, now = self.mixer.chunk_arrivals, self.stats, self.clock.now

        def audio(index: int) -> av.Packet[Any]:
            ledger.chunk_sent(index, buffers.holds_chunk(index))
            speech.audio_sent(index)
            arrived = arrivals.pop(index, None)
            if arrived is not None:  # the caller's audio, back out (docs/design/delay.md §8)
                stats.caller_audio_ms.append(1000 * (now() - arrived))
            return buffers.take_chunk(index)

        return PeerMedia(
            clock=self.clock,
            fps=self.fps,
            frame_size=self._frame_size,
            video=PublishedVideo(self, self.feed),
            audio=audio,
            audio_quiet=self.audio_quiet,
            dtx=self._dtx,
            caller_audio=self.mixer.feed_inbound,
            caller_concealment=self.mixer.set_concealment,
            audio_loss=self.timeline.audio_loss,
        )

    def audio_quiet(self, first: int, last: int) -> int:
        """The last chunk in ``first..last`` a DTX track may sleep through: only chunks
        made, silent, and waited for by no event or utterance (``webrtc/tracks.py``)."""
        if self._speech.waiting:
            return first - 1
        waiting = self.mixer.utterances.first_waiting_chunk()
        if waiting is not None:
            last = min(last, waiting - 1)
        return self.buffers.silent_until(first, last)

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

    def interrupt(self) -> tuple[float, list[Played]]:
        """Drop queued audio and frames: the avatar is idle from the next frame on, and
        ``interrupted`` tells which utterances were cut, after each one's ``speech_ended``.
        Returns the seconds of queued audio dropped and what each of them played."""
        cut = self.mixer.utterances.unended()  # before the timeline drops them
        dropped, _ = self.timeline.interrupt()
        self.renderer.cancel()
        self.buffers.interrupt()  # what the caller has not seen or heard yet
        played = self._speech.interrupted(cut, dropped)
        utterances = [p["utterance"] for p in played]
        logger.info(
            "session interrupted: session=%s dropped_audio_s=%.2f utterances=%s",
            self._session_id,
            dropped,
            utterances,
        )
        return dropped, played

    def _on_shared_loop(self) -> bool:
        """Whether the call is sending its avatar's shared idle loop now (its idle frames
        are then the same whenever they are decided: silent chunks may wait)."""
        sharing = self.renderer.sharing
        return sharing is not None and sharing.sharing

    @property
    def sharing(self) -> IdleSharing | None:
        """The current avatar's choice of shared idle loop (None: the call encodes)."""
        return self.renderer.sharing

    @property
    def avatar(self) -> CallAvatar:
        """The avatar of the frames being decided now."""
        return self.renderer.avatar

    @property
    def clips(self) -> list[str]:
        """The idle clips of the current avatar."""
        return sorted(self.avatar.plan.clips)

    @property
    def idle_clip(self) -> str:
        """The clip the current avatar plays while silent."""
        return self.avatar.plan.current_idle

    def set_idle_clip(self, clip: str) -> str:
        """Play ``clip`` while silent, entered at the nearest frame of it from the next
        silent frame the speech gate decides (``docs/design/compositing.md`` §5); returns the
        clip it replaces. ``ClipNotFoundError`` lists the avatar's clips."""
        plan = self.avatar.plan
        previous = plan.current_idle
        plan.choose(clip)
        if self.sharing is not None:
            self.sharing.prepare(plan.clips[clip])  # its shared loop, built in the background
        return previous

    @property
    def dissolving(self) -> bool:
        """Whether a switch was applied and its dissolve is not all sent yet."""
        return self._switched is not None

    async def switch_avatar(
        self,
        avatar: CallAvatar,
        *,
        on_shown: Callable[[int], None],
        on_retired: Callable[[CallAvatar, int], None],
        timeout_s: float = SWITCH_APPLY_S,
    ) -> int:
        """Show ``avatar`` from the next frame the speech gate decides, dissolving from
        the current one over ``video.switch_fade_s`` (``docs/design/switching.md`` §18).
        Returns that frame's index once the timeline applied the switch; then
        ``on_shown(first)`` is called when that frame is sent, and ``on_retired(outgoing,
        first)`` when the dissolve's last frame is. Raises ``TimeoutError`` if no job
        applied it within ``timeout_s`` (the call stalled or ended): nothing changed."""
        if self._switched is not None:
            raise RuntimeError("a switch is still dissolving; switch once it is over")
        loop = asyncio.get_running_loop()
        applied: asyncio.Future[int] = loop.create_future()

        def apply(first: int) -> None:  # in a timeline job, before frame ``first``
            self.renderer.switch(first, avatar, self._fade_frames)
            loop.call_soon_threadsafe(_settle, applied, first)

        switch = AvatarSwitch(avatar.plan, avatar.audio_encoder, apply)
        self.timeline.switch(switch)
        try:
            first = await asyncio.wait_for(asyncio.shield(applied), timeout_s)
        except TimeoutError:
            if self.timeline.cancel_switch(switch):
                raise
            first = await applied  # applied in the meantime: it stands
        self._switched = _Switched(first, first + self._fade_frames, on_shown, on_retired)
        return first

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
        if self._switched is not None:
            self._switch_progress(index)
        self.renderer.avatar.plan.forget_before(index - PLAN_KEPT_FRAMES)
        for listener in self.sent_listeners:
            listener(index)

    def _switch_progress(self, index: int) -> None:
        switched = self._switched
        assert switched is not None
        if not switched.shown and index >= switched.first:
            switched.shown = True
            switched.on_shown(switched.first)
        if index >= switched.last:
            self._switched = None
            outgoing = self.renderer.retire()
            if outgoing is not None:
                switched.on_retired(outgoing, switched.first)


@dataclass
class _Switched:
    """A switch applied: its first frame, the frame after its dissolve, who to tell."""

    first: int
    last: int
    on_shown: Callable[[int], None]
    on_retired: Callable[[CallAvatar, int], None]
    shown: bool = False


def _settle(future: asyncio.Future[int], value: int) -> None:
    if not future.done():
        future.set_result(value)


def _timeline(
    mixer: AudioMixer,
    audio_encoder: AudioEncoder | None,
    plan: ClipPlan,
    audio: AudioSettings,
    package: AvatarPackage,
    budget: DelayBudget,
    executor: Offload,
    prepare: Callable[[FrameStep, FrameAudio], Started | None],
    *,
    defer_silence: Callable[[], bool],
) -> AudioTimeline[Started]:
    """A call's timeline: the avatar's features and speech gate, ``prepare`` (the
    renderer's crop) run in its jobs; silent chunks wait while ``defer_silence()``."""
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
            plan=plan,
        ),
        executor,
        fps=fps,
        lookahead_ms=budget.lookahead_ms,
        vad_threshold_db=audio.vad_threshold_db,
        prepare=prepare,
        defer_silence=defer_silence,
    )
