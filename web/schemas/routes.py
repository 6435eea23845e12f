"""The route table: every operation of the HTTP API, declared once (:data:`OPERATIONS`).

:mod:`web.openapi` renders it as the OpenAPI document; ``tests/test_openapi.py`` checks
it against the routes the app registers and the responses it sends.

Why one module over 400 lines: it is one table, read as the API's index; split by tag,
a reader would lose the one place that lists every route.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from streaming.audio_in.push import SUPPORTED_TYPES
from web.schemas.admin import (
    AvatarImportRequest,
    History,
    ImportedAvatar,
    LoadRequest,
    Model,
    Models,
    RegisteredAvatar,
    Sessions,
    Stats,
)
from web.schemas.base import Error
from web.schemas.broadcast import (
    NewSession,
    OutputList,
    OutputState,
    OutputTarget,
    SessionCreated,
    ViewerLeft,
)
from web.schemas.inference import InferQuery
from web.schemas.inference_protocol import (
    OipIndexRequest,
    OipInferResponse,
    OipLive,
    OipLoadRequest,
    OipModelConfig,
    OipModelMetadata,
    OipModelReady,
    OipReady,
    OipRepositoryIndex,
    OipServerMetadata,
    OipStatistics,
)
from web.schemas.livekit import LiveKitSessionCreated, NewLiveKitSession
from web.schemas.operation import Header, Operation, Reply, Tag, file_replies
from web.schemas.service import Health, NotReady, OpenApiDocument, Ready
from web.schemas.session_control import AvatarSwitched, IdleClipSet, SetIdleClip, SwitchAvatar
from web.schemas.session_state import SessionState
from web.schemas.signalling import (
    Answer,
    AudioQuery,
    Avatars,
    HungUp,
    Interrupted,
    Offer,
    Queued,
    Say,
    StreamQuery,
    TokenQuery,
    WebRtcConfig,
)

_MODEL_OPEN_500 = ("model_invalid", "model_load_failed")
_MODEL_OPEN_503 = ("out_of_memory", "no_capacity", "shutting_down")
_NO_SESSION: Mapping[int, tuple[str, ...]] = MappingProxyType({404: ("session_not_found",)})

SESSION_OPERATIONS = (
    Operation(
        "create_session",
        "post",
        "/offer",
        "sessions",
        "Answer a WebRTC offer: start a session with an avatar",
        (Reply(200, "The SDP answer (apply it to start media) and the session's delay.", Answer),),
        description="Send the offer once ICE gathering is complete (the server does not "
        "trickle). Offer video (`recvonly`); audio is optional. The session starts once "
        "ICE connects and ends if it does not within `session.ice_timeout_s`.",
        body=Offer,
        access="session",
        errors={
            400: ("bad_offer",),
            404: ("model_not_found",),
            413: ("body_too_large",),
            429: ("rate_limited",),
            500: (*_MODEL_OPEN_500, "streaming_failed"),
            503: ("too_many_sessions", *_MODEL_OPEN_503),
        },
    ),
    Operation(
        "new_session",
        "post",
        "/sessions",
        "sessions",
        "Open a session no caller owns: the avatar speaks what apps send, to its viewers",
        (
            Reply(
                201,
                "The session runs from now on; watch it over WHEP (`whep`).",
                SessionCreated,
                headers=(Header("Location", "The session's path, `/sessions/{session_id}`."),),
            ),
        ),
        description="Make it speak with `/audio`, `/say` or the audio stream; read its "
        "events from `/events`; end it with `DELETE /sessions/{session_id}`, or it ends "
        "after `session.idle_timeout_s` with neither audio nor a viewer. Admitted as a "
        "call is (docs/design/broadcast.md §21).",
        body=NewSession,
        access="session",
        errors={
            404: ("model_not_found",),
            409: ("too_many_outputs",),
            413: ("body_too_large",),
            429: ("rate_limited",),
            500: (*_MODEL_OPEN_500, "streaming_failed"),
            503: ("too_many_sessions", *_MODEL_OPEN_503),
        },
    ),
    Operation(
        "new_livekit_session",
        "post",
        "/livekit/sessions",
        "sessions",
        "Join a LiveKit room as a LiveKit Agents voice agent's avatar",
        (
            Reply(
                201,
                "The avatar joined the room and published its video and audio.",
                LiveKitSessionCreated,
                headers=(Header("Location", "The session's path, `/sessions/{session_id}`."),),
            ),
        ),
        description="What an avatar plugin posts (`lipstream_client.livekit.AvatarSession`"
        "). The avatar plays the agent's `lk.audio_stream` segments, answers "
        "`lk.clear_buffer` and tells `lk.playback_finished` with the position heard; it "
        "ends when the agent leaves (docs/guides/livekit.md). Needs "
        "`pip install 'lipstream[livekit]'` and, for a LiveKit server on your own "
        "network, `livekit.allow_private`.",
        body=NewLiveKitSession,
        access="session",
        errors={
            400: ("bad_livekit_url", "bad_livekit_token"),
            404: ("model_not_found", "clip_not_found"),
            413: ("body_too_large",),
            429: ("rate_limited",),
            500: (*_MODEL_OPEN_500, "streaming_failed"),
            501: ("livekit_not_installed",),
            502: ("livekit_unreachable",),
            503: ("too_many_sessions", *_MODEL_OPEN_503),
        },
    ),
    Operation(
        "watch_session",
        "post",
        "/sessions/{session_id}/whep",
        "sessions",
        "Watch a session (WHEP): an SDP offer in, the answer out",
        (
            Reply(
                201,
                "The SDP answer; the viewer's media flows once ICE connects.",
                media=("application/sdp",),
                headers=(Header("Location", "The viewer's path: `DELETE` it to leave."),),
            ),
        ),
        description="The offer is the SDP itself (`Content-Type: application/sdp`), "
        "complete (no trickle ICE), receiving H.264 video and optionally Opus audio and "
        "the event data channel. The ICE servers configured come back as `Link` headers "
        '(`<url>; rel="ice-server"`, RFC 9725). Any session can be watched, a call too; '
        "each session takes at most `broadcast.viewers_per_session` viewers. A viewer is "
        "sent what the session sends, never encoded again for it (docs/design/broadcast.md §21).",
        body_media=("application/sdp",),
        access="session",
        errors={
            400: ("bad_offer",),
            **_NO_SESSION,
            413: ("body_too_large",),
            415: ("unsupported_media_type",),
            429: ("rate_limited",),
            503: ("too_many_viewers", "too_many_sessions"),
        },
    ),
    Operation(
        "leave_session",
        "delete",
        "/sessions/{session_id}/whep/{viewer_id}",
        "sessions",
        "Stop watching a session (a WHEP viewer's `Location`)",
        (Reply(200, "The viewer's connection is closed.", ViewerLeft),),
        access="session",
        errors={404: ("session_not_found", "not_found_in_session")},
    ),
    Operation(
        "publish_whip",
        "post",
        "/whip/{avatar}",
        "sessions",
        "Publish speech over WHIP: the avatar speaks it, for viewers and outputs",
        (
            Reply(
                201,
                "The SDP answer; the session runs once ICE connects.",
                media=("application/sdp",),
                headers=(
                    Header(
                        "Location", "The session, `/sessions/{session_id}`: `DELETE` it to stop."
                    ),
                ),
            ),
        ),
        description="RFC 9725: the publisher's complete SDP offer (`Content-Type: "
        "application/sdp`, no trickle ICE) sending Opus audio; video it sends is declined. "
        "The session is watched over WHEP and pushed to outputs like any other; with "
        "`auth.jwt_secret` set, `Authorization: Bearer` carries a token for the avatar "
        "(docs/design/broadcast.md §21).",
        body_media=("application/sdp",),
        access="session",
        errors={
            400: ("bad_offer", "invalid_model_id"),
            404: ("model_not_found",),
            413: ("body_too_large",),
            415: ("unsupported_media_type",),
            429: ("rate_limited",),
            500: (*_MODEL_OPEN_500, "streaming_failed"),
            503: ("too_many_sessions", *_MODEL_OPEN_503),
        },
    ),
    Operation(
        "list_outputs",
        "get",
        "/sessions/{session_id}/outputs",
        "sessions",
        "The streams a session pushes out, with their state and counters",
        (Reply(200, "Oldest first.", OutputList),),
        access="session",
        errors=_NO_SESSION,
    ),
    Operation(
        "add_output",
        "post",
        "/sessions/{session_id}/outputs",
        "sessions",
        "Push the session to an RTMP ingest (H.264 + AAC in FLV)",
        (Reply(201, "Pushed from the session's next keyframe; it goes `live` then.", OutputState),),
        description="The session's own encode, not encoded again. An ingest that refuses "
        "or drops is tried again, the waits doubling up to `outputs.retry_max_s`. Targets "
        "on loopback or private addresses are refused unless `outputs.allow_private` is on "
        "(docs/design/broadcast.md §21).",
        body=OutputTarget,
        access="session",
        errors={
            **_NO_SESSION,
            409: ("too_many_outputs",),
            413: ("body_too_large",),
        },
    ),
    Operation(
        "remove_output",
        "delete",
        "/sessions/{session_id}/outputs/{output_id}",
        "sessions",
        "Stop one output (its stream is closed first)",
        (Reply(200, "Its last state.", OutputState),),
        access="session",
        errors={404: ("session_not_found", "not_found_in_session")},
    ),
    Operation(
        "get_session",
        "get",
        "/sessions/{session_id}",
        "sessions",
        "A session's state and counters",
        (Reply(200, "The session.", SessionState),),
        access="session",
        errors=_NO_SESSION,
    ),
    Operation(
        "hang_up",
        "delete",
        "/sessions/{session_id}",
        "sessions",
        "Hang up",
        (Reply(200, "The session is closed.", HungUp),),
        access="session",
        errors=_NO_SESSION,
    ),
    Operation(
        "push_audio",
        "post",
        "/sessions/{session_id}/audio",
        "sessions",
        "Queue audio for the avatar to speak",
        (Reply(202, "Queued; it plays in real time.", Queued),),
        description="An audio file (the `Content-Type` names its format; any rate and "
        "channel count) or raw PCM: `audio/L16; rate=16000[; channels=N]` (big-endian "
        "s16) or `application/octet-stream` / `audio/pcm` with `format`, `rate` and "
        "`channels` as query or content-type parameters. At most "
        "`session.max_audio_push_bytes` bytes and 600 s per push.",
        body_media=SUPPORTED_TYPES,
        query=AudioQuery,
        access="session",
        errors={
            400: ("bad_audio",),
            **_NO_SESSION,
            413: ("body_too_large", "audio_too_large"),
            429: ("audio_queue_full",),
        },
    ),
    Operation(
        "say",
        "post",
        "/sessions/{session_id}/say",
        "sessions",
        "Speak text through text-to-speech",
        (Reply(202, "Synthesized and queued.", Queued),),
        body=Say,
        access="session",
        errors={
            400: ("bad_text",),
            **_NO_SESSION,
            413: ("body_too_large",),
            429: ("audio_queue_full",),
            502: ("tts_failed",),
            503: ("tts_unavailable",),
        },
    ),
    Operation(
        "interrupt",
        "post",
        "/sessions/{session_id}/interrupt",
        "sessions",
        "Drop queued audio and frames: the avatar goes idle",
        (Reply(200, "Interrupted.", Interrupted),),
        access="session",
        errors=_NO_SESSION,
    ),
    Operation(
        "switch_avatar",
        "post",
        "/sessions/{session_id}/avatar",
        "sessions",
        "Switch the call's avatar: loaded while the old one shows, then a short dissolve",
        (Reply(200, "Switched from `frame` on (or already showing it).", AvatarSwitched),),
        description="Waits while a cold model loads (up to `server.request_timeout_s`); "
        "the call keeps its avatar if anything fails. `avatar_changed` goes to every "
        "listener when the first new frame is sent (docs/apps.md). Also a WebSocket and "
        'data-channel message: `{"type": "switch_avatar", "avatar": "..."}`.',
        body=SwitchAvatar,
        access="session",
        errors={
            400: SwitchAvatar.error_codes(),
            401: ("unauthorized",),
            **_NO_SESSION,
            409: ("avatar_incompatible", "avatar_switch_busy"),
            500: ("model_load_failed", "model_invalid"),
            503: ("shutting_down", "too_many_sessions", "no_capacity", "out_of_memory"),
        },
    ),
    Operation(
        "set_idle_clip",
        "post",
        "/sessions/{session_id}/idle",
        "sessions",
        "Choose the clip the avatar plays while silent (entered at a seam)",
        (Reply(200, "The clip plays from the next silent frame.", IdleClipSet),),
        description="An avatar's clips are named in its package (`GET /avatars`); an "
        "unknown one is refused with the list. Also a WebSocket and data-channel message: "
        '`{"type": "set_idle_clip", "clip": "..."}`.',
        body=SetIdleClip,
        access="session",
        errors={400: SetIdleClip.error_codes(), 404: ("session_not_found", "clip_not_found")},
    ),
    Operation(
        "stream_audio",
        "get",
        "/sessions/{session_id}/audio/stream",
        "sessions",
        "A WebSocket: stream PCM in as it is made; the session's events come back",
        (Reply(101, "Switching to the WebSocket protocol (docs/apps.md)."),),
        description="Binary messages carry PCM in the declared format (at most 1 s each); "
        'text messages `{"type": "end"}` end the utterance, `{"type": "interrupt"}` '
        "interrupts. The avatar starts speaking on the first message. The server sends "
        "`ready`, then the session's events and `error` messages for refused messages "
        "(`bad_frame`, `bad_message`, `audio_queue_full`); see docs/apps.md.",
        query=StreamQuery,
        access="session",
        errors={400: ("websocket_required",), **_NO_SESSION, 409: ("stream_busy",)},
    ),
    Operation(
        "session_events",
        "get",
        "/sessions/{session_id}/events",
        "sessions",
        "The session's events as server-sent events",
        (Reply(200, "One event per block until `session_ended`.", media=("text/event-stream",)),),
        description="`speech_started`, `speech_ended`, `interrupted`, `queued_ms` and "
        "`session_ended`, each as `id: <seq>`, `event: <type>` and `data: <json>`; a "
        "`: keepalive` comment every 15 s (docs/apps.md).",
        query=TokenQuery,
        access="session",
        errors=_NO_SESSION,
    ),
    Operation(
        "list_avatars",
        "get",
        "/avatars",
        "sessions",
        "The avatars a client can ask for",
        (Reply(200, "Sorted by id.", Avatars),),
    ),
    Operation(
        "webrtc_config",
        "get",
        "/webrtc-config",
        "sessions",
        "ICE servers for the client's peer connection, and the delay the server adds",
        (Reply(200, "Credentials included: they are meant for clients.", WebRtcConfig),),
    ),
)

_FLOATS = "application/octet-stream"
_UINT8 = "application/vnd.lipstream.uint8"

INFERENCE_OPERATIONS = (
    Operation(
        "infer",
        "post",
        "/v1/infer/{model_id}",
        "inference",
        "Run a raw batch through an avatar's model",
        (
            Reply(
                200,
                "For `application/octet-stream`: `N` outputs, float32 little-endian, "
                "channel-planar (`[N,3,S,S]`, in the model's output range). For "
                "`application/vnd.lipstream.uint8`: `N` BGR faces, uint8 `[N,S,S,3]`, "
                "ready to paste back. The answer has the request's content type.",
                media=(_FLOATS, _UINT8),
                headers=(
                    Header("X-Lipstream-Device", "The device that ran it, e.g. `cuda:0`, `cpu:1`."),
                    Header("X-Lipstream-Inference-Ms", "Queue + compute time in milliseconds."),
                    Header("X-Lipstream-Batch-Size", "`N`.", integer=True),
                    Header("X-Lipstream-Output-Shape", "Comma-separated, e.g. `2,3,320,320`."),
                ),
            ),
        ),
        description="For deployments that composite elsewhere. With `Content-Type: "
        "application/octet-stream` (the default) the body is `N` visual inputs (float32 "
        "little-endian, `[6,S,S]` each, scaled as the model expects) followed by `N` audio "
        "windows (float32, `[32,16,16]` each for unet_328). With `Content-Type: "
        "application/vnd.lipstream.uint8` it is `N` BGR model regions (uint8 `[S,S,3]`, the "
        "inner `S×S` of each crop; the server builds the masked six-channel input) followed "
        "by the same audio windows: a quarter of the bytes. Batches larger than the "
        "model's are split.",
        body_media=(_FLOATS, _UINT8),
        query=InferQuery,
        errors={
            400: ("invalid_model_id", "bad_body_size", "bad_values", "bad_input"),
            404: ("model_not_found",),
            413: ("bad_body_size", "body_too_large"),
            415: ("bad_content_type",),
            500: (*_MODEL_OPEN_500, "inference_failed"),
            503: (*_MODEL_OPEN_503, "queue_full"),
            504: ("deadline_exceeded",),
        },
    ),
)

_V2: Tag = "inference-protocol"
_MODEL_PATH = "/v2/models/{model_id}"
_VERSION_PATH = "/v2/models/{model_id}/versions/{version}"
_UNKNOWN_MODEL: Mapping[int, tuple[str, ...]] = MappingProxyType(
    {400: ("invalid_model_id",), 404: ("model_not_found", "version_not_found")}
)
#: Reading a model's tensors from an avatar package that is not loaded.
_MODEL_READ = MappingProxyType({**_UNKNOWN_MODEL, 500: ("model_invalid", "model_load_failed")})


def _per_version(operation: Operation) -> tuple[Operation, Operation]:
    """``operation`` on ``/v2/models/{model_id}...`` and on the path that names a version."""
    versioned = replace(
        operation,
        operation_id=f"{operation.operation_id}_of_version",
        path=operation.path.replace(_MODEL_PATH, _VERSION_PATH, 1),
        summary=f"{operation.summary} (of the version named)",
    )
    return operation, versioned


PROTOCOL_OPERATIONS = (
    Operation(
        "oip_server_live",
        "get",
        "/v2/health/live",
        _V2,
        "Liveness (the protocol's): the process can serve",
        (Reply(200, "Live.", OipLive),),
        errors={503: ("server_failed",)},
        protocol_errors=True,
    ),
    Operation(
        "oip_server_ready",
        "get",
        "/v2/health/ready",
        _V2,
        "Readiness (the protocol's): the same rule as `GET /ready`",
        (Reply(200, "Ready.", OipReady),),
        errors={503: ("not_ready",)},
        protocol_errors=True,
    ),
    Operation(
        "oip_server_metadata",
        "get",
        "/v2",
        _V2,
        "The server's name, version and the protocol extensions it implements",
        (Reply(200, "The metadata.", OipServerMetadata),),
        protocol_errors=True,
    ),
    Operation(
        "oip_statistics",
        "get",
        "/v2/models/stats",
        _V2,
        "Every registered model's statistics",
        (Reply(200, "Sorted by name.", OipStatistics),),
        description="Triton's statistics extension from the core's own figures: "
        "`inference_count` frames and `execution_count` batches run (live sessions' "
        "included), `success`/`fail` the protocols' requests with the time callers waited. "
        "`queue`, `compute_input`, `compute_infer` and `compute_output` count the frames "
        "run (a frame is the core's request: an N-frame request counts N) with, as Triton "
        "counts them, each frame's own wait in its device's queue and its batch's time "
        "copying and binding the inputs, running the model and handing the outputs back.",
        protocol_errors=True,
    ),
    *_per_version(
        Operation(
            "oip_model_metadata",
            "get",
            _MODEL_PATH,
            _V2,
            "A model's tensors, as the ONNX model names them",
            (Reply(200, "The metadata (read without loading the model).", OipModelMetadata),),
            description="Without a version: the `float` version's tensors.",
            errors=_MODEL_READ,
            protocol_errors=True,
        )
    ),
    *_per_version(
        Operation(
            "oip_model_ready",
            "get",
            f"{_MODEL_PATH}/ready",
            _V2,
            "Whether a model is loaded (then both versions are ready)",
            (Reply(200, "Loaded.", OipModelReady),),
            errors={**_UNKNOWN_MODEL, 400: ("invalid_model_id", "not_ready")},
            protocol_errors=True,
        )
    ),
    *_per_version(
        Operation(
            "oip_model_config",
            "get",
            f"{_MODEL_PATH}/config",
            _V2,
            "A model's configuration (Triton's model configuration extension)",
            (Reply(200, "Without a version: the `float` version's.", OipModelConfig),),
            errors=_MODEL_READ,
            protocol_errors=True,
        )
    ),
    *_per_version(
        Operation(
            "oip_model_statistics",
            "get",
            f"{_MODEL_PATH}/stats",
            _V2,
            "A model's statistics",
            (Reply(200, "The model's (its figures cover both versions).", OipStatistics),),
            errors=_UNKNOWN_MODEL,
            protocol_errors=True,
        )
    ),
    *_per_version(
        Operation(
            "oip_infer",
            "post",
            f"{_MODEL_PATH}/infer",
            _V2,
            "Run a batch of frames (the protocol's inference request)",
            (
                Reply(
                    200,
                    "All JSON (`application/json`), or, when an output is asked for as bytes, "
                    "`application/octet-stream`: the JSON (its length in the "
                    "`Inference-Header-Content-Length` header, the output's "
                    "`parameters.binary_data_size`) followed by the output's bytes.",
                    OipInferResponse,
                    media=("application/octet-stream",),
                ),
            ),
            description="A JSON request `{id?, inputs: [{name, datatype, shape, data | "
            "parameters.binary_data_size}], outputs?: [{name, parameters?: {binary_data}}], "
            "parameters?: {binary_data_output}}`. With the binary tensor extension "
            "(`tritonclient`'s default) the header `Inference-Header-Content-Length` gives "
            "the JSON's length and each binary input's bytes follow it in input order "
            "(little-endian, row-major); other inputs carry `data`, flat or nested. The "
            "inputs are the version's (`GET /v2/models/{model_id}`), 1 to 32 frames; without "
            "a version, a `UINT8` visual input picks `uint8`. Everything is checked before "
            "the tensors are read: the header length, the JSON (at most what the model's "
            "largest request needs as JSON text), the names, datatypes and shapes, each "
            "`binary_data_size` and their sum against the body. The output comes back as "
            "JSON unless asked for as bytes (per output `binary_data`, or "
            "`binary_data_output` for all). Request parameters such as `priority` and "
            "`timeout` are not used: `server.request_timeout_s` applies.",
            body_media=("application/json", "application/octet-stream"),
            errors={
                400: (
                    "invalid_model_id",
                    "bad_json",
                    "bad_input",
                    "bad_input_size",
                    "bad_values",
                    "bad_header_length",
                    "bad_body_size",
                ),
                404: ("model_not_found", "version_not_found"),
                413: ("body_too_large",),
                500: (*_MODEL_OPEN_500, "inference_failed"),
                503: (*_MODEL_OPEN_503, "queue_full", "model_not_ready"),
                504: ("deadline_exceeded",),
            },
            protocol_errors=True,
        )
    ),
    Operation(
        "oip_repository_index",
        "post",
        "/v2/repository/index",
        _V2,
        "Every registered model and its state (Triton's model repository extension)",
        (Reply(200, "Sorted by name.", OipRepositoryIndex),),
        body=OipIndexRequest,
        body_required=False,
        errors={413: ("body_too_large",)},
        protocol_errors=True,
    ),
    Operation(
        "oip_repository_load",
        "post",
        "/v2/repository/models/{model_id}/load",
        _V2,
        "Load a model now and wait for it (a loaded model stays where it is)",
        (Reply(200, "Loaded; an empty body."),),
        description='`{"parameters": {"device": N}}` loads onto device `N` (an index as '
        "`GET /admin/stats` lists them); no body (or tritonclient's `{}`) loads where "
        "placement puts it. Models load from their avatar packages: a configuration or "
        "files cannot be sent.",
        body=OipLoadRequest,
        body_required=False,
        access="admin",
        errors={
            400: ("invalid_model_id", "bad_parameter", "bad_device"),
            404: ("model_not_found",),
            413: ("body_too_large",),
            500: _MODEL_OPEN_500,
            503: _MODEL_OPEN_503,
            504: ("load_timeout",),
        },
        protocol_errors=True,
    ),
    Operation(
        "oip_repository_unload",
        "post",
        "/v2/repository/models/{model_id}/unload",
        _V2,
        "Unload a model now (a no-op when it is not loaded)",
        (Reply(200, "Unloaded; an empty body."),),
        description="Its parameters (tritonclient's `unload_dependents`) mean nothing here.",
        access="admin",
        errors={
            400: ("invalid_model_id", "bad_json"),
            404: ("model_not_found",),
            409: ("model_in_use",),
            413: ("body_too_large",),
        },
        protocol_errors=True,
    ),
)

ADMIN_OPERATIONS = (
    Operation(
        "admin_page",
        "get",
        "/admin",
        "admin",
        "The admin page",
        (Reply(200, "HTML; its data comes from the JSON routes.", media=("text/html",)),),
        description="Served without a token even when one is configured (a browser "
        "navigation cannot send one; the page asks for it and sends it with every JSON "
        "call). With no token configured, the loopback rule applies.",
        errors={403: ("forbidden",)},
    ),
    Operation(
        "list_models",
        "get",
        "/admin/models",
        "admin",
        "Every registered model, loaded or not",
        (Reply(200, "The models.", Models),),
        access="admin",
    ),
    Operation(
        "load_model",
        "post",
        "/admin/models/{model_id}/load",
        "admin",
        "Load a model now and wait for it (a loaded model stays where it is)",
        (Reply(200, "Loaded.", Model),),
        body=LoadRequest,
        body_required=False,
        access="admin",
        errors={
            400: ("invalid_model_id",),
            404: ("model_not_found",),
            413: ("body_too_large",),
            500: _MODEL_OPEN_500,
            503: _MODEL_OPEN_503,
            504: ("load_timeout",),
        },
    ),
    Operation(
        "import_avatar",
        "post",
        "/admin/avatars/import",
        "admin",
        "Import another project's avatar folder and register it",
        (
            Reply(
                201,
                "Imported, validated and registered.",
                ImportedAvatar,
                headers=(Header("X-Lipstream-Package", "The package written, as a token."),),
            ),
            Reply(
                200,
                "Registered without an import: the avatar root already holds a package the "
                "request's `X-Lipstream-Package` names.",
                RegisteredAvatar,
            ),
        ),
        description="The same import as `lipstream avatar import`: a SyncTalk_2D dataset "
        "folder or a LiveTalking wav2lip avatar, read from `avatars.import_root` (paths are "
        "relative to it). The package is written beside the others, validated, then moved "
        "into place: a failed import leaves nothing. A cluster front sends the import to "
        "every worker in turn, each reading the folder on its own machine; a worker whose "
        "avatar root already holds the package an earlier one wrote (a root they share) "
        "registers it instead (the request header `X-Lipstream-Package`, the tokens of the "
        "packages written so far). The front answers 201 with the first import and each "
        "worker's outcome (`workers`), or 502 `import_incomplete` naming the workers that "
        "failed and why.",
        body=AvatarImportRequest,
        access="admin",
        errors={
            400: ("bad_path",),
            403: ("import_disabled",),
            409: ("avatar_exists", "model_in_use"),
            413: ("body_too_large",),
            422: ("import_failed",),
        },
    ),
    Operation(
        "unload_model",
        "post",
        "/admin/models/{model_id}/unload",
        "admin",
        "Unload a model now (a no-op when it is not loaded)",
        (Reply(200, "Unloaded.", Model),),
        access="admin",
        errors={400: ("invalid_model_id",), 404: ("model_not_found",), 409: ("model_in_use",)},
    ),
    Operation(
        "stats",
        "get",
        "/admin/stats",
        "admin",
        "Models, devices, the background cache and server-wide totals",
        (Reply(200, "One snapshot.", Stats),),
        access="admin",
    ),
    Operation(
        "history",
        "get",
        "/admin/history",
        "admin",
        "The last minutes of the device, session and server figures, for charts",
        (Reply(200, "Every series kept.", History),),
        description="Sampled in the process every `interval_s` from the same snapshots as "
        "`/admin/stats` and `/admin/sessions`; each series keeps at most `points` points, "
        "and a series that gets no point for that long (an ended session) is dropped.",
        access="admin",
    ),
    Operation(
        "list_sessions",
        "get",
        "/admin/sessions",
        "admin",
        "Every live session",
        (Reply(200, "The sessions.", Sessions),),
        access="admin",
    ),
    Operation(
        "end_session",
        "delete",
        "/admin/sessions/{session_id}",
        "admin",
        "End a session",
        (Reply(200, "The session is closed.", HungUp),),
        access="admin",
        errors=_NO_SESSION,
    ),
)

SERVICE_OPERATIONS = (
    Operation(
        "health",
        "get",
        "/health",
        "service",
        "Liveness: the process answers",
        (Reply(200, "Alive.", Health),),
    ),
    Operation(
        "ready",
        "get",
        "/ready",
        "service",
        "Readiness: the server takes new sessions and inference",
        (
            Reply(200, "Ready.", Ready),
            Reply(
                503,
                "Not ready: the avatar root is unusable, a device has no running workers, "
                "or the server is draining (shutting down).",
                NotReady,
            ),
        ),
        description="For load balancers; needs no admin access.",
    ),
    Operation(
        "metrics",
        "get",
        "/metrics",
        "service",
        "Prometheus metrics",
        (Reply(200, "Prometheus text exposition format 0.0.4.", media=("text/plain",)),),
    ),
    Operation(
        "openapi",
        "get",
        "/openapi.json",
        "service",
        "This document",
        (Reply(200, "OpenAPI 3.1.", OpenApiDocument),),
    ),
    Operation(
        "demo_page",
        "get",
        "/",
        "service",
        "The browser demo page",
        file_replies("text/html", "HTML."),
    ),
    Operation(
        "static_file",
        "get",
        "/static/{filename}",
        "service",
        "Files of the demo page",
        (
            *file_replies("*/*", "The file, typed by its extension."),
            Reply(
                404,
                "No such file. A name that does not exist gets an empty body (aiohttp "
                "answers after the error middleware); a path outside the directory gets "
                "the JSON error `not_found`.",
                Error,
                media=("application/octet-stream",),
                empty=True,
            ),
        ),
        errors={403: ("forbidden",)},
    ),
)

OPERATIONS: tuple[Operation, ...] = (
    *SESSION_OPERATIONS,
    *INFERENCE_OPERATIONS,
    *PROTOCOL_OPERATIONS,
    *ADMIN_OPERATIONS,
    *SERVICE_OPERATIONS,
)
