"""The audio encoder ("AVE"): mel windows ``[n,1,80,16]`` in, 512 features per window out.

One window per video frame (``docs/design/model.md`` §3);
:mod:`inference_core.features.stream` decides which windows exist and when, this module
only runs the ONNX model.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from inference_core.adapter.onnx_io import fits_shape, shape_text
from inference_core.exceptions import ModelInputError, ModelLoadError

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]

MEL_WINDOW = 16  # mel frames per window (0.2 s)
ENCODER_INPUT = (1, 80, MEL_WINDOW)  # per-window encoder input, after the batch axis
ENCODER_FEATURES = 512


class AudioEncoder:
    """The audio-encoder ONNX: mel windows ``[n,1,80,16]`` → features ``[n,512]``.

    The input is found by its shape, not its name (exports name it differently). A static
    batch axis is fed one batch at a time; a dynamic one gets every window in one run.
    """

    def __init__(self, session: Any, *, source: str = "in-memory session") -> None:
        inputs = session.get_inputs()
        outputs = session.get_outputs()
        found_in = ", ".join(f"{i.name}{shape_text(i.shape)}" for i in inputs)
        want_in = f"one float32 input [B,{','.join(map(str, ENCODER_INPUT))}] (a mel window)"
        if len(inputs) != 1 or not fits_shape(inputs[0].shape, ENCODER_INPUT):
            raise ModelLoadError(
                f"audio encoder {source}: found input(s) {found_in or 'none'}, expected {want_in}"
            )
        if inputs[0].type != "tensor(float)":
            raise ModelLoadError(
                f"audio encoder {source}: input {inputs[0].name} is {inputs[0].type}, "
                f"expected tensor(float)"
            )
        fitting = [o for o in outputs if fits_shape(o.shape, (ENCODER_FEATURES,))]
        if not fitting:
            found_out = ", ".join(f"{o.name}{shape_text(o.shape)}" for o in outputs)
            raise ModelLoadError(
                f"audio encoder {source}: found output(s) {found_out or 'none'}, expected "
                f"an output [B,{ENCODER_FEATURES}]"
            )
        batch = inputs[0].shape[0]
        self._session = session
        self._source = source
        self._input_name: str = inputs[0].name
        self._output_name: str = fitting[0].name
        self._static_batch: int | None = batch if isinstance(batch, int) else None
        logger.debug(
            "audio encoder %s: input %s, output %s, batch %s",
            source,
            self._input_name,
            self._output_name,
            batch if self._static_batch is not None else "dynamic",
        )

    @classmethod
    def from_path(
        cls,
        path: str | os.PathLike[str],
        providers: list[str] | None = None,
        session_options: Any = None,
    ) -> AudioEncoder:
        """Load the encoder from an ONNX file; :class:`ModelLoadError` says why it cannot.

        By default on one thread that never spin-waits: the encoder runs one small
        window per frame in each session's own thread, so sessions are the parallelism
        (onnxruntime's default, a spinning pool per session, burnt a core's share in
        every call).
        """
        model = Path(path)
        if not model.is_file():
            raise ModelLoadError(
                f"audio encoder model not found: {model} (check the avatar's audio_encoder path)"
            )
        if session_options is None:
            session_options = single_thread_options()
        try:
            session = ort.InferenceSession(
                str(model),
                sess_options=session_options,
                providers=providers or ["CPUExecutionProvider"],
            )
        # onnxruntime raises its own exception types (InvalidProtobuf, Fail, ...) that
        # share no base class besides Exception; the cause is chained, not swallowed.
        except Exception as exc:
            raise ModelLoadError(f"cannot load audio encoder {model}: {exc}") from exc
        return cls(session, source=str(model))

    @property
    def static_batch(self) -> int | None:
        """The model's fixed batch size, or ``None`` when its batch axis is dynamic."""
        return self._static_batch

    def encode(self, windows: npt.ArrayLike) -> FloatArray:
        """Encode mel windows ``[n,1,80,16]`` into features ``[n,512]`` (float32)."""
        batch = np.ascontiguousarray(windows, dtype=np.float32)
        if batch.ndim != 4 or batch.shape[1:] != ENCODER_INPUT:
            raise ModelInputError(
                f"audio encoder needs windows [n,{','.join(map(str, ENCODER_INPUT))}], "
                f"got {list(batch.shape)}"
            )
        count = batch.shape[0]
        if count == 0:
            return np.empty((0, ENCODER_FEATURES), dtype=np.float32)
        if self._static_batch is None:
            return self._run(batch, count)
        size = self._static_batch
        parts = []
        for start in range(0, count, size):
            chunk = batch[start : start + size]
            used = chunk.shape[0]
            if used < size:  # a fixed batch axis must be filled; the padding is discarded
                chunk = np.concatenate(
                    (chunk, np.zeros((size - used, *ENCODER_INPUT), dtype=np.float32))
                )
            parts.append(self._run(chunk, size)[:used])
        return np.concatenate(parts)

    def _run(self, batch: FloatArray, count: int) -> FloatArray:
        (out,) = self._session.run([self._output_name], {self._input_name: batch})
        result = np.asarray(out, dtype=np.float32)
        if result.shape != (count, ENCODER_FEATURES):
            raise ModelLoadError(
                f"audio encoder {self._source} returned shape {list(result.shape)} for "
                f"{count} windows, expected [{count},{ENCODER_FEATURES}]"
            )
        return result


def single_thread_options() -> ort.SessionOptions:
    """Session options for a small model run inline by its caller's thread."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options
