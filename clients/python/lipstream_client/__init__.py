"""lipstream-client: call a lipstream talking-avatar server from Python (asyncio).

:func:`connect` opens a WebRTC call with aiortc and returns a :class:`Call` (received
video and audio frames, session events, session control: speech, interrupts, switching
the avatar and its idle clip); :func:`watch` makes a receive-only :class:`Viewer` of any
session over WHEP (one of :meth:`Client.create_session`'s, that no caller owns, or a
call); :class:`Client` is the HTTP side alone (text-to-speech, pushed audio, server-sent
events, :class:`AudioStream`).
Errors are :class:`LipstreamError` subclasses named after the server's error codes.

This package talks to the server over its public protocol only: it must not import the
server's packages (``config``, ``inference_core``, ``compositor``, ``streaming``,
``web``), nor need onnxruntime or OpenCV.
"""

from __future__ import annotations

from lipstream_client.audio_stream import AudioStream
from lipstream_client.call import Call, connect, open_call
from lipstream_client.errors import (
    ERRORS_BY_CODE,
    AudioQueueFull,
    BadAudio,
    BadFrame,
    BadMessage,
    BadRequest,
    BadStreamFormat,
    Conflict,
    ConnectionFailed,
    EventsOverflow,
    Forbidden,
    LipstreamError,
    LiveKitRefused,
    LiveKitUnavailable,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    SessionNotFound,
    StreamBusy,
    StreamClosed,
    TooManySessions,
    TooManyViewers,
    TtsUnavailable,
    Unauthorized,
)
from lipstream_client.http import Client
from lipstream_client.models import (
    Answer,
    AudioFrame,
    Avatar,
    AvatarSwitched,
    CallStats,
    CreatedSession,
    DelayBudget,
    Event,
    IceServer,
    IdleClipSet,
    LiveKitSession,
    Queued,
    QueueSizes,
    VideoFrame,
    WebRtcConfig,
    WhepAnswer,
)
from lipstream_client.sse import EventStream
from lipstream_client.viewer import Viewer, watch

__all__ = [
    "ERRORS_BY_CODE",
    "Answer",
    "AudioFrame",
    "AudioQueueFull",
    "AudioStream",
    "Avatar",
    "AvatarSwitched",
    "BadAudio",
    "BadFrame",
    "BadMessage",
    "BadRequest",
    "BadStreamFormat",
    "Call",
    "CallStats",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "CreatedSession",
    "DelayBudget",
    "Event",
    "EventStream",
    "EventsOverflow",
    "Forbidden",
    "IceServer",
    "IdleClipSet",
    "LipstreamError",
    "LiveKitRefused",
    "LiveKitSession",
    "LiveKitUnavailable",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "QueueSizes",
    "Queued",
    "RateLimited",
    "ServerError",
    "SessionNotFound",
    "StreamBusy",
    "StreamClosed",
    "TooManySessions",
    "TooManyViewers",
    "TtsUnavailable",
    "Unauthorized",
    "VideoFrame",
    "Viewer",
    "WebRtcConfig",
    "WhepAnswer",
    "connect",
    "open_call",
    "watch",
]
