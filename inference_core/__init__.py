"""Audio in, face regions out: the model adapter, audio features, avatar packages, serving.

    adapter/    how crops and audio windows feed a lip-sync model (AdapterSpec, ONNX I/O)
    features/   16 kHz PCM → mel → audio encoder → one [32,16,16] window per video frame
    avatars/    the avatar package format: manifest, frames, rects; finding and checking one
    serving/    devices, model registry (load, place, evict), batching schedulers
    assets/     what lipstream generates itself: the demo avatar, the benchmark model

Data path: PCM → :class:`AudioFeatureStream` → :class:`FrameAudio` windows; a frame's
uint8 crop and window → ``ModelHandle.submit`` → the device's scheduler batches it with
every other session's frames of that model → uint8 face (``docs/design/map.md`` §1).
Imports only :mod:`config`.
"""

from __future__ import annotations

from inference_core.adapter import AdapterSpec, FaceInputBuilder, LipSyncAdapter
from inference_core.avatars import AvatarError, AvatarLocator, AvatarPackage, check_avatar_id
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
from inference_core.features import AudioEncoder, AudioFeatureStream, FrameAudio, lookahead_ms
from inference_core.serving import InferenceCore, ModelHandle

__all__ = [
    "AdapterSpec",
    "AudioEncoder",
    "AudioFeatureStream",
    "AvatarError",
    "AvatarLocator",
    "AvatarPackage",
    "CapacityError",
    "DeadlineExceededError",
    "FaceInputBuilder",
    "FrameAudio",
    "InferenceCore",
    "InferenceError",
    "LipSyncAdapter",
    "ModelHandle",
    "ModelInUseError",
    "ModelInputError",
    "ModelLoadError",
    "ModelOutOfMemoryError",
    "QueueFullError",
    "ShuttingDownError",
    "check_avatar_id",
    "lookahead_ms",
]
