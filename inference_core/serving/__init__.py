"""Serving lip-sync models: devices, the model registry, a batching scheduler per device
(``docs/design/serving.md`` §4).

:class:`InferenceCore` owns the devices, the :class:`ModelRegistry` (load on demand,
placement, eviction) and a :class:`DeviceScheduler` per device (bounded queue,
cross-session batching per model, deadlines); ``core.open(id)`` hands out a
:class:`ModelHandle` to submit frames to, and ``core.snapshot()`` returns a
:class:`CoreSnapshot` of everything operators see. Imports :mod:`config`,
:mod:`inference_core.adapter` and :mod:`inference_core.avatars`; never the asset
generators, :mod:`streaming` or :mod:`web`.
"""

from __future__ import annotations

from inference_core.serving.core import InferenceCore
from inference_core.serving.devices import Device, MemoryProbe, detect_devices, session_config
from inference_core.serving.events import CoreEvents, NoCoreEvents
from inference_core.serving.frame_request import FrameRequest, ModelRunner
from inference_core.serving.handle import ModelHandle
from inference_core.serving.loaded_model import LoadedModel
from inference_core.serving.registry import ModelRegistry
from inference_core.serving.scheduler import DeviceScheduler

__all__ = [
    "CoreEvents",
    "Device",
    "DeviceScheduler",
    "FrameRequest",
    "InferenceCore",
    "LoadedModel",
    "MemoryProbe",
    "ModelHandle",
    "ModelRegistry",
    "ModelRunner",
    "NoCoreEvents",
    "detect_devices",
    "session_config",
]
