"""A session's audio timeline: one 20 ms chunk per tick, its Opus packet, its features.

Chunk ``i`` covers timeline time ``[i·20 ms, (i+1)·20 ms)`` after the session clock's
start and is made at the end of that interval, once the microphone has delivered it
(``docs/design/audio-in.md`` §2). The mixer's chunk is Opus-encoded and resampled to 16 kHz
for the feature stream in one job on the executor, off the event loop (§7); every video
frame whose features it completes goes through the speech gate
(:class:`~compositor.sequencer.FrameSequencer`), and a frame to infer is prepared in the
same job. The gate is asked as each frame's inputs become final, so only the frames it
infers get features: a listening call runs no audio encoder
(:class:`~inference_core.features.stream.FrameGate`). What a job made goes back to the live pipeline
(:class:`~streaming.live.pipeline.LivePipeline`), which hands the packets to the send
buffers (the audio track sends each a session delay later, §8) and the frames to infer
to the render tasks.

Due times are absolute (:func:`chunk_due`), and every chunk already due when the
timeline wakes is made in the same job (up to :data:`MAX_CHUNKS_PER_JOB`): a timeline
that fell behind (a busy loop, a stall, a worker queue slower than 20 ms for a while)
catches up in one round trip to the workers. Made one job per chunk, a round trip longer
than a tick would leave it further behind at every tick, for good: frames reached
inference seconds after their deadlines and none was lip-synced again (measured with 4
live 720p calls on the 2-core development VM, ``docs/changelog.md``, issue 12).

A caller who listens sends digital silence, and its chunks change nothing a job would
make differently later: once the timeline has been silent for longer than its lookahead
and the speech gate's hangover, with the codec settled and the gate at rest, a chunk of
zeros gets its packet (:data:`SILENCE`, stamped) on the loop and its features are put
off, up to :data:`MAX_SILENT_DEFERRED` chunks; the next job makes them first, in order,
exactly as it would have one by one, before anything else: the first chunk of sound, a
switch, an interrupt or a full batch runs it at once. The frames those chunks complete are
idle and reach the renderer up to that many chunks later, so this applies only while
the call's idle frames come from a shared loop, whose packet is the same whenever it is
taken (``defer_silence``). While its chunks wait, the timeline also wakes less often: it
sleeps up to :data:`MAX_SILENT_NAP` chunks and makes them together (the catch-up path),
unless sound comes first: the mixer's ``on_sound`` (the caller's audio that is not
zeros, or audio pushed), a switch or an interrupt wakes it, and it makes what is due
then and goes back to a chunk per tick, so the chunk that holds the sound is made at its
own due time. A listening call then hands the workers one job per
:data:`MAX_SILENT_DEFERRED` + 1 chunks instead of one per chunk, and its timeline wakes
about four times in those 220 ms instead of eleven (``docs/design/idle-loops.md`` §16).

An interrupt silences what the caller has not heard yet: the queued audio, the
packets being made (the encoder is replaced: the old one holds speech in its look-ahead)
and the frames whose features may hold that audio.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import av
import numpy as np

from compositor.clips import ClipPlan
from compositor.sequencer import FrameSequencer, FrameStep
from inference_core.features.encoder import AudioEncoder
from inference_core.features.stream import SILENCE_DB, AudioFeatureStream, FrameAudio
from streaming.audio_in.resample import MonoResampler
from streaming.audio_rates import AUDIO_CHUNK_S, CHUNK_SAMPLES, FEATURE_RATE, OUT_RATE
from streaming.live.mixer import AudioMixer
from streaming.live.workers import Offload
from streaming.webrtc.tracks import SILENCE, OpusChunkEncoder, fec_percent, stamped

T = TypeVar("T")


@dataclass(frozen=True)
class DecidedFrame(Generic[T]):
    """A frame whose features a job completed: its step, whether it was voiced, and
    (for a frame to infer) what ``prepare`` returned for it. Only a frame to infer has
    features; the others carry :data:`~inference_core.features.stream.NO_FEATURES`."""

    item: FrameAudio
    step: FrameStep
    voiced: bool
    started: T | None


@dataclass(frozen=True)
class Made(Generic[T]):
    """What one job made: the Opus packets of chunks ``first``… (silence where an
    interrupt cut them), the frames their features completed (none when cut), and the
    last frame the speech gate has decided (-1 while none)."""

    first: int
    packets: list[av.Packet[Any]]
    frames: list[DecidedFrame[T]]
    decided: int


#: The most chunks (of 20 ms) one job makes when the timeline catches up.
MAX_CHUNKS_PER_JOB = 25
#: The most chunks of digital silence whose features wait for the next job (200 ms):
#: what that job makes first when speech starts (≈ 100 µs a chunk on the development VM).
MAX_SILENT_DEFERRED = 10
#: The most chunks a timeline whose chunks wait sleeps through before making them (100
#: ms): the caller's zeros queue in the mixer meanwhile, well under its inbound bound.
MAX_SILENT_NAP = 5


@dataclass(frozen=True)
class AvatarSwitch:
    """A switch of the call's avatar the next job applies before it steps a frame: the
    new avatar's clip plan and audio encoder, and ``apply(first)``, told the first frame
    the new avatar shows (run in that job, off the loop)."""

    plan: ClipPlan
    encoder: AudioEncoder | None
    apply: Callable[[int], None]


class _SpeechGate:
    """The speech gate as the feature stream's
    :class:`~inference_core.features.stream.FrameGate`: each frame steps the sequencer
    (silent if an interrupt cut it), and ``decided`` keeps each step and level until the
    job takes them. A loud frame keeps up to ``hangover + blend`` frames after it
    inferred, so their windows are the ones worth encoding ahead."""

    def __init__(self, sequencer: FrameSequencer) -> None:
        self._sequencer = sequencer
        self.threshold_db = sequencer.threshold_db
        self.frames_after = sequencer.hangover_frames + sequencer.blend_frames
        self.silent_until = -1  # frames up to here were cut by an interrupt
        self.decided: list[tuple[FrameStep, float]] = []

    def infer(self, index: int, level_db: float) -> bool:
        level = level_db if index > self.silent_until else SILENCE_DB
        step = self._sequencer.step(level)
        self.decided.append((step, level))
        return step.infer


async def nap_until_woken(seconds: float, woken: asyncio.Future[None]) -> None:
    """Sleep ``seconds``, or until ``woken`` is done, whichever comes first."""
    timer = asyncio.get_running_loop().call_later(seconds, _settle, woken)
    try:
        await woken
    finally:
        timer.cancel()


def _settle(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


def chunk_due(start: float, index: int) -> float:
    """When chunk ``index`` is made: at the end of its 20 ms, the clock having started at
    ``start``."""
    return start + (index + 1) * AUDIO_CHUNK_S


class AudioTimeline(Generic[T]):
    """Makes a session's chunks from its mixer, each when it is due.

    Every frame the speech gate wants inferred starts in the job that completes its
    features: ``prepare(step, item)`` runs there, off the loop (the renderer crops the
    avatar frame and builds the model input, ``docs/design/threads.md`` §7), and the frame
    comes back on the loop with its result (:class:`DecidedFrame`). ``clock`` and
    ``sleep`` pace :meth:`jobs` (the monotonic clock of the session clock). The speech
    gate (``sequencer``) is stepped in the jobs only, one job at a time.
    """

    def __init__(
        self,
        mixer: AudioMixer,
        features: AudioFeatureStream,
        sequencer: FrameSequencer,
        executor: Offload,
        *,
        fps: int,
        lookahead_ms: float,
        vad_threshold_db: float,
        prepare: Callable[[FrameStep, FrameAudio], T | None],
        defer_silence: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        nap: Callable[[float, asyncio.Future[None]], Awaitable[None]] | None = None,
    ) -> None:
        self._mixer = mixer
        self._features = features
        self._sequencer = sequencer
        self._executor = executor
        self._fps = fps
        self._lookahead_ms = lookahead_ms
        self._vad_threshold_db = vad_threshold_db
        self._prepare = prepare
        self._reset_gate = False  # an interrupt asked; the next job resets the sequencer
        self._clock = clock
        self._sleep = sleep
        self._to_features = MonoResampler(OUT_RATE, FEATURE_RATE)
        self._opus = OpusChunkEncoder()
        self._fec_percent = 0  # what the caller's reported loss asks of the encoder
        self._chunks_made = 0
        # The last frame the speech gate stepped and handed on (to infer, or idle).
        self._decided = -1
        self._interrupts = 0
        self._gate = _SpeechGate(sequencer)
        self._switch: AvatarSwitch | None = None  # to apply between two frames
        self._switch_lock = threading.Lock()
        self._defer_silence = defer_silence
        # Silent chunks (module doc): how many the jobs made in a row, how many such a
        # run needs before chunks are put off (every frame still to come is silent and
        # the gate has stepped past its hangover and fade), and how many wait now.
        self._silent_run = 0
        frame_ms = 1000 / fps
        frames_after = sequencer.hangover_frames + sequencer.blend_frames
        settle_ms = lookahead_ms + (frames_after + 2) * frame_ms
        self._settle_chunks = math.ceil(settle_ms / (AUDIO_CHUNK_S * 1000)) + 1
        self._deferred = 0
        # A nap ends at the latest a chunk before the first chunk it puts off is sent
        # (the session delay is longer than the lookahead).
        chunk_ms = AUDIO_CHUNK_S * 1000
        self._nap_chunks = max(1, min(MAX_SILENT_NAP, int(lookahead_ms // chunk_ms) - 1))
        self._nap = nap if nap is not None else nap_until_woken
        self._woken: asyncio.Future[None] | None = None  # set while napping
        self._sound = False  # since the chunks last made: sound, a switch, an interrupt
        self._start = 0.0  # the session clock's start, once jobs() runs
        mixer.on_sound = self.wake

    def close(self) -> None:
        """Free the codecs (Opus, resampler) now, not at Python's next full collection."""
        self._opus.close()
        self._to_features.close()

    @property
    def next_frame(self) -> int:
        """The next frame the speech gate decides."""
        return self._sequencer.output_index

    @property
    def chunks_made(self) -> int:
        """Chunks made so far (the next one made is this index)."""
        return self._chunks_made

    async def jobs(self, start: float) -> AsyncIterator[Made[T]]:
        """Make every chunk when it is due, ``start`` being the session clock's start;
        what each job made, as it comes back on the loop."""
        self._start = start
        napping = False  # the last chunks were put off: sleep through a few more
        while True:
            first = self._chunks_made
            due_at = until = chunk_due(start, first)
            if napping and not self._sound:
                ahead = min(self._nap_chunks, MAX_SILENT_DEFERRED - self._deferred)
                until = chunk_due(start, first + max(ahead, 1) - 1)
            wait = until - self._clock()
            if wait > 0 and until > due_at:
                self._woken = asyncio.get_running_loop().create_future()
                try:
                    await self._nap(wait, self._woken)
                finally:
                    self._woken = None
                if self._clock() < due_at:  # woken before the chunk is due: tick as usual
                    continue
            elif wait > 0:
                await self._sleep(wait)
            sound, self._sound = self._sound, False
            # (+1 µs: chunk_due's float sums must not round a due chunk out)
            late_s = self._clock() - chunk_due(start, first) + 1e-6
            late_chunks = int(late_s / AUDIO_CHUNK_S)
            due = min(MAX_CHUNKS_PER_JOB, 1 + max(0, late_chunks))
            chunks = [self._mixer.next_chunk() for _ in range(due)]
            self._chunks_made += due
            interrupts = self._interrupts
            if self._opus.fec_percent != self._fec_percent:
                self._opus = OpusChunkEncoder(fec_percent=self._fec_percent)
            napping = False
            if self._may_defer(chunks):
                napping = not sound  # after sound, the next chunk is made at its tick
                self._deferred += due
                packets = [self._opus.encode(chunk, i) for i, chunk in enumerate(chunks, first)]
                yield Made(first, packets, [], self._decided)
                continue
            deferred, self._deferred = self._deferred, 0
            packets, frames = await self._executor.run(
                self._process_chunks, self._opus, chunks, first, deferred
            )
            if frames:
                self._decided = frames[-1].item.index
            # An interrupt while the chunks were being made silences them, and drops
            # the frames they started (their features may hold the dropped audio).
            if interrupts != self._interrupts:
                silence = [stamped(SILENCE, index) for index in range(first, first + due)]
                yield Made(first, silence, [], self._decided)
            else:
                yield Made(first, packets, frames, self._decided)

    def wake(self) -> None:
        """Sound came (the caller's or pushed audio), or a switch or an interrupt: a
        napping timeline makes what is due now and goes back to a chunk per tick. The
        chunks it makes then were due before the sound: audio pushed now is held for the
        first chunk due after it, as it would have been had they been made on time."""
        self._sound = True
        woken = self._woken
        if woken is not None and not woken.done():
            due_by_now = int((self._clock() - self._start) / AUDIO_CHUNK_S + 1e-6)
            self._mixer.hold_pushed(due_by_now)
            woken.set_result(None)

    def _may_defer(self, chunks: list[np.ndarray]) -> bool:
        """Whether ``chunks`` may wait for a later job (module doc); read on the loop
        between jobs, so no job is changing what it reads."""
        return (
            self._silent_run >= self._settle_chunks
            and self._deferred + len(chunks) <= MAX_SILENT_DEFERRED
            and self._opus.settled
            and self._sequencer.resting
            and not self._reset_gate
            and self._switch is None
            and self._defer_silence()
            and not any(chunk.any() for chunk in chunks)
        )

    def _process_chunks(
        self, opus: OpusChunkEncoder, chunks: list[np.ndarray], first: int, deferred: int
    ) -> tuple[list[av.Packet[Any]], list[DecidedFrame[T]]]:
        """Off the loop: the features of the ``deferred`` silent chunks before ``first``
        (their packets went out already), then each chunk's Opus packet, and the frames
        the features complete (16 kHz) through the speech gate, each frame to infer
        started."""
        frames = []
        if deferred:
            zeros = np.zeros(CHUNK_SAMPLES, dtype=np.float32)
            for _ in range(deferred):
                frames += self._decide(zeros)
        if self._reset_gate:
            self._reset_gate = False
            self._sequencer.reset()
        self._apply_switch()
        packets = []
        for index, chunk in enumerate(chunks, first):
            packets.append(opus.encode(chunk, index))
            frames += self._decide(chunk)
        return packets, frames

    def _decide(self, chunk: np.ndarray) -> list[DecidedFrame[T]]:
        """The frames ``chunk``'s features complete, through the speech gate."""
        gate = self._gate
        items = self._features.push(self._to_features.push(chunk), gate)
        self._silent_run = 0 if chunk.any() else self._silent_run + 1
        decided, gate.decided = gate.decided, []
        frames = []
        for item, (step, level) in zip(items, decided, strict=True):
            started = self._prepare(step, item) if step.infer else None
            frames.append(DecidedFrame(item, step, level >= self._vad_threshold_db, started))
        return frames

    def switch(self, switch: AvatarSwitch) -> None:
        """Show another avatar from the next frame the speech gate decides: the next job
        applies ``switch`` before it steps a frame, so every frame is decided, prepared
        and rendered for one avatar. Before the clock starts no job runs: it applies now.
        A switch not applied yet is replaced by a later one."""
        with self._switch_lock:
            self._switch = switch
        if self._chunks_made == 0:
            self._apply_switch()
        self.wake()

    def cancel_switch(self, switch: AvatarSwitch) -> bool:
        """Withdraw ``switch`` unless a job applied it already; True when withdrawn."""
        with self._switch_lock:
            if self._switch is not switch:
                return False
            self._switch = None
            return True

    def _apply_switch(self) -> None:
        with self._switch_lock:
            switch, self._switch = self._switch, None
            if switch is None:
                return
            self._sequencer.frame_count = switch.plan.frame_count
            self._sequencer.plan = switch.plan
            self._features.use_encoder(switch.encoder)
            switch.apply(self._sequencer.output_index)

    def interrupt(self) -> tuple[float, list[int]]:
        """Drop the queued audio and go idle: frames whose features may hold it are silent,
        and packets made from now on come from a fresh encoder. Returns the seconds dropped
        and the utterances cut.

        Packets already made are the send buffers' to silence (the pipeline's interrupt).
        """
        dropped, cut = self._mixer.clear_pushed()
        frame_s = 1.0 / self._fps
        audio_now = self._chunks_made * AUDIO_CHUNK_S
        self._gate.silent_until = int((audio_now + self._lookahead_ms / 1000) / frame_s) + 1
        self._reset_gate = True  # a job may be stepping it now: the next one resets it
        self._interrupts += 1
        # A fresh encoder: the old one holds the last speech in its look-ahead and would
        # put it into the next packet it makes, heard a session delay from now.
        self._opus = OpusChunkEncoder(fec_percent=self._fec_percent)
        self.wake()
        return dropped, cut

    def audio_loss(self, loss: float) -> None:
        """The caller reports losing ``loss`` of our audio packets: from the next chunk
        on, the voice carries in-band FEC for it (once on, it stays on for the call, at
        the highest loss reported: ``docs/design/link.md`` §19)."""
        self._fec_percent = max(self._fec_percent, fec_percent(loss))
