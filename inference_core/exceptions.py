"""Errors raised by the inference core.

Hierarchy::

    InferenceError                 root: anything the inference core refuses or fails at
    ├── AvatarError                an avatar package cannot be used
    │   ├── InvalidAvatarIdError   the id is not [a-z0-9_-]{1,64} or escapes the avatar root
    │   ├── AvatarNotFoundError    no avatar with that id under the avatar root
    │   └── AvatarInvalidError     the package exists but is malformed (lists every problem)
    ├── ModelLoadError             an ONNX file is missing, corrupt or does not fit its adapter
    │   └── ModelOutOfMemoryError  the device ran out of memory while loading or warming up
    ├── ModelInputError            a request's tensors do not have the shapes the model needs
    ├── AudioError                 audio cannot be read or has an unusable format
    ├── CapacityError              no device has room for the model (all loaded models in use)
    ├── ModelInUseError            the model is held by live sessions (cannot unload)
    ├── QueueFullError             a device's queue is full: the frame is refused at once
    ├── DeadlineExceededError      a frame's deadline passed before it could run: dropped
    └── ShuttingDownError          the core is stopping and takes no new work

Every message names the thing that failed and what to do about it.
"""

from __future__ import annotations


class InferenceError(Exception):
    """Root of all inference-core errors."""


class AvatarError(InferenceError):
    """An avatar package cannot be used."""


class InvalidAvatarIdError(AvatarError):
    """An avatar id is malformed or would resolve outside the avatar root."""


class AvatarNotFoundError(AvatarError):
    """No avatar with the requested id exists under the avatar root."""


class AvatarInvalidError(AvatarError):
    """An avatar package exists but has problems; ``problems`` lists each one."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems: list[str] = list(problems or [])


class ModelLoadError(InferenceError):
    """An ONNX model could not be loaded or does not fit its adapter."""


class ModelOutOfMemoryError(ModelLoadError):
    """The device ran out of memory while a model was loaded or warmed up."""


class ModelInputError(InferenceError):
    """Tensors handed to a model have the wrong shape or type."""


class AudioError(InferenceError):
    """Audio could not be decoded or has an unusable format."""


class CapacityError(InferenceError):
    """No device can take the model: every device is full of models in use."""


class ModelInUseError(InferenceError):
    """The model is used by live sessions and cannot be unloaded now."""


class QueueFullError(InferenceError):
    """A device's queue is full; the frame was refused immediately."""


class DeadlineExceededError(InferenceError):
    """A frame's deadline passed before it could run; it was dropped, not computed late."""


class ShuttingDownError(InferenceError):
    """The inference core is shutting down and accepts no new work."""
