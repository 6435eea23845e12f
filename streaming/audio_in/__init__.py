"""Audio that apps bring to a session or a render: audio files, pushed HTTP bodies, text
turned into speech, streamed PCM. What a session gets is decoded straight to the mixer's
48 kHz mono float32; a file for the offline render to 16 kHz for the features and 48 kHz
for the output (``docs/design/audio-in.md`` §2).

Its errors (:mod:`~streaming.audio_in.exceptions`) are not inference errors: the model
never saw this audio. Imports :mod:`config` and the rates (:mod:`streaming.audio_rates`)
only.
"""

from __future__ import annotations

from streaming.audio_in.decode import DecodedAudio, decode_audio
from streaming.audio_in.exceptions import (
    AudioInputError,
    AudioQueueFullError,
    AudioTooLargeError,
    TtsError,
    TtsInputError,
    TtsUnavailableError,
)
from streaming.audio_in.push import AudioLimits, decode_pushed_audio
from streaming.audio_in.resample import MonoResampler, resample_mono
from streaming.audio_in.tts import TtsEngine, build_tts_engine, check_text, check_voice

__all__ = [
    "AudioInputError",
    "AudioLimits",
    "AudioQueueFullError",
    "AudioTooLargeError",
    "DecodedAudio",
    "MonoResampler",
    "TtsEngine",
    "TtsError",
    "TtsInputError",
    "TtsUnavailableError",
    "build_tts_engine",
    "check_text",
    "check_voice",
    "decode_audio",
    "decode_pushed_audio",
    "resample_mono",
]
