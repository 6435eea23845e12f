"""The audio apps bring to a session, as utterances, and the events that follow them.

A push, a say and a WebSocket stream each queue utterances in the session's mixer
(``docs/apps.md``); every queued piece is announced as ``queued_ms``, and the
``speech_started`` / ``speech_ended`` events follow when the caller gets the audio
(:mod:`~streaming.live.speech`). A session takes one stream at a time, so the messages
of two streams never interleave in one utterance.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from streaming.audio_in.stream import PcmStreamDecoder, StreamFormat
from streaming.audio_rates import OUT_RATE
from streaming.exceptions import StreamBusyError
from streaming.live.events import SessionEvents
from streaming.live.mixer import AudioMixer
from streaming.live.snapshot import AppAudioState
from streaming.live.speech import SpeechEvents
from streaming.live.stream_in import AudioStreamIn, Queued
from streaming.live.utterances import Source

logger = logging.getLogger(__name__)


class AppAudio:
    """Queues a session's pushed, spoken and streamed audio; ``on_audio()`` on each piece."""

    def __init__(
        self,
        mixer: AudioMixer,
        events: SessionEvents,
        speech: SpeechEvents,
        *,
        max_stream_buffer_s: float,
        on_audio: Callable[[], None],
    ) -> None:
        self._mixer = mixer
        self._events = events
        self.speech = speech
        self._max_stream_buffer_s = max_stream_buffer_s
        self._on_audio = on_audio
        self._stream: AudioStreamIn | None = None

    def push(self, samples: np.ndarray, source: Source) -> Queued:
        """Queue mono audio at the mixer's 48 kHz (as :mod:`streaming.audio_in` decodes it)
        as one whole utterance (a push or a say)."""
        self._mixer.check_room(len(samples))
        number = self._mixer.utterances.open(source)
        queued_s = self._mixer.push(samples, number)
        self._mixer.utterances.close(number)
        queued = Queued(number, len(samples) / OUT_RATE, queued_s)
        self._queued(queued)
        return queued

    def check_stream_free(self) -> None:
        """Raise ``StreamBusyError`` while the session's audio stream is open."""
        if self._stream is not None:
            raise StreamBusyError(
                f"session {self._events.session_id} already has an audio stream open; close "
                "it first (one stream per session, so utterances do not interleave)"
            )

    @property
    def stream_open(self) -> bool:
        return self._stream is not None

    def open_stream(self, stream_format: StreamFormat) -> AudioStreamIn:
        """Start the session's audio stream (one at a time: ``StreamBusyError``)."""
        self.check_stream_free()
        session_id = self._events.session_id
        stream = AudioStreamIn(
            self._mixer,
            PcmStreamDecoder(stream_format),
            max_buffer_s=self._max_stream_buffer_s,
            on_queued=self._queued,
            on_closed=self._stream_closed,
        )
        self._stream = stream
        logger.info(
            "audio stream opened: session=%s format=%s rate=%d",
            session_id,
            stream_format.format,
            stream_format.rate,
        )
        return stream

    def _stream_closed(self, stream: AudioStreamIn) -> None:
        if self._stream is stream:
            self._stream = None
        logger.info(
            "audio stream closed: session=%s messages=%d received_s=%.2f",
            self._events.session_id,
            stream.messages,
            stream.received_s,
        )

    def state(self) -> AppAudioState:
        """What a snapshot shows of it."""
        return AppAudioState(
            speaking=self.speech.speaking,
            utterances=self._mixer.utterances.opened,
            audio_stream=self._stream is not None,
            event_listeners=self._events.listeners,
        )

    def _queued(self, queued: Queued) -> None:
        self._on_audio()
        self._events.publish(
            "queued_ms", queued_ms=round(queued.queued_s * 1000, 1), utterance=queued.utterance
        )
