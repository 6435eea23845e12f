"""A session's audio timeline: one 20 ms chunk per tick, its Opus packet, its features.

Chunk ``i`` covers timeline time ``[i·20 ms, (i+1)·20 ms)`` after the session clock's
start and is made at the end of that interval, once the microphone has delivered it
(``docs/architecture.md`` §2). The mixer's chunk is Opus-encoded and resampled to 16 kHz
for the feature stream in one job on the executor, off the event loop (§7). Its packet
waits in the :class:`~streaming.live.send_buffers.SendBuffers` for the audio track, which
sends it a session delay later (§8); every video frame whose features it completes goes
through the speech gate (:class:`~compositor.sequencer.FrameSequencer`), and the frames
to infer go on to the render tasks.

Due times are absolute (:func:`chunk_due`): a tick that ran late (a busy loop, a slow
executor) is followed at once by the ticks already due, so lateness never builds up into
delay. An interrupt silences what the caller has not heard yet: the queued audio, the
packets being made (the encoder is replaced: the old one holds speech in its look-ahead)
and the frames whose features may hold that audio.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import av
import numpy as np

from compositor.sequencer import FrameSequencer, FrameStep
from inference_core.features.stream import SILENCE_DB, AudioFeatureStream, FrameAudio
from streaming.audio_in.resample import MonoResampler
from streaming.live.mixer import AudioMixer
from streaming.live.send_buffers import SendBuffers
from streaming.live.workers import Offload
from streaming.webrtc.tracks import AUDIO_CHUNK_S, OUT_RATE, SILENCE, OpusChunkEncoder, stamped

FEATURE_RATE = 16_000


def chunk_due(start: float, index: int) -> float:
    """When chunk ``index`` is made: at the end of its 20 ms, the clock having started at
    ``start``."""
    return start + (index + 1) * AUDIO_CHUNK_S


class AudioTimeline:
    """Makes a session's chunks from its mixer, each when it is due.

    ``on_frame(step, item)`` gets every frame the speech gate wants inferred; ``on_voice()``
    is called for every frame at or above ``vad_threshold_db`` (the caller is speaking).
    ``clock`` and ``sleep`` pace :meth:`run` (the monotonic clock of the session clock).
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
        on_frame: Callable[[FrameStep, FrameAudio], None],
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
        self._on_frame = on_frame
        self._on_voice = on_voice
        self._clock = clock
        self._sleep = sleep
        self._to_features = MonoResampler(OUT_RATE, FEATURE_RATE)
        self._opus = OpusChunkEncoder()
        self._chunks_made = 0
        self._interrupts = 0
        self._silent_until = -1  # frames up to here were cut by an interrupt

    @property
    def chunks_made(self) -> int:
        """Chunks made so far (the next one made is this index)."""
        return self._chunks_made

    async def run(self, start: float) -> None:
        """Make every chunk when it is due, ``start`` being the session clock's start."""
        while True:
            wait = chunk_due(start, self._chunks_made) - self._clock()
            if wait > 0:
                await self._sleep(wait)
            chunk = self._mixer.next_chunk()
            index = self._chunks_made
            self._chunks_made += 1
            interrupts = self._interrupts
            packet, ready = await self._executor.run(self._process_chunk, self._opus, chunk, index)
            # An interrupt while the chunk was being encoded silences it too.
            self._buffers.put_chunk(
                index, packet if interrupts == self._interrupts else stamped(SILENCE, index)
            )
            for item in ready:
                self._on_features(item)

    def _process_chunk(
        self, opus: OpusChunkEncoder, chunk: np.ndarray, index: int
    ) -> tuple[av.Packet[Any], list[FrameAudio]]:
        """Off the loop: the chunk's Opus packet, and the features it completes (16 kHz)."""
        packet = opus.encode(chunk, index)
        return packet, self._features.push(self._to_features.push(chunk))

    def _on_features(self, item: FrameAudio) -> None:
        level = item.level_db if item.index > self._silent_until else SILENCE_DB
        if level >= self._vad_threshold_db:
            self._on_voice()
        step = self._sequencer.step(level)
        if step.infer:  # else the video track shows the raw frame itself
            self._on_frame(step, item)

    def interrupt(self) -> float:
        """Drop the queued audio and go idle: frames whose features may hold it are silent,
        and packets made from now on come from a fresh encoder. Returns the seconds dropped.

        Packets already made are the send buffers' to silence.
        """
        dropped = self._mixer.clear_pushed()
        frame_s = 1.0 / self._fps
        audio_now = self._chunks_made * AUDIO_CHUNK_S
        self._silent_until = int((audio_now + self._lookahead_ms / 1000) / frame_s) + 1
        self._sequencer.reset()
        self._interrupts += 1
        # A fresh encoder: the old one holds the last speech in its look-ahead and would
        # put it into the next packet it makes, heard a session delay from now.
        self._opus = OpusChunkEncoder()
        return dropped
