"""The serving core: devices, the model registry and a scheduler per device, as one object.

    core = InferenceCore(settings, locator)
    await core.start()                       # register every avatar, preload, start workers
    async with await core.open("alice") as model:   # loads on demand, holds the model
        face = await model.submit(visual_u8, audio, deadline=now + 0.2)
    await core.stop()                        # stop accepting, finish or fail work, free memory

A held model is never evicted. Frames of every session that uses one model are batched
together by its device's scheduler; frames past their deadline are dropped, not run late.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnxruntime as ort

from config.settings import Settings
from inference_core.adapter.onnx_io import ModelBinding
from inference_core.adapter.serving_graph import ServingGraph, read_binding
from inference_core.adapter.spec import AdapterSpec
from inference_core.avatars.locator import AvatarLocator
from inference_core.exceptions import ShuttingDownError
from inference_core.serving.devices import (
    Device,
    MemoryProbe,
    check_gpu_options,
    detect_devices,
)
from inference_core.serving.events import CoreEvents
from inference_core.serving.handle import ModelHandle
from inference_core.serving.loaded_model import LoadedModel
from inference_core.serving.registry import ModelRegistry
from inference_core.serving.scheduler import DeviceScheduler
from inference_core.serving.snapshot import CoreSnapshot, DeviceSnapshot, ModelState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelIo:
    """What a model takes and gives: its adapter spec and which ONNX tensor is which."""

    spec: AdapterSpec
    binding: ModelBinding


SessionFactory = Callable[[ServingGraph, Device], ort.InferenceSession]


class InferenceCore:
    """Owns the devices' schedulers, the registry and the idle-eviction task.

    ``events`` (default: none) hears about batches run and models loaded, from the
    worker and load threads; see :mod:`inference_core.serving.events`.
    """

    def __init__(
        self,
        settings: Settings,
        locator: AvatarLocator,
        *,
        devices: Sequence[Device] | None = None,
        session_factory: SessionFactory | None = None,
        memory_probe: MemoryProbe | None = None,
        events: CoreEvents | None = None,
    ) -> None:
        self.settings = settings
        self.devices = list(devices) if devices is not None else detect_devices(settings.devices)
        check_gpu_options(settings.devices, self.devices)
        batching = settings.batching
        self.schedulers = [
            DeviceScheduler(
                device.name,
                workers=settings.devices.workers_for(device.kind),
                queue_size=batching.queue_size,
                max_batch_size=batching.size_for(device.kind),
                max_wait_ms=batching.max_wait_ms,
                events=events,
            )
            for device in self.devices
        ]
        self.registry = ModelRegistry(
            settings,
            locator,
            self.devices,
            session_factory=session_factory,
            memory_probe=memory_probe,
            queue_depth=lambda index: self.schedulers[index].queue_depth,
            on_unload=self._drop_queued_frames,
            events=events,
        )
        self._idle_task: asyncio.Task[None] | None = None
        self._started = False
        self._stopping = False

    def set_events(self, events: CoreEvents) -> None:
        """Report to ``events`` from now on (for an observer made after the core)."""
        self.registry.events = events
        for scheduler in self.schedulers:
            scheduler.events = events

    def scheduler_for(self, device: Device) -> DeviceScheduler:
        return self.schedulers[device.index]

    def _drop_queued_frames(self, model: LoadedModel) -> None:
        dropped = self.scheduler_for(model.device).drop_model(model.model_id)
        if dropped:
            logger.info("dropped %d queued frames of unloaded model %s", dropped, model.model_id)

    async def start(self) -> None:
        """Register every avatar, start the workers, preload, start idle eviction."""
        started = time.perf_counter()
        count = self.registry.register_all()
        for scheduler in self.schedulers:
            scheduler.start()
        self._started = True
        await self.registry.preload()
        if self.settings.registry.idle_timeout_s > 0:
            self._idle_task = asyncio.create_task(self._evict_idle_forever(), name="idle-evict")
        logger.info(
            "inference core ready: devices=%s models_registered=%d start_ms=%.0f",
            ",".join(d.name for d in self.devices),
            count,
            (time.perf_counter() - started) * 1000,
        )

    async def open(self, model_id: str, *, device: int | None = None) -> ModelHandle:
        """Hold ``model_id`` (loading it first if needed) and return a handle to it."""
        if self._stopping or not self._started:
            raise ShuttingDownError("the inference core is not running")
        model = await self.registry.acquire(model_id, device=device)
        return ModelHandle(model, self.scheduler_for(model.device), self.registry.release)

    # -- what the outside may ask ---------------------------------------------------------

    def check_registered(self, model_id: str) -> None:
        """Raise ``InvalidAvatarIdError`` (malformed) or ``AvatarNotFoundError`` (unknown)."""
        self.registry.entry(model_id)

    def model_ids(self) -> list[str]:
        """Every registered model id, sorted."""
        return self.registry.ids()

    def register(self, model_id: str) -> None:
        """Register a package that appeared under the avatar root (an import); idempotent."""
        self.registry.register(model_id)

    def is_loaded(self, model_id: str) -> bool:
        """True while ``model_id`` is loaded or loading on a device."""
        known = model_id in self.registry.ids()
        return known and self.registry.entry(model_id).state in ("loaded", "loading")

    async def model_io(self, model_id: str) -> ModelIo:
        """``model_id``'s adapter spec and its ONNX tensors' own names.

        From the loaded model when there is one, else read from its files (off the event
        loop; see :func:`~inference_core.adapter.serving_graph.read_binding`).
        """
        model = self.registry.entry(model_id).model
        adapter = model.adapter if model is not None else None
        if adapter is not None:
            return ModelIo(adapter.spec, adapter.binding)
        package = await asyncio.to_thread(self.registry.locator.load, model_id)
        spec = package.manifest.adapter
        binding = await asyncio.to_thread(read_binding, package.lipsync_path, spec)
        return ModelIo(spec, binding)

    def model_state(self, model_id: str) -> ModelState:
        """Where ``model_id`` is: registered, loading, loaded or failed."""
        return self.registry.entry(model_id).state

    def display_name(self, model_id: str) -> str:
        """The avatar's display name (reads its manifest: call it off the event loop)."""
        return self.registry.locator.display_name(model_id)

    def clip_names(self, model_id: str) -> list[str]:
        """The avatar's idle clips (reads its manifest: call it off the event loop)."""
        return self.registry.locator.clip_names(model_id)

    async def load(self, model_id: str, device: int | None = None) -> None:
        """Load ``model_id`` now (on ``device`` if given) without holding it.

        A loaded model stays where it is. Raises :class:`LoadTimeoutError` when the load
        takes longer than ``registry.load_timeout_s`` (it goes on in the background).
        """
        await self.registry.load(model_id, device)

    async def unload(self, model_id: str) -> None:
        """Unload ``model_id`` now; ``ModelInUseError`` while sessions hold it."""
        await self.registry.unload(model_id)

    async def snapshot(self) -> CoreSnapshot:
        """Everything operators see, at this moment (see :mod:`~.snapshot`).

        Device memory is read off the event loop (NVML may take a while on first use);
        the rest is read on it, where the registry's bookkeeping lives.
        """
        probe = self.registry.memory_probe
        memory = await asyncio.to_thread(
            lambda: [(probe.used_bytes(d), probe.total_bytes(d)) for d in self.devices]
        )
        limits = self.settings.devices
        devices = tuple(
            DeviceSnapshot(
                index=device.index,
                name=device.name,
                kind=device.kind,
                models_loaded=models.models_loaded,
                models_loading=models.models_loading,
                model_memory_bytes=models.memory_bytes,
                max_memory_bytes=limits.max_memory_per_device,
                max_models=limits.max_models_per_device,
                memory_used_bytes=used,
                memory_total_bytes=total,
                scheduler=scheduler.stats(),
            )
            for device, models, scheduler, (used, total) in zip(
                self.devices, self.registry.device_models(), self.schedulers, memory, strict=True
            )
        )
        return CoreSnapshot(
            running=self._started and not self._stopping,
            devices=devices,
            models=self.registry.model_snapshots(),
            evictions=self.registry.evictions,
        )

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting work, finish in-flight batches, fail the rest, free every model."""
        if self._stopping:
            return
        self._stopping = True
        if self._idle_task is not None:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(loop.run_in_executor(None, s.stop, timeout_s) for s in self.schedulers)
        )
        await self.registry.close(timeout_s)
        logger.info("inference core stopped")

    async def _evict_idle_forever(self) -> None:
        period = max(1.0, min(30.0, self.settings.registry.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            try:
                evicted = await self.registry.evict_idle()
            except Exception:  # keep the task alive: one bad pass must not stop eviction
                logger.exception("idle eviction pass failed")
                continue
            if evicted:
                logger.info("evicted idle models: %s", ",".join(evicted))
