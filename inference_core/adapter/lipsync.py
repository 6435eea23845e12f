"""The lip-sync model adapter: avatar crops + audio windows in, uint8 face regions out.

What the model expects (sizes, mask, colour and channel order, scaling) comes from the
avatar manifest's :class:`~inference_core.avatars.manifest.AdapterSpec`.

Frames travel as uint8 until the last moment: a 6×320×320 visual input is 614 KB as
uint8 and 2.46 MB as float32 (``docs/architecture.md`` §3).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort

from inference_core.adapter.onnx_io import bind_inputs, open_session
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
    """Feeds one lip-sync ONNX session according to an :class:`AdapterSpec`.

    ``run`` is thread-safe (onnxruntime's ``session.run`` is) and releases the GIL while
    the model runs, so callers hand it to an executor.
    """

    def __init__(
        self, session: ort.InferenceSession, spec: AdapterSpec, *, max_batch_size: int = 8
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.session = session
        self.spec = spec
        self.binding = bind_inputs(
            [(i.name, i.shape) for i in session.get_inputs()],
            [(o.name, o.shape) for o in session.get_outputs()],
            spec,
        )
        self.max_batch_size = max_batch_size if self.binding.dynamic_batch else 1
        if spec.pixel_scale == "zero_one":
            self._in_scale, self._in_offset = 1.0 / 255.0, 0.0
        else:
            self._in_scale, self._in_offset = 1.0 / 127.5, -1.0

    @classmethod
    def from_path(
        cls,
        path: Path,
        spec: AdapterSpec,
        *,
        max_batch_size: int = 8,
        providers: Sequence[str | tuple[str, dict[str, str]]] | None = None,
        options: ort.SessionOptions | None = None,
    ) -> LipSyncAdapter:
        """Load ``path`` and bind it; a model that does not fit raises :class:`ModelLoadError`."""
        session = open_session(path, providers=providers, options=options)
        try:
            return cls(session, spec, max_batch_size=max_batch_size)
        except ModelLoadError as exc:
            raise ModelLoadError(f"{path}: {exc}") from exc

    def run(self, visual: np.ndarray, audio: np.ndarray) -> np.ndarray:
        """Run uint8 visual inputs ``[B,6,S,S]`` with float32 audio ``[B,*audio_shape]``.

        Returns BGR uint8 face regions ``[B,S,S,3]``. Any B works: batches are chunked to
        ``max_batch_size`` (1 for models with a static batch axis).
        """
        n = self._check_batch(visual, audio, visual_dtype=np.uint8)
        out = np.empty((n, self.spec.input_size, self.spec.input_size, 3), dtype=np.uint8)
        for start in range(0, n, self.max_batch_size):
            stop = min(n, start + self.max_batch_size)
            y = self._run_float(self.scale_visual(visual[start:stop]), audio[start:stop])
            out[start:stop] = self.to_uint8(y)
        return out

    def scale_visual(self, visual: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 visual input(s) → float32 as the model expects (``pixel_scale``)."""
        out = np.multiply(visual, np.float32(self._in_scale), out=out, dtype=np.float32)
        if self._in_offset:
            out += np.float32(self._in_offset)
        return out

    def to_uint8(self, y: np.ndarray) -> np.ndarray:
        """Model outputs ``[B,3,S,S]`` → uint8 BGR faces ``[B,S,S,3]`` (``output_scale``).

        Scaled, rounded to nearest and saturated in one OpenCV pass per face, then
        interleaved by ``cv2.merge`` (0.11 ms for a 320 face here; 0.8 ms with numpy's
        five passes).
        """
        if self.spec.output_scale == "minus_one_one":
            scale, offset = 127.5, 127.5
        else:
            scale, offset = 255.0, 0.0
        b, c, h, w = y.shape
        out = np.empty((b, h, w, 3), dtype=np.uint8)
        flat = np.ascontiguousarray(y, dtype=np.float32).reshape(b, c * h, w)
        for i in range(b):
            planes = cv2.addWeighted(flat[i], scale, flat[i], 0.0, offset, dtype=cv2.CV_8U)
            p0, p1, p2 = planes.reshape(c, h, w)
            bgr = [p2, p1, p0] if self.spec.color_order == "rgb" else [p0, p1, p2]
            cv2.merge(bgr, dst=out[i])
        return out

    def run_raw(self, visual: np.ndarray, audio: np.ndarray) -> np.ndarray:
        """Run already-scaled float32 inputs and return the raw float32 outputs ``[B,3,S,S]``."""
        n = self._check_batch(visual, audio, visual_dtype=np.float32)
        chunks = [
            self._run_float(visual[i : i + self.max_batch_size], audio[i : i + self.max_batch_size])
            for i in range(0, n, self.max_batch_size)
        ]
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks, axis=0)

    def _check_batch(self, visual: np.ndarray, audio: np.ndarray, *, visual_dtype: type) -> int:
        spec = self.spec
        n = visual.shape[0] if visual.ndim == 4 else -1
        if visual.dtype != visual_dtype or visual.shape[1:] != spec.visual_shape:
            raise ModelInputError(
                f"visual input must be {np.dtype(visual_dtype).name} "
                f"[B,{','.join(map(str, spec.visual_shape))}], got {visual.dtype} {visual.shape}"
            )
        if audio.shape != (n, *spec.audio_shape):
            raise ModelInputError(
                f"audio input must be [B={n},{','.join(map(str, spec.audio_shape))}], "
                f"got {audio.shape}"
            )
        return n

    def _run_float(self, visual: np.ndarray, audio: np.ndarray) -> np.ndarray:
        b = self.binding
        feeds = {b.visual_name: visual, b.audio_name: np.ascontiguousarray(audio, np.float32)}
        result = self.session.run([b.output_name], feeds)[0]
        return np.asarray(result, dtype=np.float32)
