"""Errors about audio that apps and files bring in, and about text-to-speech.

Hierarchy (the HTTP status ``web/errors.py`` answers with)::

    AudioInputError            root: audio from an app or a file cannot be used (400)
    ├── AudioTooLargeError     a pushed body is over the size or duration limit (413)
    ├── AudioQueueFullError    the session's queue of audio to speak is full (429)
    ├── StreamFormatError      a stream's declared format, rate or channels is unusable (400)
    └── AudioFrameError        one message of an audio stream is unusable (an error message)

    TtsError                   root: speech synthesis failed: crashed, timed out, bad audio (502)
    ├── TtsUnavailableError    no text-to-speech engine is configured or installed (503)
    └── TtsInputError          the text or the voice of a request is unusable (400)

Neither is an inference error: the model never saw this audio.
"""

from __future__ import annotations


class AudioInputError(Exception):
    """Audio cannot be decoded or has an unusable format."""


class AudioTooLargeError(AudioInputError):
    """A pushed body is over the configured size or duration limit."""


class AudioQueueFullError(AudioInputError):
    """Pushed audio would exceed the session's queue limit."""


class StreamFormatError(AudioInputError):
    """An audio stream declared a format, rate or channel count it may not use."""


class AudioFrameError(AudioInputError):
    """One binary message of an audio stream is not usable audio."""


class TtsError(Exception):
    """Speech synthesis failed: the engine crashed, timed out or answered bad audio."""


class TtsUnavailableError(TtsError):
    """No text-to-speech engine is configured or installed."""


class TtsInputError(TtsError):
    """The text or the voice of a request is unusable (empty, too long, bad name)."""
