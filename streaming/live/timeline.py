"""A session's audio timeline: one 20 ms chunk per tick, its Opus packet, its features.

Chunk ``i`` covers timeline time ``[i·20 ms, (i+1)·20 ms)`` after the session clock's
start and is made at the end of that interval, once the microphone has delivered it
(``docs/architecture.md`` §2). The mixer's chunk is Opus-encoded and resampled to 16 kHz
for the feature stream in one job on the executor, off the event loop (§7). Its packet
waits in the :class:`~streaming.live.send_buffers.SendBuffers` for the audio track, which
sends it a session delay later (§8); every video frame whose features it completes goes
through the speech gate (:class:`~compositor.sequencer.FrameSequencer`), and the frames
to infer go on to the render tasks.

Due times are absolute (:func:`chunk_due`), and every chunk already due when the
timeline wakes is made in the same job (up to :data:`MAX_CHUNKS_PER_JOB`): a timeline
that fell behind (a busy loop, a stall, a worker queue slower than 20 ms for a while)
catches up in one round trip to the workers. Made one job per chunk, a round trip longer
than a tick would leave it further behind at every tick, for good: frames reached
inference seconds after their deadlines and none was lip-synced again (measured with 4
live 720p calls on the 2-core development VM, ``docs/benchmarks.md`` §8).

An interrupt silences what the caller has not heard yet: the queued audio, the
packets being made (the encoder is replaced: the old one holds speech in its look-ahead)
and the frames whose features may hold that audio.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import av
import numpy as np

from compositor.sequencer import FrameSequencer, FrameStep
from inference_core.features.stream import SILENCE_DB, AudioFeatureStream, FrameAudio
from streaming.audio_in.resample import MonoResampler
from streaming.audio_rates import AUDIO_CHUNK_S, FEATURE_RATE, OUT_RATE
from streaming.live.mixer import AudioMixer
from streaming.live.send_buffers import SendBuffers
from streaming.live.workers import Offload
from streaming.webrtc.tracks import SILENCE, OpusChunkEncoder, stamped

T = TypeVar("T")


@dataclass(frozen=True)
class _Frame(Generic[T]):
    """A frame whose features a job completed: its step, whether it was voiced, and
    (for a frame to infer) what ``start`` returned."""

    item: FrameAudio
    step: FrameStep
    voiced: bool
    started: T | None


#: The most chunks (of 20 ms) one job makes when the timeline catches up.
MAX_CHUNKS_PER_JOB = 25


def chunk_due(start: float, index: int) -> float:
    """When chunk ``index`` is made: at the end of its 20 ms, the clock having started at
    ``start``."""
    return start + (index + 1) * AUDIO_CHUNK_S


class AudioTimeline(Generic[T]):
    """Makes a session's chunks from its mixer, each when it is due.

    Every frame the speech gate wants inferred starts in the job that completes its
    features: ``start(step, item)`` runs there, off the loop (the renderer crops the
    avatar frame and builds the model input, ``docs/architecture.md`` §7), and
    ``on_frame(step, item, started)`` gets its result back on the loop. ``on_voice()`` is
    called for every frame at or above ``vad_threshold_db`` (the caller is speaking).
    ``clock`` and ``sleep`` pace :meth:`run` (the monotonic clock of the session clock).
    The speech gate (``sequencer``) is stepped in the jobs only, one job at a time.
    """

    def __init__(
        self,
        mixer: AudioMixer,
        features: AudioFeatureStream,
        sequencer: FrameSequencer,
        executor: Offload,
        buffers: SendBuffers,
        *,
        fps: int,
        lookahead_ms: float,
        vad_threshold_db: float,
        start: Callable[[FrameStep, FrameAudio], T | None],
        on_frame: Callable[[FrameStep, FrameAudio, T | None], None],
        on_voice: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._mixer = mixer
        self._features = features
        self._sequencer = sequencer
        self._executor = executor
        self._buffers = buffers
        self._fps = fps
        self._lookahead_ms = lookahead_ms
        self._vad_threshold_db = vad_threshold_db
        self._start = start
        self._on_frame = on_frame
        self._on_voice = on_voice
        self._reset_gate = False  # an interrupt asked; the next job resets the sequencer
        self._clock = clock
        self._sleep = sleep
        self._to_features = MonoResampler(OUT_RATE, FEATURE_RATE)
        self._opus = OpusChunkEncoder()
        self._chunks_made = 0
        # The last frame the speech gate stepped and handed on (to infer, or idle).
        self.frames_decided = -1
        self._interrupts = 0
        self._silent_until = -1  # frames up to here were cut by an interrupt

    @property
    def chunks_made(self) -> int:
        """Chunks made so far (the next one made is this index)."""
        return self._chunks_made

    async def run(self, start: float) -> None:
        """Make every chunk when it is due, ``start`` being the session clock's start."""
        while True:
            first = self._chunks_made
            wait = chunk_due(start, first) - self._clock()
            if wait > 0:
                await self._sleep(wait)
            # (+1 µs: chunk_due's float sums must not round a due chunk out)
            late_s = self._clock() - chunk_due(start, first) + 1e-6
            late_chunks = int(late_s / AUDIO_CHUNK_S)
            due = min(MAX_CHUNKS_PER_JOB, 1 + max(0, late_chunks))
            chunks = [self._mixer.next_chunk() for _ in range(due)]
            self._chunks_made += due
            interrupts = self._interrupts
            made = await self._executor.run(self._process_chunks, self._opus, chunks, first)
            # An interrupt while the chunks were being made silences them, and cancels
            # the frames they started (their features may hold the dropped audio).
            cut = interrupts != self._interrupts
            for index, (packet, frames) in enumerate(made, first):
                self._buffers.put_chunk(index, stamped(SILENCE, index) if cut else packet)
                if frames:
                    self.frames_decided = frames[-1].item.index
            if cut:
                continue
            for _, frames in made:
                for frame in frames:
                    if frame.voiced:
                        self._on_voice()
                    if frame.step.infer:  # else the video track shows the raw frame itself
                        self._on_frame(frame.step, frame.item, frame.started)

    def _process_chunks(
        self, opus: OpusChunkEncoder, chunks: list[np.ndarray], first: int
    ) -> list[tuple[av.Packet[Any], list[_Frame[T]]]]:
        """Off the loop: each chunk's Opus packet, and the frames its features complete
        (16 kHz) through the speech gate, each frame to infer started."""
        if self._reset_gate:
            self._reset_gate = False
            self._sequencer.reset()
        made = []
        for index, chunk in enumerate(chunks, first):
            packet = opus.encode(chunk, index)
            frames = []
            for item in self._features.push(self._to_features.push(chunk)):
                level = item.level_db if item.index > self._silent_until else SILENCE_DB
                step = self._sequencer.step(level)
                started = self._start(step, item) if step.infer else None
                frames.append(_Frame(item, step, level >= self._vad_threshold_db, started))
            made.append((packet, frames))
        return made

    def interrupt(self) -> tuple[float, list[int]]:
        """Drop the queued audio and go idle: frames whose features may hold it are silent,
        and packets made from now on come from a fresh encoder. Returns the seconds dropped
        and the utterances cut.

        Packets already made are the send buffers' to silence.
        """
        dropped, cut = self._mixer.clear_pushed()
        frame_s = 1.0 / self._fps
        audio_now = self._chunks_made * AUDIO_CHUNK_S
        self._silent_until = int((audio_now + self._lookahead_ms / 1000) / frame_s) + 1
        self._reset_gate = True  # a job may be stepping it now: the next one resets it
        self._interrupts += 1
        # A fresh encoder: the old one holds the last speech in its look-ahead and would
        # put it into the next packet it makes, heard a session delay from now.
        self._opus = OpusChunkEncoder()
        return dropped, cut
