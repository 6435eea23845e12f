"""The HTTP API as an OpenAPI 3.1 document, served at ``GET /openapi.json``.

The document is plain data built by small helpers: one ``Error`` schema, one shared
response per error status (``Retry-After`` where the server sends it), and per operation
the error codes each status carries. ``tests/test_openapi.py`` checks it both ways
against the routes the app registers and validates real responses against it, so a
route or payload that changes without this document fails a test.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from aiohttp import web

from inference_core.avatar import AVATAR_ID_PATTERN
from streaming.audio_push import SUPPORTED_TYPES
from streaming.tts import VOICE_PATTERN
from web.infer_api import MAX_REQUEST_FRAMES

Json = dict[str, Any]

SECURITY_SCHEME = "adminToken"

# (status, shared response name, what it means, Retry-After: "always", "sometimes" or None)
_ERROR_STATUSES: tuple[tuple[int, str, str, str | None], ...] = (
    (400, "BadRequest", "The request is malformed or names something invalid.", None),
    (401, "Unauthorized", "A bearer token is configured and the request lacks it.", None),
    (403, "Forbidden", "The request is not allowed from where it came.", None),
    (404, "NotFound", "No such session, model or file.", None),
    (409, "Conflict", "The resource is in a state that forbids the request.", None),
    (413, "PayloadTooLarge", "The body is over a limit.", None),
    (429, "TooManyRequests", "Too much is queued; retry after `Retry-After` seconds.", "always"),
    (500, "InternalError", "The server failed; details are in its log.", None),
    (502, "BadGateway", "An upstream service (the text-to-speech engine) failed.", None),
    (503, "ServiceUnavailable", "The server is at capacity or stopping.", "sometimes"),
    (504, "GatewayTimeout", "The work did not finish before its deadline.", None),
)

# What each error code means, as operation descriptions list them.
_CODES: tuple[tuple[str, str], ...] = (
    ("bad_json", "the body is not a JSON object"),
    ("bad_field", "a field is missing or not a string"),
    ("bad_offer", "the SDP offer cannot be answered, or `type` is not `offer`"),
    ("bad_text", "the text is empty or too long, or the voice name is invalid"),
    ("bad_audio", "the audio cannot be decoded, or its content type or parameters are wrong"),
    ("invalid_model_id", "the avatar/model id is not `[a-z0-9_-]{1,64}`"),
    ("missing_batch_size", "the `batch_size` query parameter is missing"),
    ("bad_batch_size", f"`batch_size` is not an integer from 1 to {MAX_REQUEST_FRAMES}"),
    ("bad_body_size", "the body is not exactly the size `batch_size` needs"),
    ("bad_values", "the inputs hold NaN or infinity"),
    ("bad_input", "the tensors do not fit the model"),
    ("unauthorized", "no or a wrong bearer token"),
    ("forbidden", "not allowed from this address, or a directory was asked for"),
    ("session_not_found", "no live session has this id"),
    ("model_not_found", "no avatar/model with this id"),
    ("not_found", "no such file"),
    ("model_in_use", "live sessions hold the model"),
    ("body_too_large", "the body is over its limit"),
    ("audio_too_large", "the decoded audio is longer than one push may carry"),
    ("audio_queue_full", "the session's audio queue would exceed `session.max_queued_audio_s`"),
    ("internal_error", "an unexpected failure; see the server log"),
    ("streaming_failed", "the session could not be set up"),
    ("model_invalid", "the avatar package is malformed"),
    ("model_load_failed", "the model could not be loaded"),
    ("inference_failed", "the model failed to run"),
    ("tts_failed", "the text-to-speech engine failed"),
    ("too_many_sessions", "the server runs `server.max_sessions` sessions, or is stopping"),
    ("tts_unavailable", "no text-to-speech engine is configured or installed"),
    ("out_of_memory", "the device ran out of memory loading the model"),
    ("no_capacity", "no device has room for the model"),
    ("queue_full", "the device's queue is full"),
    ("shutting_down", "the inference core is stopping"),
    ("not_ready", "the server is not ready to take work"),
    ("deadline_exceeded", "the batch missed its deadline (`server.request_timeout_s`)"),
)

# Errors any model open can raise (sessions, raw inference, admin load).
_MODEL_OPEN_500 = ("model_invalid", "model_load_failed")
_MODEL_OPEN_503 = ("out_of_memory", "no_capacity", "shutting_down")
_JSON_BODY_400 = ("bad_json", "bad_field")

ADMIN_AUTH = (
    "Admin routes take `Authorization: Bearer <token>` when `server.admin_token` is set: "
    "without it, or with a wrong one, they answer 401. With no token configured they "
    "answer only requests from the loopback interface (127.0.0.1, ::1) and 403 to any "
    "other address, so an admin API is never open to the network by default."
)


def _ref(name: str, kind: str = "schemas") -> Json:
    return {"$ref": f"#/components/{kind}/{name}"}


def _obj(
    properties: Json, *, required: tuple[str, ...] | None = None, closed: bool = True, **extra: Any
) -> Json:
    """An object schema; every property is required unless ``required`` says otherwise.

    ``closed`` objects (``additionalProperties: false``) are what the server sends: it
    never adds a key the document does not name. Request bodies are open: the server
    ignores keys it does not know.
    """
    schema: Json = {
        "type": "object",
        "properties": properties,
        "required": list(properties if required is None else required),
        **extra,
    }
    if closed:
        schema["additionalProperties"] = False
    return schema


def _counts(description: str) -> Json:
    return {
        "type": "object",
        "additionalProperties": {"type": "integer", "minimum": 0},
        "description": description,
    }


def _json(schema: Json) -> Json:
    return {"application/json": {"schema": schema}}


def _response(description: str, schema: Json | None = None, **extra: Any) -> Json:
    response: Json = {"description": description, **extra}
    if schema is not None:
        response["content"] = _json(schema)
    return response


def _errors(spec: dict[int, tuple[str, ...]]) -> Json:
    """Shared error responses, each described by the codes this operation can send.

    500 ``internal_error`` is added everywhere: any handler can fail unexpectedly.
    """
    meanings = dict(_CODES)
    names = {status: name for status, name, _, _ in _ERROR_STATUSES}
    spec = {**spec, 500: ("internal_error", *spec.get(500, ()))}
    return {
        str(status): {
            **_ref(names[status], "responses"),
            "description": "; ".join(f"`{code}`: {meanings[code]}" for code in codes) + ".",
        }
        for status, codes in sorted(spec.items())
    }


def _op(
    operation_id: str,
    tag: str,
    summary: str,
    responses: Json,
    *,
    errors: dict[int, tuple[str, ...]] | None = None,
    description: str | None = None,
    parameters: tuple[Json, ...] = (),
    body: Json | None = None,
    admin: bool = False,
) -> Json:
    operation: Json = {"operationId": operation_id, "tags": [tag], "summary": summary}
    if description is not None:
        operation["description"] = description
    if parameters:
        operation["parameters"] = list(parameters)
    if body is not None:
        operation["requestBody"] = body
    if admin:
        # The empty requirement: no token at all is accepted (from loopback, see ADMIN_AUTH).
        operation["security"] = [{SECURITY_SCHEME: []}, {}]
        errors = {401: ("unauthorized",), 403: ("forbidden",), **(errors or {})}
    operation["responses"] = {**responses, **_errors(errors or {})}
    return operation


def _query(name: str, schema: Json, description: str, *, required: bool = False) -> Json:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "schema": schema,
        "description": description,
    }


def _file_responses(media: str, description: str) -> Json:
    """What aiohttp's file responses send: whole files, ranges, conditional answers."""
    return {
        "200": {"description": description, "content": {media: {}}},
        "206": {"description": "The requested byte range (`Range`).", "content": {media: {}}},
        "304": {"description": "Not modified since `If-Modified-Since`."},
        "412": {"description": "Modified since `If-Unmodified-Since`."},
        "416": {"description": "The requested range is outside the file."},
    }


# --- schemas ---------------------------------------------------------------------------


def _avatar_id(description: str) -> Json:
    return {
        "type": "string",
        "pattern": f"^{AVATAR_ID_PATTERN.pattern}$",
        "description": description,
    }


def _session_schemas() -> Json:
    session_id = {
        "type": "string",
        "pattern": "^[A-Za-z0-9_-]+$",
        "description": "Random, URL-safe; names the session in `/sessions/{session_id}`.",
    }
    return {
        "Offer": _obj(
            {
                "sdp": {"type": "string", "description": "The caller's complete SDP offer."},
                "type": {"type": "string", "enum": ["offer"]},
                "avatar": {
                    "type": ["string", "null"],
                    "pattern": f"^({AVATAR_ID_PATTERN.pattern})?$",
                    "default": "demo",
                    "description": "Avatar id (see `GET /avatars`); empty or null means `demo`.",
                },
            },
            required=("sdp", "type"),
            closed=False,
            description="At most `server.max_offer_bytes` of JSON.",
        ),
        "Answer": _obj(
            {
                "sdp": {"type": "string", "description": "The server's SDP answer."},
                "type": {"type": "string", "enum": ["answer"]},
                "session_id": session_id,
            }
        ),
        "SessionState": _obj(
            {
                "session_id": session_id,
                "avatar": _avatar_id("The avatar this session shows."),
                "state": {
                    "type": "string",
                    "enum": ["new", "connected", "streaming", "closed"],
                    "description": "`new` until ICE connects, `streaming` once media flows.",
                },
                "uptime_s": {"type": "number", "minimum": 0},
                "frames_sent": {"type": "integer", "minimum": 0},
                "frames_inferred": {"type": "integer", "minimum": 0},
                "frames_skipped": {"type": "integer", "minimum": 0},
                "frames_dropped": _counts(
                    "Frames shown idle instead of lip-synced, by reason "
                    "(`late`, `overload`, `not_ready`, or an error's name)."
                ),
                "delay_ms": {
                    "type": "number",
                    "description": "Lookahead + one audio tick + `session.pipeline_margin_ms`.",
                },
                "lookahead_ms": {"type": "number"},
                "added_delay_ms": _obj(
                    {"p50": {"type": "number"}, "p95": {"type": "number"}},
                    description="Time from a frame's audio being complete to it being ready.",
                ),
                "queued_audio_s": {"type": "number", "minimum": 0},
                "buffered": _obj(
                    {
                        "audio_chunks": {"type": "integer", "minimum": 0},
                        "frames": {"type": "integer", "minimum": 0},
                    }
                ),
                "remote": {
                    "type": ["string", "null"],
                    "description": "The caller's address as the server saw it.",
                },
            }
        ),
        "HungUp": _obj({"session_id": session_id, "state": {"type": "string", "enum": ["closed"]}}),
        "Say": _obj(
            {
                "text": {
                    "type": "string",
                    "minLength": 1,
                    "description": "At most `session.max_say_chars` characters; control "
                    "characters become spaces.",
                },
                "voice": {
                    "type": ["string", "null"],
                    "pattern": VOICE_PATTERN,
                    "description": "An engine voice such as `en`, `en-us` or `en+f3` "
                    "(default `tts.voice`).",
                },
            },
            required=("text",),
            closed=False,
        ),
        "Queued": _obj(
            {
                "duration_ms": {"type": "number", "minimum": 0, "description": "This audio."},
                "queued_ms": {
                    "type": "number",
                    "minimum": 0,
                    "description": "All audio now queued in the session, this included.",
                },
            }
        ),
        "Interrupted": _obj(
            {"dropped_ms": {"type": "number", "minimum": 0, "description": "Audio dropped."}}
        ),
        "Avatars": _obj(
            {
                "avatars": {
                    "type": "array",
                    "items": _obj(
                        {
                            "id": _avatar_id("Pass as `avatar` in `POST /offer`."),
                            "name": {"type": "string", "description": "Display name."},
                        }
                    ),
                }
            }
        ),
        "WebRtcConfig": _obj(
            {
                "iceServers": {
                    "type": "array",
                    "items": _obj(
                        {
                            "urls": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                            "username": {"type": "string"},
                            "credential": {"type": "string"},
                        },
                        required=("urls",),
                    ),
                    "description": "`server.ice_servers`, ready for `new RTCPeerConnection()`.",
                }
            }
        ),
    }


def _admin_schemas() -> Json:
    return {
        "AdminModels": {"type": "object"},
        "AdminModel": {"type": "object"},
        "AdminStats": {"type": "object"},
        "AdminSessions": {"type": "object"},
        "LoadRequest": _obj(
            {"device": {"type": ["integer", "null"], "minimum": 0}}, required=(), closed=False
        ),
    }


def _health_schemas() -> Json:
    return {
        "Health": {"type": "object"},
        "Ready": {"type": "object"},
    }


def _schemas() -> Json:
    return {
        "Error": _obj(
            {
                "error": _obj(
                    {
                        "code": {
                            "type": "string",
                            "pattern": "^[a-z0-9_]+$",
                            "description": "Stable, for programs; each operation lists its own.",
                        },
                        "message": {"type": "string", "description": "For people: what to do."},
                    }
                )
            },
            description="Every error the server sends, with any 4xx or 5xx status.",
        ),
        **_session_schemas(),
        **_admin_schemas(),
        **_health_schemas(),
    }


def _responses() -> Json:
    responses: Json = {}
    for status, name, description, retry_after in _ERROR_STATUSES:
        response = _response(f"{status}: {description}", _ref("Error"))
        if retry_after is not None:
            response["headers"] = {
                "Retry-After": {
                    "required": retry_after == "always",
                    "schema": {"type": "integer", "minimum": 0},
                    "description": "Seconds to wait before retrying"
                    + ("." if retry_after == "always" else "; sent with capacity errors."),
                }
            }
        responses[name] = response
    return responses


# --- paths -----------------------------------------------------------------------------


def _session_paths() -> Json:
    session = (_ref("SessionId", "parameters"),)
    json_body: Json = {"required": True, "content": _json(_ref("Say"))}
    return {
        "/offer": {
            "post": _op(
                "create_session",
                "sessions",
                "Answer a WebRTC offer: start a session with an avatar",
                {"200": _response("The SDP answer; apply it to start media.", _ref("Answer"))},
                description="Send the offer once ICE gathering is complete (the server "
                "does not trickle). Offer video (`recvonly`); audio is optional. The "
                "session starts once ICE connects and ends if it does not within "
                "`session.ice_timeout_s`.",
                body={"required": True, "content": _json(_ref("Offer"))},
                errors={
                    400: (*_JSON_BODY_400, "invalid_model_id", "bad_offer"),
                    404: ("model_not_found",),
                    413: ("body_too_large",),
                    500: (*_MODEL_OPEN_500, "streaming_failed"),
                    503: ("too_many_sessions", *_MODEL_OPEN_503),
                },
            )
        },
        "/sessions/{session_id}": {
            "parameters": list(session),
            "get": _op(
                "get_session",
                "sessions",
                "A session's state and counters",
                {"200": _response("The session.", _ref("SessionState"))},
                errors={404: ("session_not_found",)},
            ),
            "delete": _op(
                "hang_up",
                "sessions",
                "Hang up",
                {"200": _response("The session is closed.", _ref("HungUp"))},
                errors={404: ("session_not_found",)},
            ),
        },
        "/sessions/{session_id}/audio": {
            "parameters": list(session),
            "post": _op(
                "push_audio",
                "sessions",
                "Queue audio for the avatar to speak",
                {"202": _response("Queued; it plays in real time.", _ref("Queued"))},
                description="An audio file (the `Content-Type` names its format; any rate "
                "and channel count) or raw PCM: `audio/L16; rate=16000[; channels=N]` "
                "(big-endian s16) or `application/octet-stream` / `audio/pcm` with "
                "`format`, `rate` and `channels` as query or content-type parameters. At "
                "most `session.max_audio_push_bytes` bytes and 600 s per push.",
                parameters=(
                    _query(
                        "format",
                        {"type": "string", "enum": ["s16le", "f32le"]},
                        "Raw PCM sample format (required for `application/octet-stream`).",
                    ),
                    _query(
                        "rate",
                        {"type": "integer", "minimum": 1000, "maximum": 384000},
                        "Raw PCM sample rate in Hz (required for raw PCM).",
                    ),
                    _query(
                        "channels",
                        {"type": "integer", "minimum": 1, "maximum": 32},
                        "Raw PCM channels, interleaved (default 1 for `audio/L16`, "
                        "required otherwise).",
                    ),
                ),
                body={"required": True, "content": {media: {} for media in SUPPORTED_TYPES}},
                errors={
                    400: ("bad_audio",),
                    404: ("session_not_found",),
                    413: ("body_too_large", "audio_too_large"),
                    429: ("audio_queue_full",),
                },
            ),
        },
        "/sessions/{session_id}/say": {
            "parameters": list(session),
            "post": _op(
                "say",
                "sessions",
                "Speak text through text-to-speech",
                {"202": _response("Synthesized and queued.", _ref("Queued"))},
                body=json_body,
                errors={
                    400: (*_JSON_BODY_400, "bad_text"),
                    404: ("session_not_found",),
                    413: ("body_too_large",),
                    429: ("audio_queue_full",),
                    502: ("tts_failed",),
                    503: ("tts_unavailable",),
                },
            ),
        },
        "/sessions/{session_id}/interrupt": {
            "parameters": list(session),
            "post": _op(
                "interrupt",
                "sessions",
                "Drop queued audio and frames: the avatar goes idle",
                {"200": _response("Interrupted.", _ref("Interrupted"))},
                errors={404: ("session_not_found",)},
            ),
        },
        "/avatars": {
            "get": _op(
                "list_avatars",
                "sessions",
                "The avatars a client can ask for",
                {"200": _response("Sorted by id.", _ref("Avatars"))},
            )
        },
        "/webrtc-config": {
            "get": _op(
                "webrtc_config",
                "sessions",
                "ICE servers for the client's peer connection",
                {
                    "200": _response(
                        "Credentials included: they are meant for clients.", _ref("WebRtcConfig")
                    )
                },
            )
        },
    }


def _infer_path() -> Json:
    float_body: Json = {"application/octet-stream": {}}
    header = {"required": True, "schema": {"type": "string"}}
    return {
        "/v1/infer/{model_id}": {
            "post": _op(
                "infer",
                "inference",
                "Run a raw batch through an avatar's model",
                {
                    "200": {
                        "description": "`N` outputs, float32 little-endian, channel-planar "
                        "(`[N,3,S,S]`, values in [0, 1]).",
                        "headers": {
                            "X-Lipstream-Device": {
                                **header,
                                "description": "The device that ran it, e.g. `cuda:0`, `cpu:1`.",
                            },
                            "X-Lipstream-Inference-Ms": {
                                **header,
                                "description": "Queue + compute time in milliseconds.",
                            },
                            "X-Lipstream-Batch-Size": {
                                "required": True,
                                "schema": {"type": "integer", "minimum": 1},
                            },
                            "X-Lipstream-Output-Shape": {
                                **header,
                                "description": "Comma-separated, e.g. `2,3,320,320`.",
                            },
                        },
                        "content": float_body,
                    }
                },
                description="For deployments that composite elsewhere. The body is `N` "
                "visual inputs (float32 little-endian, `[6,S,S]` each, scaled as the model "
                "expects) followed by `N` audio windows (float32, `[32,16,16]` each for "
                "unet_328). Batches larger than the model's are split.",
                parameters=(
                    {
                        "name": "model_id",
                        "in": "path",
                        "required": True,
                        "schema": _avatar_id("An avatar id."),
                    },
                    _query(
                        "batch_size",
                        {"type": "integer", "minimum": 1, "maximum": MAX_REQUEST_FRAMES},
                        "`N`, the number of frames in the body.",
                        required=True,
                    ),
                ),
                body={"required": True, "content": float_body},
                errors={
                    400: (
                        "invalid_model_id",
                        "missing_batch_size",
                        "bad_batch_size",
                        "bad_body_size",
                        "bad_values",
                        "bad_input",
                    ),
                    404: ("model_not_found",),
                    413: ("bad_body_size",),
                    500: (*_MODEL_OPEN_500, "inference_failed"),
                    503: (*_MODEL_OPEN_503, "queue_full"),
                    504: ("deadline_exceeded",),
                },
            )
        }
    }


def _admin_paths() -> Json:
    model = (_ref("ModelId", "parameters"),)
    session = (_ref("SessionId", "parameters"),)
    return {
        "/admin": {
            "get": _op(
                "admin_page",
                "admin",
                "The admin page",
                {"200": {"description": "HTML.", "content": {"text/html": {}}}},
                admin=True,
            )
        },
        "/admin/models": {
            "get": _op(
                "list_models",
                "admin",
                "Every registered model: loaded or not, where, and its counters",
                {"200": _response("The models.", _ref("AdminModels"))},
                admin=True,
            )
        },
        "/admin/models/{model_id}/load": {
            "parameters": list(model),
            "post": _op(
                "load_model",
                "admin",
                "Load a model (no-op when loaded)",
                {"200": _response("Loaded.", _ref("AdminModel"))},
                body={"required": False, "content": _json(_ref("LoadRequest"))},
                errors={
                    400: (*_JSON_BODY_400, "invalid_model_id"),
                    404: ("model_not_found",),
                    500: _MODEL_OPEN_500,
                    503: _MODEL_OPEN_503,
                },
                admin=True,
            ),
        },
        "/admin/models/{model_id}/unload": {
            "parameters": list(model),
            "post": _op(
                "unload_model",
                "admin",
                "Unload a model now",
                {"200": _response("Unloaded.", _ref("AdminModel"))},
                errors={
                    400: ("invalid_model_id",),
                    404: ("model_not_found",),
                    409: ("model_in_use",),
                },
                admin=True,
            ),
        },
        "/admin/stats": {
            "get": _op(
                "stats",
                "admin",
                "Server-wide counters",
                {"200": _response("The counters.", _ref("AdminStats"))},
                admin=True,
            )
        },
        "/admin/sessions": {
            "get": _op(
                "list_sessions",
                "admin",
                "Every live session",
                {"200": _response("The sessions.", _ref("AdminSessions"))},
                admin=True,
            )
        },
        "/admin/sessions/{session_id}": {
            "parameters": list(session),
            "delete": _op(
                "end_session",
                "admin",
                "End a session",
                {"200": _response("The session is closed.", _ref("HungUp"))},
                errors={404: ("session_not_found",)},
                admin=True,
            ),
        },
    }


def _service_paths() -> Json:
    return {
        "/health": {
            "get": _op(
                "health",
                "service",
                "Liveness: the process answers",
                {"200": _response("Alive.", _ref("Health"))},
            )
        },
        "/ready": {
            "get": _op(
                "ready",
                "service",
                "Readiness: the server takes new sessions and inference",
                {
                    "200": _response("Ready.", _ref("Ready")),
                    "503": _response("Not ready.", _ref("Ready")),
                },
            )
        },
        "/metrics": {
            "get": _op(
                "metrics",
                "service",
                "Prometheus metrics",
                {
                    "200": {
                        "description": "Prometheus text exposition format 0.0.4.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            )
        },
        "/openapi.json": {
            "get": _op(
                "openapi",
                "service",
                "This document",
                {"200": _response("OpenAPI 3.1.", {"type": "object"})},
            )
        },
        "/": {
            "get": _op(
                "demo_page",
                "service",
                "The browser demo page",
                _file_responses("text/html", "HTML."),
            )
        },
        "/static/{filename}": {
            "get": _op(
                "static_file",
                "service",
                "Files of the demo page",
                _file_responses("*/*", "The file, typed by its extension."),
                parameters=(
                    {
                        "name": "filename",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                ),
                errors={403: ("forbidden",), 404: ("not_found",)},
            )
        },
    }


def _version() -> str:
    try:
        return version("lipstream")
    except PackageNotFoundError:
        return "0+unknown"


def openapi_document() -> Json:
    """The whole HTTP API as an OpenAPI 3.1 document (JSON-ready data)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "lipstream",
            "version": _version(),
            "summary": "Self-hosted real-time talking-avatar server.",
            "description": "WebRTC signalling and session control, raw batch inference, "
            "admin, health and metrics. Every error is JSON "
            '`{"error": {"code", "message"}}`; each operation lists its codes by status.',
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [
            {"name": "sessions", "description": "WebRTC calls with an avatar."},
            {"name": "inference", "description": "Raw batch inference."},
            {"name": "admin", "description": ADMIN_AUTH},
            {"name": "service", "description": "Health, metrics, this document, demo page."},
        ],
        "paths": {
            **_session_paths(),
            **_infer_path(),
            **_admin_paths(),
            **_service_paths(),
        },
        "components": {
            "schemas": _schemas(),
            "responses": _responses(),
            "parameters": {
                "SessionId": {
                    "name": "session_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                    "description": "From `POST /offer`.",
                },
                "ModelId": {
                    "name": "model_id",
                    "in": "path",
                    "required": True,
                    "schema": _avatar_id("An avatar id: each avatar has its own model."),
                },
            },
            "securitySchemes": {
                SECURITY_SCHEME: {"type": "http", "scheme": "bearer", "description": ADMIN_AUTH}
            },
        },
    }


def add_openapi_routes(app: web.Application) -> None:
    """Serve the document at ``GET /openapi.json`` (serialized once)."""
    body = json.dumps(openapi_document(), separators=(",", ":"))

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    app.router.add_get("/openapi.json", openapi)
