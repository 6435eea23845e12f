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
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np
import onnxruntime as ort

from config.settings import Settings
from inference_core.avatar import AvatarLocator, AvatarPackage
from inference_core.devices import Device, MemoryProbe, detect_devices
from inference_core.events import CoreEvents
from inference_core.exceptions import ModelInputError, ShuttingDownError
from inference_core.frame_request import FrameRequest
from inference_core.loaded_model import LoadedModel
from inference_core.manifest import AdapterSpec
from inference_core.registry import ModelRegistry
from inference_core.scheduler import DeviceScheduler

logger = logging.getLogger(__name__)

SessionFactory = Callable[[Path, Device], ort.InferenceSession]


class ModelHandle:
    """A held, loaded model: submit frames to it; close (or ``async with``) to let it go."""

    def __init__(self, core: InferenceCore, model: LoadedModel) -> None:
        self._core = core
        self._model = model
        self._closed = False

    @property
    def model_id(self) -> str:
        return self._model.model_id

    @property
    def device(self) -> Device:
        return self._model.device

    @property
    def spec(self) -> AdapterSpec:
        return self._model.package.manifest.adapter

    @property
    def package(self) -> AvatarPackage:
        return self._model.package

    def submit(
        self,
        visual: np.ndarray,
        audio: np.ndarray,
        *,
        deadline: float,
        session_id: str | None = None,
        raw: bool = False,
    ) -> asyncio.Future[np.ndarray]:
        """Queue one frame; the future gets a uint8 BGR face (or float32 ``[3,S,S]`` if raw).

        Never blocks: a full queue raises ``QueueFullError`` at once. ``deadline`` is on
        the ``time.monotonic()`` clock; a frame not started by then fails with
        ``DeadlineExceededError``.
        """
        if self._closed:
            raise ShuttingDownError(f"handle on model {self.model_id!r} was closed")
        loop = asyncio.get_running_loop()
        request = FrameRequest(
            model_id=self.model_id,
            visual=visual,
            audio=audio,
            deadline=deadline,
            future=loop.create_future(),
            loop=loop,
            session_id=session_id,
            raw=raw,
        )
        self._core.scheduler_for(self._model.device).submit(request, self._model)
        return request.future

    async def infer(
        self, visual: np.ndarray, audio: np.ndarray, *, timeout_s: float, raw: bool = True
    ) -> np.ndarray:
        """Run a batch of ``N`` frames (split into the model's batch size by the scheduler).

        Returns the ``N`` outputs stacked. All frames share one deadline ``timeout_s`` ahead.
        """
        if visual.shape[0] != audio.shape[0]:
            raise ModelInputError(
                f"{visual.shape[0]} visual frames but {audio.shape[0]} audio windows"
            )
        deadline = time.monotonic() + timeout_s
        futures = [
            self.submit(visual[i], audio[i], deadline=deadline, raw=raw)
            for i in range(visual.shape[0])
        ]
        try:
            outputs = await asyncio.gather(*futures)
        finally:
            for future in futures:
                future.cancel()  # no-op for finished ones; stops waiting for the rest
        return np.stack(outputs)

    def close(self) -> None:
        """Let the model go (it may be evicted once no one holds it). Idempotent."""
        if not self._closed:
            self._closed = True
            self._core.registry.release(self._model)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class InferenceCore:
    """Owns the devices' schedulers, the registry and the idle-eviction task.

    ``events`` (default: none) hears about batches run and models loaded, from the
    worker and load threads; see :mod:`inference_core.events`.
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
        batching = settings.batching
        self.schedulers = [
            DeviceScheduler(
                device.name,
                workers=settings.devices.workers_for(device.kind),
                queue_size=batching.queue_size,
                max_batch_size=batching.max_batch_size,
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
        return ModelHandle(self, await self.registry.acquire(model_id, device=device))

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
        await self.registry.close()
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
