"""Audio in, face regions out: avatar packages, audio features and the ONNX model adapter.

Data path: 16 kHz PCM → :class:`AudioFeatureStream` (mel → :class:`AudioEncoder` →
per-frame ``[32,16,16]`` windows) → :class:`LipSyncAdapter` (uint8 crops + windows →
uint8 face regions). :class:`AvatarLocator` finds packages by id inside the avatar root.
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
from inference_core.exceptions import (
    AudioError,
    AvatarError,
    AvatarInvalidError,
    AvatarNotFoundError,
    InferenceError,
    InvalidAvatarIdError,
    ModelInputError,
    ModelLoadError,
)
from inference_core.manifest import AdapterSpec, AvatarManifest
from inference_core.mel import MelConfig, StreamingMel, melspectrogram
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
    "FaceInputBuilder",
    "FrameAudio",
    "InferenceError",
    "InvalidAvatarIdError",
    "LipSyncAdapter",
    "MelConfig",
    "ModelInputError",
    "ModelLoadError",
    "StreamingMel",
    "bind_inputs",
    "check_avatar_id",
    "lookahead_ms",
    "melspectrogram",
    "offline_features",
    "open_session",
    "validate_package",
]
