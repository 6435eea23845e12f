"""The model adapter: how an avatar's crops and audio windows become a lip-sync model's
inputs, and its output a face (``docs/design/model.md`` §3).

:class:`AdapterSpec` is the data (sizes, mask, colour and channel order, scaling) an
avatar manifest carries; :mod:`~inference_core.adapter.onnx_io` opens a model and binds
its tensors by shape; :class:`FaceInputBuilder` and :class:`LipSyncAdapter` do the
per-frame conversions. Imports only :mod:`inference_core.exceptions`.
"""

from __future__ import annotations

from inference_core.adapter.lipsync import FaceInputBuilder, LipSyncAdapter
from inference_core.adapter.onnx_io import (
    ModelBinding,
    bind_inputs,
    fits_shape,
    open_session,
    shape_text,
)
from inference_core.adapter.spec import AdapterSpec

__all__ = [
    "AdapterSpec",
    "FaceInputBuilder",
    "LipSyncAdapter",
    "ModelBinding",
    "bind_inputs",
    "fits_shape",
    "open_session",
    "shape_text",
]
