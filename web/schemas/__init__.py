"""The HTTP API's request and response bodies as pydantic models, and its operations.

Defined once, used three ways: handlers validate what clients send with the request
models (:func:`web.request_body.validate` maps a failure to the documented error code)
and build their answers from the response models; :mod:`web.openapi` generates the
OpenAPI document from the models and the route table (:data:`OPERATIONS`).

Modules: :mod:`~web.schemas.base` (the two base classes, shared field types, the error
body), :mod:`~web.schemas.signalling`, :mod:`~web.schemas.inference`,
:mod:`~web.schemas.inference_protocol`, :mod:`~web.schemas.admin`,
:mod:`~web.schemas.service` (one per tag of the document),
:mod:`~web.schemas.operation` (how an operation is declared) and
:mod:`~web.schemas.routes` (the route table). Pure data: nothing here imports aiohttp
or another ``web`` module, so every handler may import it.
"""

from __future__ import annotations

from web.schemas.admin import (
    AvatarImportRequest,
    Cache,
    Device,
    DeviceKind,
    Global,
    IdleLoops,
    ImportedAvatar,
    LoadRequest,
    Model,
    Models,
    SessionInfo,
    Sessions,
    Stats,
    Worker,
)
from web.schemas.base import Error, ErrorDetail, RequestModel, ResponseModel
from web.schemas.inference import MAX_REQUEST_FRAMES, InferQuery
from web.schemas.inference_protocol import (
    OipConfigTensor,
    OipDuration,
    OipError,
    OipIndexRequest,
    OipInferenceStats,
    OipInferResponse,
    OipLive,
    OipLoadParameters,
    OipLoadRequest,
    OipModelConfig,
    OipModelMetadata,
    OipModelReady,
    OipModelStats,
    OipOutput,
    OipOutputParameters,
    OipParameter,
    OipReady,
    OipRepositoryIndex,
    OipRepositoryModel,
    OipServerMetadata,
    OipStatistics,
    OipTensor,
)
from web.schemas.operation import Header, Operation, Reply
from web.schemas.routes import OPERATIONS
from web.schemas.service import Health, NotReady, OpenApiDocument, Ready
from web.schemas.session_control import AvatarSwitched, IdleClipSet, SetIdleClip, SwitchAvatar
from web.schemas.signalling import (
    AddedDelay,
    Answer,
    AudioQuery,
    Avatar,
    Avatars,
    BufferedMedia,
    DelayBudget,
    HungUp,
    IceServer,
    Interrupted,
    Offer,
    Queued,
    Say,
    SessionState,
    WebRtcConfig,
)

__all__ = [
    "MAX_REQUEST_FRAMES",
    "OPERATIONS",
    "AddedDelay",
    "Answer",
    "AudioQuery",
    "Avatar",
    "AvatarImportRequest",
    "AvatarSwitched",
    "Avatars",
    "BufferedMedia",
    "Cache",
    "DelayBudget",
    "Device",
    "DeviceKind",
    "Error",
    "ErrorDetail",
    "Global",
    "Header",
    "Health",
    "HungUp",
    "IceServer",
    "IdleClipSet",
    "IdleLoops",
    "ImportedAvatar",
    "InferQuery",
    "Interrupted",
    "LoadRequest",
    "Model",
    "Models",
    "NotReady",
    "Offer",
    "OipConfigTensor",
    "OipDuration",
    "OipError",
    "OipIndexRequest",
    "OipInferResponse",
    "OipInferenceStats",
    "OipLive",
    "OipLoadParameters",
    "OipLoadRequest",
    "OipModelConfig",
    "OipModelMetadata",
    "OipModelReady",
    "OipModelStats",
    "OipOutput",
    "OipOutputParameters",
    "OipParameter",
    "OipReady",
    "OipRepositoryIndex",
    "OipRepositoryModel",
    "OipServerMetadata",
    "OipStatistics",
    "OipTensor",
    "OpenApiDocument",
    "Operation",
    "Queued",
    "Ready",
    "Reply",
    "RequestModel",
    "ResponseModel",
    "Say",
    "SessionInfo",
    "SessionState",
    "Sessions",
    "SetIdleClip",
    "Stats",
    "SwitchAvatar",
    "WebRtcConfig",
    "Worker",
]
