"""Typed errors mirroring the server's ``{"error": {"code", "message"}}`` bodies.

Every failure the server reports becomes a :class:`LipstreamError` subclass chosen by its
``code`` (:data:`ERRORS_BY_CODE`), or by its HTTP status when the code is one this client
does not know (a newer server). WebSocket ``error`` messages map the same way, with
``status`` ``None``. ::

    LipstreamError                 status, code, message, retry_after
    ├── BadRequest                 400, 415, 422: bad_json, bad_offer, bad_text,
    │   │                          unsupported_media_type, …
    │   ├── BadAudio               bad_audio
    │   ├── BadStreamFormat        bad_stream_format (the WebSocket's query)
    │   ├── BadFrame               bad_frame (a WebSocket binary message)
    │   └── BadMessage             bad_message (a WebSocket text message)
    ├── Unauthorized               401 unauthorized
    ├── Forbidden                  403 forbidden
    ├── NotFound                   404: model_not_found, clip_not_found, not_found, …
    │   └── SessionNotFound        session_not_found, session_lost (410)
    ├── Conflict                   409: model_in_use, avatar_exists, avatar_incompatible,
    │   │                          avatar_switch_busy, too_many_outputs
    │   └── StreamBusy             stream_busy
    ├── PayloadTooLarge            413: audio_too_large, body_too_large
    ├── RateLimited                429 rate_limited (retry_after)
    │   └── AudioQueueFull         audio_queue_full
    ├── Overloaded                 503 with retry_after: no_capacity, queue_full, …
    │   ├── TooManySessions        too_many_sessions
    │   └── TooManyViewers         too_many_viewers
    ├── TtsUnavailable             tts_unavailable (503, no retry: install a TTS engine)
    ├── ServerError                5xx: internal_error, tts_failed, inference_failed, …
    ├── EventsOverflow             events_overflow: a listener fell too far behind
    ├── StreamClosed               (client) the audio stream is closed
    └── ConnectionFailed           (client) ICE or the call's set-up failed or timed out
"""

# The classes are named as httpx names its errors and as the server's codes read
# (SessionNotFound, StreamBusy), not with an "Error" suffix.
# ruff: noqa: N818

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


class LipstreamError(Exception):
    """An error the server reported, or a call that could not be made.

    ``status`` is the HTTP status (``None`` for WebSocket messages and client-side
    failures), ``code`` the server's error code, ``retry_after`` the ``Retry-After``
    seconds when the server sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after

    def __str__(self) -> str:
        status = f"{self.status} " if self.status is not None else ""
        return f"{status}{self.code}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, "
            f"message={self.message!r}, retry_after={self.retry_after!r})"
        )


class BadRequest(LipstreamError):
    """The request was refused as malformed (400); its message says what to change."""


class BadAudio(BadRequest):
    """Pushed audio could not be decoded (``bad_audio``)."""


class BadStreamFormat(BadRequest):
    """The audio stream's ``format``, ``rate`` or ``channels`` is not accepted."""


class BadFrame(BadRequest):
    """A binary stream message was not whole samples, over 1 s, or held NaN/inf."""


class BadMessage(BadRequest):
    """A text stream message was not JSON or had an unknown ``type``."""


class Unauthorized(LipstreamError):
    """A token is missing, invalid, expired, or for another avatar (401)."""


class Forbidden(LipstreamError):
    """The token is valid but not allowed this (403)."""


class NotFound(LipstreamError):
    """The thing named does not exist (404)."""


class SessionNotFound(NotFound):
    """No such session: it ended, or never existed (``session_not_found``)."""


class Conflict(LipstreamError):
    """The request conflicts with the server's current state (409)."""


class StreamBusy(Conflict):
    """The session already has an audio stream open (``stream_busy``)."""


class PayloadTooLarge(LipstreamError):
    """The body is over the server's limit (413)."""


class RateLimited(LipstreamError):
    """Too many requests; wait ``retry_after`` seconds (429)."""


class AudioQueueFull(RateLimited):
    """The session's audio queue is full; send at real time (``audio_queue_full``)."""


class Overloaded(LipstreamError):
    """The server cannot take this now; try again after ``retry_after`` seconds (503)."""


class TooManySessions(Overloaded):
    """No room for another call, or the server is draining (``too_many_sessions``)."""


class TooManyViewers(Overloaded):
    """The session has as many viewers as the server allows (``too_many_viewers``)."""


class TtsUnavailable(LipstreamError):
    """The server has no working text-to-speech engine (``tts_unavailable``)."""


class ServerError(LipstreamError):
    """The server failed (5xx); its log says why."""


class LiveKitRefused(BadRequest):
    """The LiveKit URL or token cannot work (``bad_livekit_url``, ``bad_livekit_token``):
    the message says what to change in it."""


class LiveKitUnavailable(ServerError):
    """The avatar could not join its LiveKit room: the server has no LiveKit SDK
    (``livekit_not_installed``), or the LiveKit server could not be reached in time
    (``livekit_unreachable``)."""


class EventsOverflow(LipstreamError):
    """An event listener fell too far behind and was disconnected (``events_overflow``)."""


class StreamClosed(LipstreamError):
    """The audio stream is closed (by the app, the server, or the session's end)."""


class ConnectionFailed(LipstreamError):
    """The WebRTC call could not be set up: ICE failed, or it timed out."""


#: The class each server error code becomes.
ERRORS_BY_CODE: Mapping[str, type[LipstreamError]] = MappingProxyType(
    {
        # 400
        "bad_json": BadRequest,
        "bad_values": BadRequest,
        "bad_offer": BadRequest,
        "bad_text": BadRequest,
        "bad_input": BadRequest,
        "bad_path": BadRequest,
        "bad_device": BadRequest,
        "bad_content_type": BadRequest,
        "bad_body_size": BadRequest,
        "invalid_model_id": BadRequest,
        "bad_request": BadRequest,
        "bad_field": BadRequest,
        "bad_import": BadRequest,
        "missing_batch_size": BadRequest,
        "bad_batch_size": BadRequest,
        "bad_input_size": BadRequest,
        "bad_header_length": BadRequest,  # /v2 binary tensors: Inference-Header-Content-Length
        "bad_parameter": BadRequest,
        "import_failed": BadRequest,  # 422: the folder or model cannot be imported
        "bad_audio": BadAudio,
        "bad_stream_format": BadStreamFormat,
        "websocket_required": BadRequest,
        "unsupported_media_type": BadRequest,  # 415: a WHEP offer not sent as application/sdp
        "bad_output": BadRequest,  # a session's output (RTMP) the server cannot take
        "bad_frame": BadFrame,
        "bad_livekit_url": LiveKitRefused,
        "bad_livekit_token": LiveKitRefused,
        "bad_message": BadMessage,
        # 401, 403
        "unauthorized": Unauthorized,
        "forbidden": Forbidden,
        # 404
        "not_found": NotFound,
        "model_not_found": NotFound,
        "version_not_found": NotFound,
        "worker_not_found": NotFound,
        "clip_not_found": NotFound,  # the message lists the avatar's clips
        "not_found_in_session": NotFound,  # a viewer or output the session does not have
        "session_not_found": SessionNotFound,
        "session_lost": SessionNotFound,  # 410 (cluster): its worker restarted
        # 409
        "model_in_use": Conflict,
        "avatar_exists": Conflict,
        "avatar_incompatible": Conflict,  # a switch to another fps or audio features
        "avatar_switch_busy": Conflict,  # another switch of the call is loading
        "stream_busy": StreamBusy,
        "too_many_outputs": Conflict,  # the session has as many outputs as allowed
        # 413
        "audio_too_large": PayloadTooLarge,
        "body_too_large": PayloadTooLarge,
        "request_entity_too_large": PayloadTooLarge,
        # 429
        "rate_limited": RateLimited,
        "audio_queue_full": AudioQueueFull,
        # 503 with Retry-After
        "too_many_sessions": TooManySessions,
        "too_many_viewers": TooManyViewers,  # POST /sessions/{id}/whep past the limit
        "no_capacity": Overloaded,
        "queue_full": Overloaded,
        "out_of_memory": Overloaded,
        "shutting_down": Overloaded,
        "worker_unavailable": Overloaded,
        "model_not_ready": Overloaded,  # registry.load_on_infer is false: load it first
        "not_ready": Overloaded,
        "tts_unavailable": TtsUnavailable,
        # 5xx and 422: the server's side
        "internal_error": ServerError,
        "streaming_failed": ServerError,
        "tts_failed": ServerError,
        "livekit_not_installed": LiveKitUnavailable,
        "livekit_unreachable": LiveKitUnavailable,
        "model_invalid": ServerError,
        "model_load_failed": ServerError,
        "inference_failed": ServerError,
        "server_failed": ServerError,  # /health of a server that gave up (it exits)
        "compositing_failed": ServerError,
        "deadline_exceeded": ServerError,
        "import_disabled": NotFound,
        "load_timeout": ServerError,
        "worker_error": ServerError,
        "import_incomplete": ServerError,  # 502 (cluster): some workers have the avatar
        "not_loaded": Conflict,
        "unload": ServerError,
        # listeners and client-side failures
        "events_overflow": EventsOverflow,
        "stream_closed": StreamClosed,
        "connection_failed": ConnectionFailed,
    }
)

_ERRORS_BY_STATUS: Mapping[int, type[LipstreamError]] = MappingProxyType(
    {
        400: BadRequest,
        401: Unauthorized,
        403: Forbidden,
        404: NotFound,
        410: NotFound,
        415: BadRequest,
        422: BadRequest,
        409: Conflict,
        413: PayloadTooLarge,
        429: RateLimited,
        503: Overloaded,
    }
)


def error_for(
    code: str,
    message: str,
    *,
    status: int | None = None,
    retry_after: float | None = None,
) -> LipstreamError:
    """The typed error for a server error ``code`` (by ``status`` when the code is unknown)."""
    kind = ERRORS_BY_CODE.get(code)
    if kind is None and status is not None:
        kind = _ERRORS_BY_STATUS.get(status, ServerError if status >= 500 else LipstreamError)
    return (kind or LipstreamError)(message, code=code, status=status, retry_after=retry_after)


def error_from_body(status: int, body: bytes, headers: Mapping[str, str]) -> LipstreamError:
    """The typed error for an HTTP error response: its JSON ``error`` object, its status,
    and its ``Retry-After`` header (seconds)."""
    retry_after = _seconds(headers.get("Retry-After"))
    detail = _error_detail(body)
    if detail is None:  # not ours: a proxy's HTML page, say
        text = body.decode("utf-8", errors="replace").strip()[:200]
        return error_for(
            f"http_{status}", text or f"HTTP {status}", status=status, retry_after=retry_after
        )
    code, message = detail
    return error_for(code, message, status=status, retry_after=retry_after)


def error_from_message(message: Mapping[str, Any]) -> LipstreamError:
    """The typed error for a WebSocket or event-stream ``{"type": "error", ...}`` message."""
    detail = message.get("error")
    fields: Mapping[str, Any] = detail if isinstance(detail, Mapping) else message
    return error_for(str(fields.get("code", "error")), str(fields.get("message", "")))


def _error_detail(body: bytes) -> tuple[str, str] | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    detail = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(detail, dict) or not isinstance(detail.get("code"), str):
        return None
    return detail["code"], str(detail.get("message", ""))


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:  # an HTTP date: rare, and not what lipstream sends
        return None
