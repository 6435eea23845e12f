"""The lip-sync model adapter: avatar crops + audio windows in, uint8 face regions out.

What the model expects (sizes, mask, colour and channel order, scaling) comes from the
avatar manifest's :class:`~inference_core.avatars.manifest.AdapterSpec`. The model runs
as its serving graph, which takes the ``S×S`` BGR region of a crop and returns a BGR
face, both uint8 (``docs/design/model.md`` §3); :class:`FaceInputBuilder` also builds
the float input of the model's own contract, for the raw API and for checking the graph.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort

from inference_core.adapter.onnx_io import ModelBinding, open_session
from inference_core.adapter.serving_graph import (
    AUDIO,
    CROPS,
    FACES,
    RAW,
    SCALED,
    load_serving_graph,
)
from inference_core.adapter.spec import AdapterSpec
from inference_core.exceptions import ModelInputError, ModelLoadError

logger = logging.getLogger(__name__)


class FaceInputBuilder:
    """Turns a rect-sized region of an avatar frame into the model's uint8 visual input.

    Needs only the adapter spec, not a session, so frames can be prepared wherever the
    model happens to run.
    """

    def __init__(self, spec: AdapterSpec) -> None:
        self.spec = spec
        x, y, w, h = spec.mask_rect
        self._mask = (slice(y, y + h), slice(x, x + w))

    def crop_for_model(self, region_bgr: np.ndarray) -> np.ndarray:
        """Resize a rect-sized BGR region to the crop size (bicubic), as training did."""
        size = self.spec.crop_size
        return cv2.resize(region_bgr, (size, size), interpolation=cv2.INTER_CUBIC)

    def model_region(self, crop_bgr: np.ndarray) -> np.ndarray:
        """The ``S×S`` BGR region of a crop-size crop that the model sees (a view).

        This is what the serving graph takes; it builds the six-channel input itself.
        """
        b, s = self.spec.crop_border, self.spec.input_size
        return crop_bgr[b : b + s, b : b + s]

    def scaled_input(self, crop_bgr: np.ndarray) -> np.ndarray:
        """The float32 ``[6,S,S]`` input the model itself takes (the raw API's contract)."""
        if self.spec.pixel_scale == "zero_one":
            scale, offset = 1.0 / 255.0, 0.0
        else:
            scale, offset = 1.0 / 127.5, -1.0
        out: np.ndarray = np.multiply(
            self.visual_input(crop_bgr), np.float32(scale), dtype=np.float32
        )
        if offset:
            out += np.float32(offset)
        return out

    def visual_input(self, crop_bgr: np.ndarray) -> np.ndarray:
        """Build the uint8 ``[6,S,S]`` visual input from a crop-sized BGR crop.

        Reference = the crop's inner ``S×S``; the masked copy has ``mask_rect`` zeroed.
        """
        spec = self.spec
        if crop_bgr.shape != (spec.crop_size, spec.crop_size, 3) or crop_bgr.dtype != np.uint8:
            raise ModelInputError(
                f"crop must be uint8 ({spec.crop_size},{spec.crop_size},3), "
                f"got {crop_bgr.dtype} {crop_bgr.shape}"
            )
        b, s = spec.crop_border, spec.input_size
        inner = crop_bgr[b : b + s, b : b + s]
        if spec.color_order == "rgb":
            inner = inner[:, :, ::-1]
        # One strided HWC->CHW copy into the output, then a contiguous copy for the
        # masked half: half the cost of transposing twice and concatenating.
        visual = np.empty((6, s, s), dtype=np.uint8)
        if spec.channel_order == "masked_first":
            reference, masked = visual[3:], visual[:3]
        else:
            reference, masked = visual[:3], visual[3:]
        reference[...] = inner.transpose(2, 0, 1)
        masked[...] = reference
        masked[:, self._mask[0], self._mask[1]] = 0
        return visual


class LipSyncAdapter:
    """Runs one lip-sync model through its serving graph (:mod:`.serving_graph`).

    ``run`` takes uint8 model-input regions and gives uint8 faces, ``run_raw`` keeps the
    model's float contract; both chunk to ``max_batch_size`` (1 for a static-batch
    export). Thread-safe (onnxruntime's ``session.run`` is) and the GIL is released while
    the model runs, so callers hand it to an executor. The device serving path
    (:class:`~inference_core.serving.loaded_model.LoadedModel`) shares the session but
    runs it with bound, reused buffers.
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        spec: AdapterSpec,
        binding: ModelBinding,
        *,
        max_batch_size: int = 8,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        names = {i.name for i in session.get_inputs()} | {o.name for o in session.get_outputs()}
        if not {CROPS, SCALED, AUDIO, FACES, RAW} <= names:
            raise ModelLoadError(
                "session is not a lipstream serving graph (open it with LipSyncAdapter.from_path "
                "or inference_core.adapter.serving_graph.load_serving_graph)"
            )
        self.session = session
        self.spec = spec
        self.binding = binding
        self.max_batch_size = max_batch_size if binding.dynamic_batch else 1
        s = spec.input_size
        self._no_scaled = np.zeros((0, *spec.visual_shape), dtype=np.float32)
        self._no_crops = np.zeros((0, s, s, 3), dtype=np.uint8)

    @classmethod
    def from_path(
        cls,
        path: Path,
        spec: AdapterSpec,
        *,
        max_batch_size: int = 8,
        providers: Sequence[str | tuple[str, dict[str, str]]] | None = None,
        options: ort.SessionOptions | None = None,
        fp16: bool = False,
    ) -> LipSyncAdapter:
        """Load, wrap and open ``path``; a model that does not fit raises ModelLoadError."""
        names = [p if isinstance(p, str) else p[0] for p in providers or ()]
        on_cpu = all(name == "CPUExecutionProvider" for name in names)  # none: the CPU's
        graph = load_serving_graph(path, spec, fp16=fp16, raw_branch=on_cpu)
        session = open_session(
            graph.serialized(), label=str(path), providers=providers, options=options
        )
        return cls(session, spec, graph.binding, max_batch_size=max_batch_size)

    def run(self, crops: np.ndarray, audio: np.ndarray) -> np.ndarray:
        """uint8 BGR model-input regions ``[B,S,S,3]`` + float32 audio → uint8 BGR faces."""
        s = self.spec.input_size
        n = self._check(crops, audio, np.uint8, (s, s, 3))
        out = np.empty((n, s, s, 3), dtype=np.uint8)
        for start in range(0, n, self.max_batch_size):
            stop = min(n, start + self.max_batch_size)
            feeds = {
                CROPS: np.ascontiguousarray(crops[start:stop]),
                SCALED: self._no_scaled,
                AUDIO: np.ascontiguousarray(audio[start:stop], dtype=np.float32),
            }
            out[start:stop] = self.session.run([FACES], feeds)[0]
        return out

    def run_raw(self, scaled: np.ndarray, audio: np.ndarray) -> np.ndarray:
        """Already-scaled float32 inputs ``[B,6,S,S]`` → the model's float32 ``[B,3,S,S]``."""
        n = self._check(scaled, audio, np.float32, self.spec.visual_shape)
        chunks = []
        for start in range(0, n, self.max_batch_size):
            stop = min(n, start + self.max_batch_size)
            feeds = {
                CROPS: self._no_crops,
                SCALED: np.ascontiguousarray(scaled[start:stop]),
                AUDIO: np.ascontiguousarray(audio[start:stop], dtype=np.float32),
            }
            chunks.append(self.session.run([RAW], feeds)[0])
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks, axis=0)

    def _check(
        self, visual: np.ndarray, audio: np.ndarray, dtype: type, shape: tuple[int, ...]
    ) -> int:
        spec = self.spec
        n = visual.shape[0] if visual.ndim == len(shape) + 1 else -1
        if visual.dtype != dtype or visual.shape[1:] != shape:
            raise ModelInputError(
                f"visual input must be {np.dtype(dtype).name} [B,{','.join(map(str, shape))}], "
                f"got {visual.dtype} {visual.shape}"
            )
        if audio.shape != (n, *spec.audio_shape):
            raise ModelInputError(
                f"audio input must be [B={n},{','.join(map(str, spec.audio_shape))}], "
                f"got {audio.shape}"
            )
        return n
