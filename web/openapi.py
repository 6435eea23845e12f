"""The HTTP API as an OpenAPI 3.1 document, served at ``GET /openapi.json``.

Generated, never written by hand: component schemas come from the pydantic models in
:mod:`web.schemas` (``model_json_schema``), paths from its route table
(:data:`web.schemas.OPERATIONS`). This module adds only prose: what each error code
means, the shared error responses (``Retry-After`` where the server sends it) and the
two access rules. ``tests/test_openapi.py`` checks the document both ways against the
routes the app registers and validates real responses against it.

Why one module: most of it is the table of what each error code means, which must stay
beside the code that turns the table into the document's responses.
"""

from __future__ import annotations

import json
import re
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from aiohttp import web
from pydantic import TypeAdapter
from pydantic.json_schema import (
    GenerateJsonSchema,
    JsonSchemaMode,
    JsonSchemaValue,
    models_json_schema,
)
from pydantic_core.core_schema import WithDefaultSchema

from web.schemas import MAX_REQUEST_FRAMES, OPERATIONS, Error, Operation, Reply, RequestModel
from web.schemas.base import AvatarId
from web.schemas.inference_protocol import OipError

Json = dict[str, Any]

SCHEMES = {"admin": "adminToken", "session": "sessionToken"}

# (status, shared response name, what it means, the header it carries, if any)
_ERROR_STATUSES: tuple[tuple[int, str, str, str | None], ...] = (
    (400, "BadRequest", "The request is malformed or names something invalid.", None),
    (401, "Unauthorized", "The bearer token is missing or not valid.", "WWW-Authenticate?"),
    (403, "Forbidden", "The request is not allowed from where it came.", None),
    (404, "NotFound", "No such session, model or file.", None),
    (409, "Conflict", "The resource is in a state that forbids the request.", None),
    (413, "PayloadTooLarge", "The body is over a limit.", None),
    (415, "UnsupportedMediaType", "The body's Content-Type is not one this route reads.", None),
    (
        422,
        "UnprocessableContent",
        "The request is well formed but its content cannot be used.",
        None,
    ),
    (429, "TooManyRequests", "Too many requests or too much queued; retry later.", "Retry-After"),
    (500, "InternalError", "The server failed; details are in its log.", None),
    (501, "NotImplemented", "The server lacks an optional part the route needs.", None),
    (
        502,
        "BadGateway",
        "An upstream service (the text-to-speech engine, a LiveKit server) failed.",
        None,
    ),
    (503, "ServiceUnavailable", "The server is at capacity or stopping.", "Retry-After?"),
    (504, "GatewayTimeout", "The work did not finish before its deadline.", None),
)

# What each error code means, as operation descriptions list them.
_CODES: dict[str, str] = {
    "bad_json": "the body is not a JSON object",
    "bad_field": "a field is missing or of the wrong type",
    "bad_offer": "the SDP offer cannot be answered, or `type` is not `offer`",
    "bad_text": "the text is empty or too long, or the voice name is invalid",
    "bad_audio": "the audio cannot be decoded, or its content type or parameters are wrong",
    "invalid_model_id": "the avatar/model id is not `[a-z0-9_-]{1,64}`",
    "missing_batch_size": "the `batch_size` query parameter is missing",
    "bad_batch_size": f"`batch_size` is not an integer from 1 to {MAX_REQUEST_FRAMES}",
    "bad_body_size": "the body is not exactly the size `batch_size` needs (on `/v2`: the "
    "bytes its JSON declares)",
    "bad_import": "the import request misses a field or has one of the wrong type",
    "bad_path": "a path leaves `avatars.import_root`",
    "import_disabled": "`avatars.import_root` is not set, so the server imports nothing",
    "avatar_exists": "an avatar of that id exists and `replace` is false",
    "import_failed": "the folder or model cannot be imported; the message names the file",
    "bad_content_type": "the body's `Content-Type` is not one the route reads",
    "bad_values": "the inputs hold NaN or infinity",
    "bad_input": "the tensors do not fit the model",
    "unauthorized": "tokens are required here and the bearer token is missing or not valid",
    "rate_limited": "more than `server.offer_rate_limit_per_minute` offers from this address",
    "forbidden": "no admin token is configured and the request is not from this machine (a "
    "non-loopback peer, a proxy header, a foreign `Host` or `Origin`); for files: a "
    "directory",
    "session_not_found": "no live session has this id",
    "model_not_found": "no avatar/model with this id",
    "bad_device": "`device` is not the index of one of the server's devices",
    "model_in_use": "live sessions hold the model",
    "body_too_large": "the body is over its limit",
    "audio_too_large": "the decoded audio is longer than one push may carry",
    "audio_queue_full": "the session's audio queue would exceed `session.max_queued_audio_s`",
    "bad_stream_format": "`format`, `rate` or `channels` is not one a stream may declare",
    "bad_frame": "an audio stream message is not whole samples, over 1 s, or not finite",
    "websocket_required": "the request is not a WebSocket upgrade",
    "stream_busy": "the session already has an audio stream open",
    "avatar_incompatible": "the avatar runs at another fps or takes other audio features than "
    "the call's: start a new call for it",
    "avatar_switch_busy": "the call is switching avatar already (loading or dissolving)",
    "clip_not_found": "the call's avatar has no idle clip of that name (the message lists them)",
    "internal_error": "an unexpected failure; see the server log",
    "streaming_failed": "the session could not be set up",
    "model_invalid": "the avatar package is malformed",
    "model_load_failed": "the model could not be loaded",
    "inference_failed": "the model failed to run",
    "tts_failed": "the text-to-speech engine failed",
    "too_many_viewers": "the session has `broadcast.viewers_per_session` viewers already",
    "unsupported_media_type": "the body is not the content type the route takes",
    "bad_output": "an output's target is malformed, does not resolve, or is a private "
    "address while `outputs.allow_private` is off",
    "too_many_outputs": "the session has `outputs.max_per_session` outputs already",
    "not_found_in_session": "the session is live but has no viewer or output with that id",
    "too_many_sessions": "no capacity for one more session (server.max_sessions, a device's "
    "inference budget or the CPU budget), or the server is stopping",
    "tts_unavailable": "no text-to-speech engine is configured or installed",
    "out_of_memory": "the device ran out of memory loading the model",
    "no_capacity": "no device has room for the model",
    "queue_full": "the device's queue is full",
    "shutting_down": "the inference core is stopping",
    "deadline_exceeded": "the batch missed its deadline (`server.request_timeout_s`)",
    "load_timeout": "still loading after `registry.load_timeout_s`; it goes on loading",
    "bad_header_length": "`Inference-Header-Content-Length` is not a non-negative integer, "
    "runs past the body, or is missing while inputs have `binary_data_size`",
    "bad_input_size": "a `binary_data_size` (or a JSON `data`'s value count) is not what the "
    "input's datatype and shape need",
    "version_not_found": "the model has no such version (`float`, `uint8`)",
    "not_ready": "not ready: the model is not loaded, or (for the server) the inference core "
    "is not running, a device has no running workers or the server is draining",
    "model_not_ready": "not loaded, and `registry.load_on_infer` is false: load it first",
    "bad_parameter": "a load parameter other than `device` (a configuration or files)",
    "server_failed": "the process cannot serve any more and is exiting",
    "bad_livekit_url": "`livekit_url` is not a ws(s):// or http(s):// URL, does not resolve, "
    "or is a private address while `livekit.allow_private` is off",
    "bad_livekit_token": "`livekit_token` is not a LiveKit access token the avatar can use "
    "(unsigned by the server's key, expired, no `roomJoin` or publish grant, no "
    "`lk.publish_on_behalf` attribute); the message says which",
    "livekit_not_installed": "the server lacks the LiveKit SDK: `pip install 'lipstream[livekit]'`",
    "livekit_unreachable": "the LiveKit server could not be reached, or did not let the avatar "
    "join and publish within `livekit.connect_timeout_s`",
}

#: The shared error responses of the ``/v2`` routes: ``ProtocolBadRequest``...
PROTOCOL_PREFIX = "Protocol"
PROTOCOL_DESCRIPTION = (
    "The Open Inference Protocol v2 (KServe v2, Triton's HTTP API) with Triton's extensions "
    "`binary_tensor_data`, `model_configuration`, `model_repository` and `statistics`: what "
    "`tritonclient.http` calls. Each avatar is a model with two versions: `float` (the "
    "model's own ONNX interface and tensor names) and `uint8` (the serving graph's, a "
    "quarter of the bytes); a request that names no version is served by its visual "
    'input\'s datatype. Errors are the protocol\'s `{"error": "message"}`.'
)

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

# Path parameters by name: each is a shared component.
_PATH_PARAMETERS: dict[str, tuple[str, Json, str]] = {
    "session_id": ("SessionId", {"type": "string"}, "From `POST /offer` or `POST /sessions`."),
    "avatar": ("AvatarPath", TypeAdapter(AvatarId).json_schema(), "An avatar id (`GET /avatars`)."),
    "output_id": ("OutputId", {"type": "string"}, "From `POST .../outputs`."),
    "viewer_id": (
        "ViewerId",
        {"type": "string"},
        "The last part of a WHEP viewer's `Location`.",
    ),
    "model_id": (
        "ModelId",
        TypeAdapter(AvatarId).json_schema(),
        "An avatar id: each avatar has its own model.",
    ),
    "filename": ("Filename", {"type": "string"}, "A file of `web/static`."),
    "version": (
        "ModelVersion",
        {"type": "string", "enum": ["float", "uint8"]},
        "The tensor contract: `float` (the model's own interface) or `uint8` (the serving "
        "graph's).",
    ),
}


class _Schemas(GenerateJsonSchema):
    """Pydantic's JSON schemas without a title on every field (``"Uptime S"``), nor
    ``"default": null``: a field that defaults to None may be left out.
    """

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def default_schema(self, schema: WithDefaultSchema) -> JsonSchemaValue:
        json_schema = super().default_schema(schema)
        if json_schema.get("default", ...) is None:
            del json_schema["default"]
        return json_schema


def _ref(name: str, kind: str = "schemas") -> Json:
    return {"$ref": f"#/components/{kind}/{name}"}


def _component_schemas() -> Json:
    """Every model the operations name, with the models they nest, by class name."""
    modes: dict[type[Any], JsonSchemaMode] = {Error: "serialization", OipError: "serialization"}
    for operation in OPERATIONS:
        if operation.body is not None:
            modes[operation.body] = "validation"
        for reply in operation.replies:
            if reply.model is not None:
                modes[reply.model] = "serialization"
    refs, top = models_json_schema(
        list(modes.items()),
        ref_template="#/components/schemas/{model}",
        schema_generator=_Schemas,
    )
    for (model, _), ref in refs.items():
        if ref != _ref(model.__name__):  # pydantic renames models that share a name
            raise RuntimeError(f"two models are named {model.__name__}: rename one")
    return dict(sorted(top["$defs"].items()))


def _query_parameters(model: type[RequestModel]) -> list[Json]:
    schema = model.model_json_schema(schema_generator=_Schemas)
    required = set(schema.get("required", ()))
    parameters = []
    for name, field in schema["properties"].items():
        parameter = {"name": name, "in": "query", "required": name in required}
        if "description" in field:
            parameter["description"] = field["description"]
        parameter["schema"] = {k: v for k, v in field.items() if k != "description"}
        parameters.append(parameter)
    return parameters


def _reply(reply: Reply) -> Json:
    response: Json = {"description": reply.description}
    if reply.headers:
        response["headers"] = {
            header.name: {
                "required": True,
                "schema": {"type": "integer" if header.integer else "string"},
                "description": header.description,
            }
            for header in reply.headers
        }
    content: Json = {}
    if reply.model is not None:
        content["application/json"] = {"schema": _ref(reply.model.__name__)}
    for media in reply.media:
        content[media] = {"schema": {"type": "string", "maxLength": 0}} if reply.empty else {}
    if content:
        response["content"] = content
    return response


def _errors(operation: Operation) -> Json:
    """Shared error responses, each described by the codes this operation can send."""
    spec = {status: list(codes) for status, codes in operation.errors.items()}
    if operation.body is not None:
        spec[400] = ["bad_json", *operation.body.error_codes(), *spec.get(400, ())]
    if operation.query is not None:
        spec[400] = [*operation.query.error_codes(), *spec.get(400, ())]
    if operation.access is not None:
        spec.setdefault(401, ["unauthorized"])
        if operation.access == "admin":
            spec.setdefault(403, ["forbidden"])
    spec[500] = ["internal_error", *spec.get(500, ())]  # any handler can fail unexpectedly
    prefix = PROTOCOL_PREFIX if operation.protocol_errors else ""
    names = {status: prefix + name for status, name, _, _ in _ERROR_STATUSES}
    return {
        str(status): {
            **_ref(names[status], "responses"),
            "description": "; ".join(f"`{c}`: {_CODES[c]}" for c in dict.fromkeys(codes)) + ".",
        }
        for status, codes in sorted(spec.items())
    }


def _operation(operation: Operation) -> Json:
    document: Json = {
        "operationId": operation.operation_id,
        "tags": [operation.tag],
        "summary": operation.summary,
    }
    if operation.description is not None:
        document["description"] = operation.description
    if operation.query is not None:
        document["parameters"] = _query_parameters(operation.query)
    if operation.body is not None:
        document["requestBody"] = {
            "required": operation.body_required,
            "content": {"application/json": {"schema": _ref(operation.body.__name__)}},
        }
    elif operation.body_media:
        document["requestBody"] = {
            "required": True,
            "content": {media: {} for media in operation.body_media},
        }
    if operation.access is not None:
        # The empty requirement: no token is needed when the server has none configured.
        document["security"] = [{SCHEMES[operation.access]: []}, {}]
    replies = {str(reply.status): _reply(reply) for reply in operation.replies}
    document["responses"] = {**replies, **_errors(operation)}
    return document


def _paths() -> Json:
    paths: Json = {}
    for operation in OPERATIONS:
        if operation.path not in paths:
            names = re.findall(r"{(\w+)}", operation.path)
            parameters = [_ref(_PATH_PARAMETERS[name][0], "parameters") for name in names]
            paths[operation.path] = {"parameters": parameters} if parameters else {}
        paths[operation.path][operation.method] = _operation(operation)
    return paths


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
    """The shared error responses: lipstream's, and the protocol's for ``/v2``."""
    responses: Json = {}
    for status, name, description, header in _ERROR_STATUSES:
        for prefix, schema in (("", "Error"), (PROTOCOL_PREFIX, OipError.__name__)):
            response: Json = {
                "description": f"{status}: {description}",
                "content": {"application/json": {"schema": _ref(schema)}},
            }
            if header is not None:
                response["headers"] = {header.rstrip("?"): _header(header)}
            responses[prefix + name] = response
    return responses


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
            "description": "WebRTC signalling and session control, raw batch inference (its "
            "own API and the Open Inference Protocol v2), admin, health and metrics. Every "
            'error is JSON `{"error": {"code", "message"}}`, except on the protocol\'s `/v2` '
            'routes: `{"error": "message"}`, as the protocol says; each operation lists its '
            "codes by status (on `/v2`, the conditions they stand for).",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [
            {"name": "sessions", "description": "WebRTC calls with an avatar."},
            {"name": "inference", "description": "Raw batch inference."},
            {"name": "inference-protocol", "description": PROTOCOL_DESCRIPTION},
            {"name": "admin", "description": ADMIN_AUTH},
            {"name": "service", "description": "Health, metrics, this document, demo page."},
        ],
        "paths": _paths(),
        "components": {
            "schemas": _component_schemas(),
            "responses": _responses(),
            "parameters": {
                component: {
                    "name": name,
                    "in": "path",
                    "required": True,
                    "schema": schema,
                    "description": description,
                }
                for name, (component, schema, description) in _PATH_PARAMETERS.items()
            },
            "securitySchemes": {
                SCHEMES["admin"]: {"type": "http", "scheme": "bearer", "description": ADMIN_AUTH},
                SCHEMES["session"]: {
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
