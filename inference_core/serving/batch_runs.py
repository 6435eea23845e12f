"""How a loaded model runs one batch: IOBinding over a worker thread's reused buffers.

The frames' uint8 regions and audio are copied into the worker thread's preallocated (on
CUDA page-locked) buffers, the faces come back into a reused output slab, and the binding
object is kept per buffer set, bucket and slab (``docs/design/serving.md`` §4). Raw API
frames (float inputs, float outputs) run with a binding made for that run alone.

Each run also says what its three parts took, as Triton's statistics split a request's
compute time: ``compute_input`` (the frames copied in and bound), ``compute_infer`` (the
model run) and ``compute_output`` (the outputs handed back as per-frame arrays). That is
one clock read between parts, per run, never per frame.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from inference_core.adapter.lipsync import LipSyncAdapter
from inference_core.adapter.serving_graph import AUDIO, CROPS, FACES, RAW, SCALED
from inference_core.exceptions import ModelLoadError
from inference_core.serving.batch_buffers import (
    InputBuffers,
    bucket_for,
    bucket_sizes,
    thread_buffers,
)
from inference_core.serving.devices import Device
from inference_core.serving.frame_request import FrameRequest


@dataclass(slots=True)
class RunTimes:
    """Nanoseconds the parts of some runs took, each run's counted once per frame it
    carried: Triton's rule, where a batch's time is the time of every request in it."""

    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0

    def add(self, frames: int, started: int, bound: int, ran: int, done: int) -> None:
        """One run of ``frames`` frames, from ``time.perf_counter_ns`` reads at its start,
        once its inputs were bound, once the model ran and once its outputs were out."""
        self.input_ns += (bound - started) * frames
        self.infer_ns += (ran - bound) * frames
        self.output_ns += (done - ran) * frames


class BatchRuns:
    """One model's runs on one device: its buckets, padding and the bindings it keeps.

    ``pad_batches`` runs every batch at its bucket's size (on CUDA a new shape costs an
    algorithm search). Thread-safe as the workers use it: every buffer set belongs to one
    thread, so a kept binding is only ever used by one thread at a time.
    """

    def __init__(
        self, model_id: str, adapter: LipSyncAdapter, device: Device, *, pad_batches: bool
    ) -> None:
        self._model_id = model_id
        self._adapter: LipSyncAdapter | None = adapter
        self._spec = adapter.spec
        self._device = device
        self.buckets = bucket_sizes(adapter.max_batch_size)
        self.pad_batches = pad_batches
        s = self._spec.input_size
        self.region_shape = (s, s, 3)
        self._no_scaled = np.zeros((0, *self._spec.visual_shape), dtype=np.float32)
        # (input buffer set, batch rows, output slab) -> the IOBinding made for them.
        self._bindings: dict[tuple[int, int, int], ort.IOBinding] = {}

    @property
    def adapter(self) -> LipSyncAdapter | None:
        """The adapter and its session; None once closed."""
        return self._adapter

    def binding_keys(self) -> set[tuple[int, int, int]]:
        """The (buffer set, rows, slab) serials of the bindings kept now."""
        return set(self._bindings)

    def close(self) -> None:
        """Drop the session and the bindings into it."""
        self._adapter = None
        self._bindings = {}

    def warm_up(self) -> None:
        """Run every bucket once (and a raw frame) so no shape is first seen live."""
        spec = self._spec
        region = np.zeros(self.region_shape, dtype=np.uint8)
        audio = np.zeros(spec.audio_shape, dtype=np.float32)
        frame = _WarmUpFrame(region, audio, raw=False)
        unused = RunTimes()
        for size in self.buckets:
            self.run([frame] * size, unused)  # type: ignore[list-item]
        raw = _WarmUpFrame(np.zeros(spec.visual_shape, dtype=np.float32), audio, raw=True)
        self.run([raw], unused)  # type: ignore[list-item]

    def run(self, requests: Sequence[FrameRequest], times: RunTimes) -> list[np.ndarray]:
        """One model run of at most the largest bucket's frames: faces' frames first, raw
        frames last, padded if configured; its parts' times added to ``times``."""
        started = time.perf_counter_ns()
        adapter = self._require_adapter()
        spec = self._spec
        raw_count = sum(1 for r in requests if r.raw)
        live = len(requests) - raw_count
        rows = bucket_for(len(requests), self.buckets) if self.pad_batches else len(requests)
        crop_rows = rows - raw_count  # padding sits after the faces' frames
        local = thread_buffers()
        buffers = local.get(
            spec.input_size, spec.audio_shape, self.buckets[-1], pinned=self._device.kind == "cuda"
        )
        crops, audio = buffers.crops, buffers.audio
        for j in range(live):
            request = requests[j]
            crops[j] = request.visual
            audio[j] = request.audio
        for k in range(raw_count):
            audio[crop_rows + k] = requests[live + k].audio
        if raw_count:
            return self._run_mixed(adapter, requests, live, buffers, rows, started, times)
        slab = local.faces(spec.input_size, self.buckets[-1], pinned=buffers.pinned)
        faces = slab.faces[:rows]
        key = (buffers.serial, rows, slab.serial)
        io = self._bindings.get(key) if slab.pooled else None
        on_host = self._device.kind == "cpu"
        if io is None:
            # The buffers and a kept slab stay where they are: bound once, used every run
            # (a one-off slab's binding goes with it, so the table stays bounded).
            io = adapter.session.io_binding()
            if slab.pooled:
                self._bindings[key] = io
            io.bind_cpu_input(SCALED, self._no_scaled)
            io.bind_output(FACES, "cpu", 0, np.uint8, list(faces.shape), faces.ctypes.data)
            if on_host:
                io.bind_cpu_input(CROPS, crops[:rows])
                io.bind_cpu_input(AUDIO, audio[:rows])
        if not on_host:  # on a GPU binding an input is its copy to the device: every run
            io.bind_cpu_input(CROPS, crops[:rows])
            io.bind_cpu_input(AUDIO, audio[:rows])
        bound = time.perf_counter_ns()
        adapter.session.run_with_iobinding(io)
        ran = time.perf_counter_ns()
        outputs = list(faces[:live])
        times.add(len(requests), started, bound, ran, time.perf_counter_ns())
        return outputs

    def _run_mixed(
        self,
        adapter: LipSyncAdapter,
        requests: Sequence[FrameRequest],
        live: int,
        buffers: InputBuffers,
        rows: int,
        started: int,
        times: RunTimes,
    ) -> list[np.ndarray]:
        """A run with raw API frames (those after the first ``live``): their scaled inputs
        and float outputs are this run's own arrays, bound for this run only."""
        spec = self._spec
        raws = requests[live:]
        crop_rows = rows - len(raws)  # padding sits after the faces' frames
        s = spec.input_size
        io = adapter.session.io_binding()
        io.bind_cpu_input(CROPS, buffers.crops[:crop_rows])
        io.bind_cpu_input(SCALED, np.stack([r.visual for r in raws]))
        io.bind_cpu_input(AUDIO, buffers.audio[:rows])
        faces = np.empty((rows, s, s, 3), dtype=np.uint8)
        raw = np.empty((rows, *spec.output_shape), dtype=np.float32)
        io.bind_output(FACES, "cpu", 0, np.uint8, list(faces.shape), faces.ctypes.data)
        io.bind_output(RAW, "cpu", 0, np.float32, list(raw.shape), raw.ctypes.data)
        bound = time.perf_counter_ns()
        adapter.session.run_with_iobinding(io)
        ran = time.perf_counter_ns()
        outputs = [*faces[:live], *raw[crop_rows:]]
        times.add(len(requests), started, bound, ran, time.perf_counter_ns())
        return outputs

    def _require_adapter(self) -> LipSyncAdapter:
        adapter = self._adapter
        if adapter is None:
            raise ModelLoadError(
                f"model {self._model_id!r} was unloaded from {self._device.name}; acquire it again"
            )
        return adapter


@dataclass(frozen=True)
class _WarmUpFrame:
    """The fields of a :class:`FrameRequest` that a model run reads."""

    visual: np.ndarray
    audio: np.ndarray
    raw: bool
