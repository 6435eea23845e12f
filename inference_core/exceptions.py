"""Errors raised by the model adapter, the audio features and the serving core.

Hierarchy::

    InferenceError                 root: a model cannot be loaded, fed or run
    ├── ModelLoadError             an ONNX file is missing, corrupt or does not fit its adapter
    │   ├── ModelOutOfMemoryError  the device ran out of memory while loading or warming up
    │   └── LoadTimeoutError       the load took longer than allowed (it goes on in the background)
    ├── ModelInputError            tensors or samples do not have the shape or type needed
    ├── CapacityError              no device has room for the model (all loaded models in use)
    ├── ModelInUseError            the model is held by live sessions (cannot unload)
    ├── QueueFullError             a device's queue is full: the frame is refused at once
    ├── DeadlineExceededError      a frame's deadline passed before it could run: dropped
    └── ShuttingDownError          the core is stopping and takes no new work

Avatar packages have their own root (:class:`inference_core.avatars.AvatarError`). Every
message names the thing that failed and what to do about it.
"""

from __future__ import annotations


class InferenceError(Exception):
    """Root of all inference-core errors."""


class ModelLoadError(InferenceError):
    """An ONNX model could not be loaded or does not fit its adapter."""


class ModelOutOfMemoryError(ModelLoadError):
    """The device ran out of memory while a model was loaded or warmed up."""


class LoadTimeoutError(ModelLoadError):
    """A load took longer than ``registry.load_timeout_s``; it keeps loading in the background."""


class ModelInputError(InferenceError):
    """Tensors or samples handed to a model or a feature extractor have the wrong shape or type."""


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
