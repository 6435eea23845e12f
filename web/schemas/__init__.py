"""The HTTP API's request and response bodies as pydantic models.

Handlers validate what clients send with the request models
(:func:`web.request_body.validate` maps a failure to the documented error code) and
build their answers from the response models.

Modules: :mod:`~web.schemas.base` (the two base classes, shared field types, the error
body), :mod:`~web.schemas.signalling`, :mod:`~web.schemas.inference`,
:mod:`~web.schemas.admin` and :mod:`~web.schemas.service` (one per tag of the
document). Pure data: nothing here imports aiohttp or another ``web`` module, so every
handler may import it.
"""

from __future__ import annotations

from web.schemas.admin import (
    Cache,
    Device,
    DeviceKind,
    Global,
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
from web.schemas.service import Health, NotReady, OpenApiDocument, Ready
from web.schemas.signalling import (
    AddedDelay,
    Answer,
    AudioQuery,
    Avatar,
    Avatars,
    BufferedMedia,
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
    "AddedDelay",
    "Answer",
    "AudioQuery",
    "Avatar",
    "Avatars",
    "BufferedMedia",
    "Cache",
    "Device",
    "DeviceKind",
    "Error",
    "ErrorDetail",
    "Global",
    "Health",
    "HungUp",
    "IceServer",
    "InferQuery",
    "Interrupted",
    "LoadRequest",
    "Model",
    "Models",
    "NotReady",
    "Offer",
    "OpenApiDocument",
    "Queued",
    "Ready",
    "RequestModel",
    "ResponseModel",
    "Say",
    "SessionInfo",
    "SessionState",
    "Sessions",
    "Stats",
    "WebRtcConfig",
    "Worker",
]
