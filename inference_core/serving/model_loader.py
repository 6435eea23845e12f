"""The device-thread side of loading models: read a package, open, warm up and measure a model.

Each device has one load thread (a single-thread executor): onnxruntime session creation
is not safe to run concurrently on one device, and the event loop must not block
(``docs/design/serving.md`` §4). A model's memory is what the device's memory probe sees
grow across its open and warm-up, never less than its ONNX file. On CPU devices every
"device" is this process, so CPU loads are measured one at a time. The registry decides
what to load where and when; this module only does the work, off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import onnxruntime as ort

from config.settings import Settings
from inference_core.adapter.onnx_io import open_session
from inference_core.adapter.serving_graph import ServingGraph
from inference_core.avatars.exceptions import AvatarError
from inference_core.avatars.locator import AvatarLocator
from inference_core.avatars.package import AvatarPackage
from inference_core.exceptions import ModelLoadError
from inference_core.serving.devices import Device, MemoryProbe, SystemMemoryProbe, session_config
from inference_core.serving.loaded_model import LoadedModel

logger = logging.getLogger(__name__)

SessionFactory = Callable[[ServingGraph, Device], ort.InferenceSession]
_T = TypeVar("_T")


class ModelLoader:
    """Owns one load thread per device and the memory probe (closed in :meth:`close`).

    ``session_factory`` and ``memory_probe`` are seams for tests; by default sessions
    are opened with the device's providers and options and memory is read by a
    :class:`~inference_core.serving.devices.SystemMemoryProbe` this loader owns.
    """

    def __init__(
        self,
        settings: Settings,
        locator: AvatarLocator,
        devices: Sequence[Device],
        *,
        session_factory: SessionFactory | None = None,
        memory_probe: MemoryProbe | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._locator = locator
        self._session_factory = session_factory or self._open_session
        # Only a probe made here is closed here (NVML is started by the probe).
        self._owned_probe: SystemMemoryProbe | None = None
        if memory_probe is None:
            memory_probe = self._owned_probe = SystemMemoryProbe(settings.devices)
        self.memory_probe: MemoryProbe = memory_probe
        self._clock = clock
        self._devices = [d.name for d in devices]
        self._executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lipstream-load-{d.name}")
            for d in devices
        ]
        # RSS is per process: CPU-device loads measured at the same time would count each
        # other's memory, so the measured part of CPU loads runs one at a time.
        self._cpu_measure_lock = threading.Lock()

    async def read(self, device: Device, model_id: str) -> tuple[AvatarPackage, int]:
        """Parse ``model_id``'s package (on ``device``'s thread): it and its model file's size."""
        return await self._run_on(device, self._read_package, model_id)

    async def build(self, device: Device, package: AvatarPackage, file_size: int) -> LoadedModel:
        """Open, bind, warm up and measure the package's model on ``device``."""
        return await self._run_on(device, self._build, device, package, file_size)

    async def close_model(self, model: LoadedModel) -> None:
        """Free ``model`` on its device's thread (after any load running there)."""
        await self._run_on(model.device, model.close)

    async def close(self, timeout_s: float | None = None) -> None:
        """Wait for the work queued on every load thread (up to ``timeout_s``), stop them,
        close an owned probe. A load still running then (a TensorRT build can take
        minutes) is abandoned and named in the log: its thread ends when the load does."""
        loop = asyncio.get_running_loop()
        drained = {
            loop.run_in_executor(executor, _noop): (executor, name)
            for executor, name in zip(self._executors, self._devices, strict=True)
        }
        _, busy = await asyncio.wait(drained, timeout=timeout_s)
        for future, (executor, _) in drained.items():
            # An idle thread exits at once; a busy one is left to finish its load.
            executor.shutdown(wait=future not in busy)
        if busy:
            logger.warning(
                "model loads still running %.0f s after shutdown began, abandoned: %s",
                timeout_s,
                sorted(drained[future][1] for future in busy),
            )
        if self._owned_probe is not None:
            self._owned_probe.close()

    # -- on the device threads ------------------------------------------------------

    def _read_package(self, model_id: str) -> tuple[AvatarPackage, int]:
        try:
            package = self._locator.load(model_id)
            return package, package.lipsync_path.stat().st_size
        except (AvatarError, OSError) as exc:
            raise ModelLoadError(f"model {model_id!r} cannot be loaded: {exc}") from exc

    def _build(self, device: Device, package: AvatarPackage, file_size: int) -> LoadedModel:
        probe = self.memory_probe
        measure_lock = self._cpu_measure_lock if device.kind == "cpu" else contextlib.nullcontext()
        with measure_lock:
            before = probe.used_bytes(device)
            started = time.perf_counter()
            model = LoadedModel.open(
                package,
                device,
                self._session_factory,
                max_batch_size=self._settings.batching.size_for(device.kind),
                clock=self._clock,
                fp16=self._settings.devices.precision == "fp16",
            )
            load_seconds = time.perf_counter() - started
            after = probe.used_bytes(device)
        # The file size is a floor: RSS/NVML deltas can read low when freed memory is reused.
        model.memory_bytes = max(after - before, file_size)
        model.load_seconds = load_seconds
        logger.info(
            "loaded model %s on %s: memory_bytes=%d load_ms=%.0f max_batch_size=%d",
            package.avatar_id,
            device.name,
            model.memory_bytes,
            load_seconds * 1000,
            model.max_batch_size,
        )
        return model

    def _open_session(self, graph: ServingGraph, device: Device) -> ort.InferenceSession:
        providers, options = session_config(device, self._settings.devices)
        label = str(graph.source) if graph.source else None
        return open_session(graph.serialized(), label=label, providers=providers, options=options)

    async def _run_on(self, device: Device, func: Callable[..., _T], *args: object) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executors[device.index], func, *args)


def _noop() -> None:
    """Queued last on a load thread: when it has run, everything before it has too."""
