"""Audio streamed into a session as it is made (a voice agent's TTS over a WebSocket).

Each message is decoded on arrival and queued at once, so the avatar starts speaking on
the first one (``docs/apps.md``). Messages join the open utterance until ``end``; the
decoder resamples them straight to the mixer's 48 kHz (``docs/design/audio-in.md`` §2) with
a resampler kept across the messages of one utterance and flushed at its end, as a whole
push is resampled in one piece, so the mixer gets the same samples either way.

The stream's queue is bounded by time (``session.max_stream_buffer_s``): a message that
would take the session's queued audio past it is refused whole
(:class:`~streaming.audio_in.exceptions.AudioQueueFullError`), before anything is
decoded, so a producer faster than real time is told and nothing grows without bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from streaming.audio_in.exceptions import AudioQueueFullError
from streaming.audio_in.stream import PcmStreamDecoder
from streaming.live.mixer import AudioMixer


@dataclass(frozen=True)
class Queued:
    """Audio just queued: its utterance, and all audio now waiting in the session."""

    utterance: int
    duration_s: float
    queued_s: float


class AudioStreamIn:
    """One open stream into a session's mixer; ``on_queued`` hears of every queued piece."""

    def __init__(
        self,
        mixer: AudioMixer,
        decoder: PcmStreamDecoder,
        *,
        max_buffer_s: float,
        on_queued: Callable[[Queued], None],
        on_closed: Callable[[AudioStreamIn], None],
    ) -> None:
        self._mixer = mixer
        self.decoder = decoder
        self.max_buffer_s = max_buffer_s
        self._on_queued = on_queued
        self._on_closed = on_closed
        self._utterance: int | None = None
        self.messages = 0
        self.received_s = 0.0
        self.closed = False

    @property
    def utterance(self) -> int | None:
        """The utterance messages now join (None: the next message opens one)."""
        number = self._utterance
        return number if number is not None and self._mixer.utterances.is_open(number) else None

    def write(self, message: bytes) -> Queued:
        """Queue one binary message; raises ``AudioFrameError`` or ``AudioQueueFullError``."""
        count = self.decoder.samples_in(message)
        seconds = count / self.decoder.format.rate
        queued = self._mixer.pushed_seconds
        if queued + seconds > self.max_buffer_s:
            raise AudioQueueFullError(
                f"refused {seconds * 1000:.0f} ms: {queued * 1000:.0f} ms are queued and the "
                f"stream holds at most {self.max_buffer_s * 1000:.0f} ms; send at real time "
                "(watch queued_ms) or interrupt"
            )
        opens = self.utterance is None  # a new one, or the last was cut by an interrupt
        if opens:
            self.decoder.restart()  # nothing of a cut utterance leaks into this one
        samples = self.decoder.decode(message)
        self.messages += 1
        self.received_s += seconds
        if opens:
            self._utterance = self._mixer.utterances.open("stream")
        return self._queue(samples, seconds)

    def end(self) -> Queued | None:
        """The open utterance is complete: queue what the resampler holds, close it."""
        number = self.utterance
        if number is None:
            return None
        queued = self._queue(self.decoder.flush(), 0.0)
        self._mixer.utterances.close(number)
        self._utterance = None
        return queued

    def _queue(self, samples: np.ndarray, seconds: float) -> Queued:
        number = self._utterance
        assert number is not None
        queued_s = self._mixer.push(samples, number)
        result = Queued(number, seconds, queued_s)
        self._on_queued(result)
        return result

    def close(self) -> None:
        """The stream ended (the socket closed): its open utterance plays out."""
        if self.closed:
            return
        self.closed = True
        try:
            self.end()
        except AudioQueueFullError:  # the resampler's few samples did not fit: end without
            if self._utterance is not None:
                self._mixer.utterances.close(self._utterance)
        self._on_closed(self)
