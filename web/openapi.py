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

from inference_core.avatars.package import AVATAR_ID_PATTERN
from streaming.audio_in.push import SUPPORTED_TYPES
from streaming.audio_in.tts import VOICE_PATTERN
from web.schemas import MAX_REQUEST_FRAMES

Json = dict[str, Any]

ADMIN_SCHEME = "adminToken"
SESSION_SCHEME = "sessionToken"

# (status, shared response name, what it means, the header it carries, if any)
_ERROR_STATUSES: tuple[tuple[int, str, str, str | None], ...] = (
    (400, "BadRequest", "The request is malformed or names something invalid.", None),
    (401, "Unauthorized", "The bearer token is missing or not valid.", "WWW-Authenticate?"),
    (403, "Forbidden", "The request is not allowed from where it came.", None),
    (404, "NotFound", "No such session, model or file.", None),
    (409, "Conflict", "The resource is in a state that forbids the request.", None),
    (413, "PayloadTooLarge", "The body is over a limit.", None),
    (429, "TooManyRequests", "Too many requests or too much queued; retry later.", "Retry-After"),
    (500, "InternalError", "The server failed; details are in its log.", None),
    (502, "BadGateway", "An upstream service (the text-to-speech engine) failed.", None),
    (503, "ServiceUnavailable", "The server is at capacity or stopping.", "Retry-After?"),
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
    ("unauthorized", "tokens are required here and the bearer token is missing or not valid"),
    ("rate_limited", "more than `server.offer_rate_limit_per_minute` offers from this address"),
    (
        "forbidden",
        "no admin token is configured and the request is not from this machine (a "
        "non-loopback peer, a proxy header, a foreign `Host` or `Origin`); for files: a "
        "directory",
    ),
    ("session_not_found", "no live session has this id"),
    ("model_not_found", "no avatar/model with this id"),
    ("bad_device", "`device` is not the index of one of the server's devices"),
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
    (
        "too_many_sessions",
        "no capacity for one more session (server.max_sessions, a device's inference "
        "budget or the CPU budget), or the server is stopping",
    ),
    ("tts_unavailable", "no text-to-speech engine is configured or installed"),
    ("out_of_memory", "the device ran out of memory loading the model"),
    ("no_capacity", "no device has room for the model"),
    ("queue_full", "the device's queue is full"),
    ("shutting_down", "the inference core is stopping"),
    ("deadline_exceeded", "the batch missed its deadline (`server.request_timeout_s`)"),
    ("load_timeout", "still loading after `registry.load_timeout_s`; it goes on loading"),
)

# Errors any model open can raise (sessions, raw inference, admin load).
_MODEL_OPEN_500 = ("model_invalid", "model_load_failed")
_MODEL_OPEN_503 = ("out_of_memory", "no_capacity", "shutting_down")
_JSON_BODY_400 = ("bad_json", "bad_field")

ADMIN_AUTH = (
    "With `server.admin_token` set, every admin JSON route needs "
    "`Authorization: Bearer <token>` and answers 401 (`WWW-Authenticate: Bearer`) without it "
    "or with a wrong one. With no token configured (the default), admin routes answer only "
    "requests from a loopback peer (127.0.0.0/8, ::1) that carry no proxy header "
    "(`Forwarded`, `X-Forwarded-For`, `X-Real-IP`: a reverse proxy on the same host would "
    "otherwise pass remote clients off as local), whose `Host` names this machine (no DNS "
    "rebinding) and whose `Origin`, if sent, is a loopback one (no cross-site requests "
    "from a local browser), and 403 to anything else. The admin "
    "page (`GET /admin`) needs no token, only the loopback rule when no token is set."
)


SESSION_AUTH = (
    "With `auth.jwt_secret` set, `POST /offer` and every `/sessions/{session_id}` route "
    "need `Authorization: Bearer <JWT>`: signed with `auth.jwt_algorithm`, with `iat`, "
    "`exp` (at most `auth.max_ttl_s` after `iat`) and an `avatar` claim naming the avatar "
    "of the offer or of the session (`lipstream token mint` makes one). Without a secret "
    "(the default) no token is needed. An unknown session id answers 404 before the "
    "token is checked."
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
    auth: str | None = None,
) -> Json:
    operation: Json = {"operationId": operation_id, "tags": [tag], "summary": summary}
    if description is not None:
        operation["description"] = description
    if parameters:
        operation["parameters"] = list(parameters)
    if body is not None:
        operation["requestBody"] = body
    if auth is not None:
        # The empty requirement: no token is needed when the server has none configured.
        operation["security"] = [{auth: []}, {}]
        denied = {401: ("unauthorized",), 403: ("forbidden",)} if auth == ADMIN_SCHEME else {}
        errors = {**denied, 401: ("unauthorized",), **(errors or {})}
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
                "output_fps": {
                    "type": "number",
                    "minimum": 0,
                    "description": "Video frames sent per second over about the last 5 s.",
                },
                "av_offset_ms": {
                    "type": ["number", "null"],
                    "description": "Next audio chunk's time minus next video frame's time "
                    "(about 0); null before media flows or without an audio track.",
                },
                "bitrate_bps": {
                    "type": ["integer", "null"],
                    "description": "The video encoder's target bitrate, once it exists.",
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
    count = {"type": "integer", "minimum": 0}
    number = {"type": "number", "minimum": 0}
    when = {"type": ["string", "null"], "format": "date-time", "description": "UTC."}
    return {
        "Model": _obj(
            {
                "id": _avatar_id("The model's avatar id."),
                "state": {"type": "string", "enum": ["registered", "loading", "loaded", "failed"]},
                "device": {"type": ["string", "null"], "description": "Where it is loaded."},
                "memory_bytes": count,
                "usage_count": count,
                "frames": count,
                "total_inference_ms": number,
                "mean_inference_ms": number,
                "last_used": when,
                "loaded_at": when,
                "load_seconds": {"type": ["number", "null"], "minimum": 0},
                "last_error": {"type": ["string", "null"]},
                "refcount": {**count, "description": "Sessions and requests holding it."},
            }
        ),
        "Models": _obj({"models": {"type": "array", "items": _ref("Model")}}),
        "LoadRequest": _obj(
            {
                "device": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "description": "Device index (see `GET /admin/stats`); default: placement "
                    "by `registry.assignment`.",
                }
            },
            required=(),
            closed=False,
            description="Optional: an empty body loads where placement puts the model.",
        ),
        "Device": _obj(
            {
                "name": {"type": "string", "description": "e.g. `cuda:0`, `cpu:0`."},
                "kind": {"type": "string", "enum": ["cpu", "cuda"]},
                "models_loaded": count,
                "memory_used_bytes": {**count, "description": "Measured memory of its models."},
                "memory_total_bytes": {"type": ["integer", "null"], "minimum": 0},
                "queue_depth": count,
                "batches": count,
                "frames": count,
                "busy_fraction": {"type": "number", "minimum": 0},
                "mean_batch_size": number,
                "expired": {**count, "description": "Frames dropped at their deadline."},
                "rejected": {**count, "description": "Frames refused by a full queue."},
                "workers_restarted": {
                    **count,
                    "description": "Worker threads that died and were replaced.",
                },
                "workers": {
                    "type": "array",
                    "items": _obj(
                        {
                            "name": {"type": "string"},
                            "batches": count,
                            "frames": count,
                            "busy_seconds": number,
                        }
                    ),
                },
            }
        ),
        "Stats": _obj(
            {
                "models": {"type": "array", "items": _ref("Model")},
                "devices": {"type": "array", "items": _ref("Device")},
                "cache": _obj(
                    {
                        "hits": count,
                        "misses": count,
                        "hit_rate": {"type": "number", "minimum": 0, "maximum": 1},
                        "evictions": count,
                        "bytes": count,
                        "max_bytes": count,
                        "entries": count,
                    },
                    description="The background-frame cache.",
                ),
                "global": _obj(
                    {
                        "models_registered": count,
                        "models_loaded": count,
                        "live_sessions": count,
                        "sessions_started": count,
                        "sessions_ended": count,
                        "sessions_rejected": count,
                        "frames_served": count,
                        "frames_dropped": _counts("Frames not served, by reason."),
                        "evictions": _counts("Model evictions: `capacity`, `idle`, `admin`."),
                        "uptime_s": number,
                        "version": {"type": "string"},
                    }
                ),
            }
        ),
        "SessionInfo": _obj(
            {
                "id": {"type": "string", "description": "The session id."},
                "avatar": _avatar_id("The avatar this session shows."),
                "state": {"type": "string", "enum": ["new", "connected", "streaming", "closed"]},
                "uptime_s": number,
                "output_fps": number,
                "added_delay_ms": _obj({"p50": {"type": "number"}, "p95": {"type": "number"}}),
                "av_offset_ms": {"type": ["number", "null"]},
                "frames_dropped": _counts("Frames shown idle instead of lip-synced, by reason."),
                "bitrate_bps": {"type": ["integer", "null"]},
                "remote": {"type": ["string", "null"]},
            }
        ),
        "Sessions": _obj({"sessions": {"type": "array", "items": _ref("SessionInfo")}}),
    }


def _health_schemas() -> Json:
    reasons = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    return {
        "Health": _obj({"status": {"type": "string", "enum": ["ok"]}}),
        "Ready": _obj(
            {
                "ready": {"type": "boolean", "const": True},
                "avatar_root": {
                    "type": "string",
                    "description": "`readable`, or `absent (demo avatar only)`.",
                },
                "devices": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Devices with running inference workers.",
                },
                "draining": {"type": "boolean", "const": False},
            }
        ),
        "NotReady": _obj(
            {
                "ready": {"type": "boolean", "const": False},
                "reasons": {**reasons, "description": "Every reason, for people."},
            },
            description="Not the `Error` shape: a probe reads the status, a person the reasons.",
        ),
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


def _header(name: str) -> Json:
    """A response header; a trailing ``?`` marks one sent only with some error codes."""
    if name.startswith("WWW-Authenticate"):
        return {
            "required": False,
            "schema": {"type": "string", "enum": ["Bearer"]},
            "description": "Sent by the admin routes (the session routes do not send it).",
        }
    return {
        "required": not name.endswith("?"),
        "schema": {"type": "integer", "minimum": 0},
        "description": "Seconds to wait before retrying"
        + ("; sent with the capacity errors." if name.endswith("?") else "."),
    }


def _responses() -> Json:
    responses: Json = {}
    for status, name, description, header in _ERROR_STATUSES:
        response = _response(f"{status}: {description}", _ref("Error"))
        if header is not None:
            response["headers"] = {header.rstrip("?"): _header(header)}
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
                auth=SESSION_SCHEME,
                errors={
                    400: (*_JSON_BODY_400, "invalid_model_id", "bad_offer"),
                    404: ("model_not_found",),
                    413: ("body_too_large",),
                    429: ("rate_limited",),
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
                auth=SESSION_SCHEME,
                errors={404: ("session_not_found",)},
            ),
            "delete": _op(
                "hang_up",
                "sessions",
                "Hang up",
                {"200": _response("The session is closed.", _ref("HungUp"))},
                auth=SESSION_SCHEME,
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
                auth=SESSION_SCHEME,
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
                auth=SESSION_SCHEME,
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
                auth=SESSION_SCHEME,
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
                    413: ("bad_body_size", "body_too_large"),
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
                {
                    "200": {
                        "description": "HTML; its data comes from the JSON routes.",
                        "content": {"text/html": {}},
                    }
                },
                description="Served without a token even when one is configured (a browser "
                "navigation cannot send one; the page asks for it and sends it with every "
                "JSON call). With no token configured, the loopback rule applies.",
                errors={403: ("forbidden",)},
            )
        },
        "/admin/models": {
            "get": _op(
                "list_models",
                "admin",
                "Every registered model, loaded or not",
                {"200": _response("The models.", _ref("Models"))},
                auth=ADMIN_SCHEME,
            )
        },
        "/admin/models/{model_id}/load": {
            "parameters": list(model),
            "post": _op(
                "load_model",
                "admin",
                "Load a model now and wait for it (a loaded model stays where it is)",
                {"200": _response("Loaded.", _ref("Model"))},
                body={"required": False, "content": _json(_ref("LoadRequest"))},
                errors={
                    400: ("invalid_model_id", "bad_json", "bad_device"),
                    404: ("model_not_found",),
                    413: ("body_too_large",),
                    500: _MODEL_OPEN_500,
                    503: _MODEL_OPEN_503,
                    504: ("load_timeout",),
                },
                auth=ADMIN_SCHEME,
            ),
        },
        "/admin/models/{model_id}/unload": {
            "parameters": list(model),
            "post": _op(
                "unload_model",
                "admin",
                "Unload a model now (a no-op when it is not loaded)",
                {"200": _response("Unloaded.", _ref("Model"))},
                errors={
                    400: ("invalid_model_id",),
                    404: ("model_not_found",),
                    409: ("model_in_use",),
                },
                auth=ADMIN_SCHEME,
            ),
        },
        "/admin/stats": {
            "get": _op(
                "stats",
                "admin",
                "Models, devices, the background cache and server-wide totals",
                {"200": _response("One snapshot.", _ref("Stats"))},
                auth=ADMIN_SCHEME,
            )
        },
        "/admin/sessions": {
            "get": _op(
                "list_sessions",
                "admin",
                "Every live session",
                {"200": _response("The sessions.", _ref("Sessions"))},
                auth=ADMIN_SCHEME,
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
                auth=ADMIN_SCHEME,
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
                    "503": _response(
                        "Not ready: the avatar root is unusable, a device has no running "
                        "workers, or the server is draining (shutting down).",
                        _ref("NotReady"),
                    ),
                },
                description="For load balancers; needs no admin access.",
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
                {
                    **_file_responses("*/*", "The file, typed by its extension."),
                    "404": {
                        "description": "No such file. A name that does not exist gets an "
                        "empty body (aiohttp answers after the error middleware); a path "
                        "outside the directory gets the JSON error `not_found`.",
                        "content": {
                            "application/octet-stream": {
                                "schema": {"type": "string", "maxLength": 0}
                            },
                            "application/json": {"schema": _ref("Error")},
                        },
                    },
                },
                parameters=(
                    {
                        "name": "filename",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                ),
                errors={403: ("forbidden",)},
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
                ADMIN_SCHEME: {"type": "http", "scheme": "bearer", "description": ADMIN_AUTH},
                SESSION_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": SESSION_AUTH,
                },
            },
        },
    }


def add_openapi_routes(app: web.Application) -> None:
    """Serve the document at ``GET /openapi.json`` (serialized once)."""
    body = json.dumps(openapi_document(), separators=(",", ":"))

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    app.router.add_get("/openapi.json", openapi)
