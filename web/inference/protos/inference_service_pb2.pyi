from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InferBatchRequest(_message.Message):
    __slots__ = ("model_id", "visual_frames", "audio_features", "batch_size")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    VISUAL_FRAMES_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FEATURES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    visual_frames: bytes
    audio_features: bytes
    batch_size: int
    def __init__(self, model_id: _Optional[str] = ..., visual_frames: _Optional[bytes] = ..., audio_features: _Optional[bytes] = ..., batch_size: _Optional[int] = ...) -> None: ...

class RawMouthRegion(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class InferBatchResponse(_message.Message):
    __slots__ = ("outputs", "inference_time_ms", "success", "gpu_id", "device")
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    GPU_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[RawMouthRegion]
    inference_time_ms: float
    success: bool
    gpu_id: int
    device: str
    def __init__(self, outputs: _Optional[_Iterable[_Union[RawMouthRegion, _Mapping]]] = ..., inference_time_ms: _Optional[float] = ..., success: _Optional[bool] = ..., gpu_id: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_id", "loaded", "state", "device", "gpu_id", "memory_bytes", "last_error", "stats")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    GPU_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    loaded: bool
    state: str
    device: str
    gpu_id: int
    memory_bytes: int
    last_error: str
    stats: ModelStats
    def __init__(self, model_id: _Optional[str] = ..., loaded: _Optional[bool] = ..., state: _Optional[str] = ..., device: _Optional[str] = ..., gpu_id: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., last_error: _Optional[str] = ..., stats: _Optional[_Union[ModelStats, _Mapping]] = ...) -> None: ...

class ModelStats(_message.Message):
    __slots__ = ("model_id", "requests", "failed_requests", "frames", "batches", "failed_frames", "inference_ms", "mean_ms_per_frame", "in_use", "last_inference_ms")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FAILED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    FAILED_FRAMES_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    MEAN_MS_PER_FRAME_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    LAST_INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    requests: int
    failed_requests: int
    frames: int
    batches: int
    failed_frames: int
    inference_ms: float
    mean_ms_per_frame: float
    in_use: int
    last_inference_ms: int
    def __init__(self, model_id: _Optional[str] = ..., requests: _Optional[int] = ..., failed_requests: _Optional[int] = ..., frames: _Optional[int] = ..., batches: _Optional[int] = ..., failed_frames: _Optional[int] = ..., inference_ms: _Optional[float] = ..., mean_ms_per_frame: _Optional[float] = ..., in_use: _Optional[int] = ..., last_inference_ms: _Optional[int] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("model_id", "device_index")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    device_index: int
    def __init__(self, model_id: _Optional[str] = ..., device_index: _Optional[int] = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ("success", "model", "load_ms")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    model: ModelInfo
    load_ms: float
    def __init__(self, success: _Optional[bool] = ..., model: _Optional[_Union[ModelInfo, _Mapping]] = ..., load_ms: _Optional[float] = ...) -> None: ...

class GetModelStatsRequest(_message.Message):
    __slots__ = ("model_id",)
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    def __init__(self, model_id: _Optional[str] = ...) -> None: ...

class GetModelStatsResponse(_message.Message):
    __slots__ = ("models", "totals")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelStats]
    totals: Totals
    def __init__(self, models: _Optional[_Iterable[_Union[ModelStats, _Mapping]]] = ..., totals: _Optional[_Union[Totals, _Mapping]] = ...) -> None: ...

class Totals(_message.Message):
    __slots__ = ("models_registered", "models_loaded", "requests", "failed_requests", "frames", "batches", "model_memory_bytes")
    MODELS_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    MODELS_LOADED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FAILED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    MODEL_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    models_registered: int
    models_loaded: int
    requests: int
    failed_requests: int
    frames: int
    batches: int
    model_memory_bytes: int
    def __init__(self, models_registered: _Optional[int] = ..., models_loaded: _Optional[int] = ..., requests: _Optional[int] = ..., failed_requests: _Optional[int] = ..., frames: _Optional[int] = ..., batches: _Optional[int] = ..., model_memory_bytes: _Optional[int] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeviceHealth(_message.Message):
    __slots__ = ("name", "kind", "gpu_id", "memory_used_bytes", "memory_total_bytes", "model_memory_bytes", "models_loaded", "queue_depth", "queue_size", "workers_alive")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GPU_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODELS_LOADED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_ALIVE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    gpu_id: int
    memory_used_bytes: int
    memory_total_bytes: int
    model_memory_bytes: int
    models_loaded: int
    queue_depth: int
    queue_size: int
    workers_alive: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., gpu_id: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., model_memory_bytes: _Optional[int] = ..., models_loaded: _Optional[int] = ..., queue_depth: _Optional[int] = ..., queue_size: _Optional[int] = ..., workers_alive: _Optional[int] = ...) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("healthy", "status", "version", "devices", "totals", "live_sessions")
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    healthy: bool
    status: str
    version: str
    devices: _containers.RepeatedCompositeFieldContainer[DeviceHealth]
    totals: Totals
    live_sessions: int
    def __init__(self, healthy: _Optional[bool] = ..., status: _Optional[str] = ..., version: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[DeviceHealth, _Mapping]]] = ..., totals: _Optional[_Union[Totals, _Mapping]] = ..., live_sessions: _Optional[int] = ...) -> None: ...
