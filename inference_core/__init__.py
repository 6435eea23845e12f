"""Audio in, face regions out: avatar packages, audio features and the ONNX model adapter.

Data path: 16 kHz PCM → :class:`AudioFeatureStream` (mel → :class:`AudioEncoder` →
per-frame ``[32,16,16]`` windows) → :class:`LipSyncAdapter` (uint8 crops + windows →
uint8 face regions). :class:`AvatarLocator` finds packages by id inside the avatar root.

Serving: :class:`InferenceCore` owns the devices, the :class:`ModelRegistry` (load on
demand, placement, eviction) and a :class:`DeviceScheduler` per device (bounded queue,
cross-session batching per model, deadlines); ``core.open(id)`` hands out a
:class:`ModelHandle` to submit frames to.
"""

from inference_core.adapter import FaceInputBuilder, LipSyncAdapter, bind_inputs, open_session
from inference_core.audio_encoder import AudioEncoder
from inference_core.audio_features import (
    AudioFeatureStream,
    FrameAudio,
    lookahead_ms,
    offline_features,
)
from inference_core.avatar import (
    AVATAR_ID_PATTERN,
    DEMO_AVATAR_ID,
    AvatarLocator,
    AvatarPackage,
    check_avatar_id,
)
from inference_core.core import InferenceCore, ModelHandle
from inference_core.devices import Device, MemoryProbe, detect_devices, session_config
from inference_core.events import CoreEvents, NoCoreEvents
from inference_core.exceptions import (
    AudioError,
    AvatarError,
    AvatarInvalidError,
    AvatarNotFoundError,
    CapacityError,
    DeadlineExceededError,
    InferenceError,
    InvalidAvatarIdError,
    ModelInputError,
    ModelInUseError,
    ModelLoadError,
    ModelOutOfMemoryError,
    QueueFullError,
    ShuttingDownError,
)
from inference_core.frame_request import FrameRequest, ModelRunner
from inference_core.loaded_model import LoadedModel
from inference_core.manifest import AdapterSpec, AvatarManifest
from inference_core.mel import MelConfig, StreamingMel, melspectrogram
from inference_core.registry import ModelRegistry
from inference_core.scheduler import DeviceScheduler
from inference_core.validation import validate_package

__all__ = [
    "AVATAR_ID_PATTERN",
    "DEMO_AVATAR_ID",
    "AdapterSpec",
    "AudioEncoder",
    "AudioError",
    "AudioFeatureStream",
    "AvatarError",
    "AvatarInvalidError",
    "AvatarLocator",
    "AvatarManifest",
    "AvatarNotFoundError",
    "AvatarPackage",
    "CapacityError",
    "CoreEvents",
    "DeadlineExceededError",
    "Device",
    "DeviceScheduler",
    "FaceInputBuilder",
    "FrameAudio",
    "FrameRequest",
    "InferenceCore",
    "InferenceError",
    "InvalidAvatarIdError",
    "LipSyncAdapter",
    "LoadedModel",
    "MelConfig",
    "MemoryProbe",
    "ModelHandle",
    "ModelInUseError",
    "ModelInputError",
    "ModelLoadError",
    "ModelOutOfMemoryError",
    "ModelRegistry",
    "ModelRunner",
    "NoCoreEvents",
    "QueueFullError",
    "ShuttingDownError",
    "StreamingMel",
    "bind_inputs",
    "check_avatar_id",
    "detect_devices",
    "lookahead_ms",
    "melspectrogram",
    "offline_features",
    "open_session",
    "session_config",
    "validate_package",
]
