"""Every error leaves as JSON: ``{"error": {"code": ..., "message": ...}}`` with the right status.

Library errors (each package's root: ``InferenceError``, ``AvatarError``,
``AudioInputError``, ``TtsError``, ``StreamingError``, ``CompositorError``) map to
statuses here, in one place; handlers just raise. Anything unexpected is logged with its
traceback and answered 500 without internals.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

from aiohttp import web

from compositor.clips import ClipNotFoundError
from compositor.exceptions import CompositorError
from inference_core.avatars.exceptions import (
    AvatarError,
    AvatarInvalidError,
    AvatarNotFoundError,
    InvalidAvatarIdError,
)
from inference_core.exceptions import (
    CapacityError,
    DeadlineExceededError,
    InferenceError,
    ModelInputError,
    ModelInUseError,
    ModelLoadError,
    ModelOutOfMemoryError,
    QueueFullError,
    ShuttingDownError,
)
from inference_core.importers import ImportFailedError
from streaming.audio_in.exceptions import (
    AudioFrameError,
    AudioInputError,
    AudioQueueFullError,
    AudioTooLargeError,
    StreamFormatError,
    TtsError,
    TtsInputError,
    TtsUnavailableError,
)
from streaming.exceptions import (
    AvatarIncompatibleError,
    AvatarSwitchBusyError,
    LiveKitJoinError,
    LiveKitNotInstalledError,
    LiveKitTokenError,
    LiveKitUrlError,
    OfferError,
    OutputError,
    OutputLimitError,
    PartNotFoundError,
    SessionLimitError,
    SessionNotFoundError,
    StreamBusyError,
    StreamingError,
    ViewerLimitError,
)
from web.schemas import Error, ErrorDetail

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The root of every package's errors: raised by a handler, each becomes a JSON response.
LIBRARY_ERRORS: tuple[type[Exception], ...] = (
    InferenceError,
    AvatarError,
    AudioInputError,
    TtsError,
    StreamingError,
    CompositorError,
)

# (exception type, HTTP status, error code, Retry-After seconds or None); first match wins.
_MAPPING: tuple[tuple[type[Exception], int, str, int | None], ...] = (
    (OfferError, 400, "bad_offer", None),
    (PartNotFoundError, 404, "not_found_in_session", None),
    (SessionNotFoundError, 404, "session_not_found", None),
    (ViewerLimitError, 503, "too_many_viewers", 5),
    (SessionLimitError, 503, "too_many_sessions", 5),
    (OutputError, 400, "bad_output", None),
    (OutputLimitError, 409, "too_many_outputs", None),
    (StreamBusyError, 409, "stream_busy", None),
    (AvatarSwitchBusyError, 409, "avatar_switch_busy", None),
    (AvatarIncompatibleError, 409, "avatar_incompatible", None),
    (ClipNotFoundError, 404, "clip_not_found", None),
    (LiveKitNotInstalledError, 501, "livekit_not_installed", None),
    (LiveKitUrlError, 400, "bad_livekit_url", None),
    (LiveKitTokenError, 400, "bad_livekit_token", None),
    (LiveKitJoinError, 502, "livekit_unreachable", None),
    (StreamingError, 500, "streaming_failed", None),
    (AudioTooLargeError, 413, "audio_too_large", None),
    (AudioQueueFullError, 429, "audio_queue_full", 2),
    (StreamFormatError, 400, "bad_stream_format", None),
    (AudioFrameError, 400, "bad_frame", None),
    (AudioInputError, 400, "bad_audio", None),
    (TtsUnavailableError, 503, "tts_unavailable", None),
    (TtsInputError, 400, "bad_text", None),
    (TtsError, 502, "tts_failed", None),
    (InvalidAvatarIdError, 400, "invalid_model_id", None),
    (AvatarNotFoundError, 404, "model_not_found", None),
    (AvatarInvalidError, 500, "model_invalid", None),
    (AvatarError, 500, "model_invalid", None),
    (ModelOutOfMemoryError, 503, "out_of_memory", 5),
    (ModelLoadError, 500, "model_load_failed", None),
    (ModelInputError, 400, "bad_input", None),
    (CapacityError, 503, "no_capacity", 5),
    (ModelInUseError, 409, "model_in_use", None),
    (QueueFullError, 503, "queue_full", 1),
    (DeadlineExceededError, 504, "deadline_exceeded", None),
    (ShuttingDownError, 503, "shutting_down", 5),
    (ImportFailedError, 422, "import_failed", None),
    (InferenceError, 500, "inference_failed", None),
    (CompositorError, 500, "compositing_failed", None),
)


def json_error(
    status: int, code: str, message: str, *, retry_after: int | None = None
) -> web.Response:
    """A JSON error response."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    body = Error(error=ErrorDetail(code=code, message=message))
    return web.json_response(body.dump(), status=status, headers=headers)


class RequestError(Exception):
    """Raised by handlers for a bad request: becomes a JSON 4xx response."""

    def __init__(
        self, status: int, code: str, message: str, *, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


def classify(exc: Exception) -> RequestError:
    """``exc`` as the status, code, message and Retry-After it is answered with.

    Every front door shares this table: the JSON API, the Open Inference Protocol's
    ``{"error": "..."}`` bodies and the gRPC status codes (``web/inference/grpc_status.py``).
    Anything not mapped is a 500 whose message hides the internals.
    """
    if isinstance(exc, RequestError):
        return exc
    for kind, status, code, retry_after in _MAPPING:
        if isinstance(exc, kind):
            return RequestError(status, code, str(exc), retry_after=retry_after)
    return RequestError(500, "internal_error", "internal server error; see the server log")


def response_for(exc: Exception) -> web.Response:
    """The JSON response for a library error (500 for anything not mapped)."""
    error = classify(exc)
    response = json_error(error.status, error.code, str(error), retry_after=error.retry_after)
    if error.status == 401:  # RFC 7235: a 401 names the scheme to use
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn raised errors (ours and aiohttp's HTTP errors) into JSON error bodies."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # "Not Found" -> not_found: codes are [a-z0-9_]+, as the Error model says.
        code = re.sub(r"[^a-z0-9]+", "_", exc.reason.lower())
        return json_error(exc.status, code, exc.text or exc.reason)
    except (RequestError, *LIBRARY_ERRORS) as exc:  # type: ignore[misc]
        response = response_for(exc)
        if response.status >= 500:
            logger.warning("%s %s failed: %s", request.method, request.path, exc)
        return response
    except Exception:
        logger.exception("unhandled error in %s %s", request.method, request.path)
        return json_error(500, "internal_error", "internal server error; see the server log")
