"""Audio features: 16 kHz PCM (:data:`FEATURE_RATE`) in, one model audio input per video
frame out (``docs/design/model.md`` §3).

:class:`StreamingMel` makes the "ave" mel spectrogram 20 ms at a time,
:class:`AudioEncoder` turns each 16-step mel window into 512 values, and
:class:`AudioFeatureStream` assembles them into the ``[32,16,16]`` window of each frame as
soon as its audio (plus the model's lookahead) has arrived. :func:`offline_features` does
the same for a whole file and gives identical results. Imports only the adapter's ONNX
helpers and :mod:`inference_core.exceptions`.
"""

from __future__ import annotations

from inference_core.features.encoder import AudioEncoder
from inference_core.features.mel import FEATURE_RATE, MelConfig, StreamingMel, melspectrogram
from inference_core.features.stream import AudioFeatureStream, FrameAudio, offline_features
from inference_core.features.timing import lookahead_ms

__all__ = [
    "FEATURE_RATE",
    "AudioEncoder",
    "AudioFeatureStream",
    "FrameAudio",
    "MelConfig",
    "StreamingMel",
    "lookahead_ms",
    "melspectrogram",
    "offline_features",
]
