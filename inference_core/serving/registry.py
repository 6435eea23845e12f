"""The model registry: every known avatar model, loaded on demand onto a device.

Hundreds to thousands of avatars are *registered* at start-up (an id and a state, no file
read), and *loaded* when a session first needs one::

    registered ──acquire/load──▶ loading ──▶ loaded ──unload/evict──▶ registered
                                    └──────▶ failed  (last_error kept; the next acquire retries)

A load runs on its device's load thread (:mod:`~inference_core.serving.model_loader`)
and is shared by every caller that asks for the model meanwhile. Placement: an explicit
device, else the model's ``preferred_device``, else the configured strategy. When a
device is full, idle models (held by nobody) are evicted by the configured policy; a
held model never is (``docs/design/serving.md`` §4).

All bookkeeping happens on the event loop; only the loads, closes and memory probes run
on the device threads. Why one module of about 500 lines: the load state machine,
placement and eviction all read and change the same entries and per-device pending
counts, with no lock because only the loop touches them; split across classes they
would have to share that state anyway. The decisions that need no state are pure
functions in :mod:`~inference_core.serving.placement`, the thread work is in
:mod:`~inference_core.serving.model_loader` and the snapshots in
:mod:`~inference_core.serving.snapshot`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from config.settings import Settings
from inference_core.avatars.exceptions import AvatarNotFoundError
from inference_core.avatars.locator import AvatarLocator
from inference_core.avatars.package import AvatarPackage, check_avatar_id
from inference_core.exceptions import (
    CapacityError,
    InferenceError,
    LoadTimeoutError,
    ModelInUseError,
    ModelLoadError,
    ModelOutOfMemoryError,
    ShuttingDownError,
)
from inference_core.serving.devices import Device, MemoryProbe
from inference_core.serving.events import CoreEvents, NoCoreEvents
from inference_core.serving.loaded_model import LoadedModel
from inference_core.serving.model_loader import ModelLoader, SessionFactory
from inference_core.serving.placement import (
    DeviceLoad,
    VictimInfo,
    choose_device,
    choose_victims,
    least_loaded_order,
)
from inference_core.serving.snapshot import (
    EvictionReason,
    ModelSnapshot,
    ModelState,
    model_snapshot,
)

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ModelEntry:
    """One registered model. Owned and updated by the registry; read it, do not change it.

    Kept small on purpose: a server registers every avatar it has (1,200+).
    """

    model_id: str
    state: ModelState = "registered"
    model: LoadedModel | None = None
    last_error: str | None = None
    load_task: asyncio.Task[LoadedModel] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class DeviceModels:
    """The models on one device: how many are loaded or loading, and their memory."""

    models_loaded: int
    models_loading: int
    memory_bytes: int


class ModelRegistry:
    """Registers avatar models, loads them onto devices on demand, evicts them when needed.

    Owns a :class:`ModelLoader` (one load thread per device) and closes it in :meth:`close`.
    ``session_factory``, ``memory_probe``, ``clock`` and ``queue_depth`` are seams for
    tests and for the scheduler (``queue_depth(device_index)`` feeds least-loaded
    placement). ``events`` hears about every load and load failure.
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
        queue_depth: Callable[[int], int] | None = None,
        on_unload: Callable[[LoadedModel], None] | None = None,
        events: CoreEvents | None = None,
    ) -> None:
        if not devices:
            raise ValueError("the registry needs at least one device")
        if [d.index for d in devices] != list(range(len(devices))):
            raise ValueError(
                f"device indexes must be 0..{len(devices) - 1} in order, got "
                f"{[d.index for d in devices]}"
            )
        self._settings = settings
        self._locator = locator
        self._devices = list(devices)
        self._loader = ModelLoader(
            settings,
            locator,
            self._devices,
            session_factory=session_factory,
            memory_probe=memory_probe,
            clock=clock,
        )
        self._clock = clock
        self._queue_depth = queue_depth or (lambda index: 0)
        # Told when a model goes away, so frames still queued for it fail cleanly.
        self._on_unload = on_unload or (lambda model: None)
        self.events: CoreEvents = events or NoCoreEvents()
        self._entries: dict[str, ModelEntry] = {}
        self._device_locks = [asyncio.Lock() for _ in self._devices]
        self._pending = [0] * len(self._devices)  # loads placed on each device, not finished
        # What each model measured at its last load (kept after eviction: its next load
        # is placed by it). An int per model that was ever loaded.
        self._measured: dict[str, int] = {}
        self._rr_counter = 0
        self._evictions: dict[EvictionReason, int] = {"capacity": 0, "idle": 0, "admin": 0}
        self._closed = False

    # -- registration ---------------------------------------------------------------

    @property
    def locator(self) -> AvatarLocator:
        """Where the registered avatars' packages are found."""
        return self._locator

    def register_all(self) -> int:
        """Register every avatar under the root (and ``demo``) and every configured id.

        Reads no manifest and loads nothing. Returns how many ids are registered.
        """
        for model_id in self._locator.list_ids():
            self.register(model_id)
        for model_id in self._settings.registry.models:
            self.register(model_id)
        logger.info("registered %d models", len(self._entries))
        return len(self._entries)

    def register(self, model_id: str) -> ModelEntry:
        """Register ``model_id`` (idempotent); raises ``InvalidAvatarIdError`` for bad ids."""
        entry = self._entries.get(model_id)
        if entry is None:
            entry = self._entries[check_avatar_id(model_id)] = ModelEntry(model_id)
        return entry

    def ids(self) -> list[str]:
        """Every registered id, sorted."""
        return sorted(self._entries)

    def entry(self, model_id: str) -> ModelEntry:
        """The entry of a registered id; raises :class:`AvatarNotFoundError` otherwise."""
        entry = self._entries.get(check_avatar_id(model_id))
        if entry is None:
            raise AvatarNotFoundError(
                f"no model {model_id!r} is registered: put its package at "
                f"{self._locator.root / model_id} and restart, or register it"
            )
        return entry

    @property
    def devices(self) -> list[Device]:
        return list(self._devices)

    @property
    def memory_probe(self) -> MemoryProbe:
        """What measures the devices' memory (used and total)."""
        return self._loader.memory_probe

    @property
    def evictions(self) -> dict[EvictionReason, int]:
        """Evictions so far by reason: capacity (room for a load), idle, admin (unload)."""
        return dict(self._evictions)

    # -- acquiring and loading --------------------------------------------------------

    async def acquire(self, model_id: str, *, device: int | None = None) -> LoadedModel:
        """Hold ``model_id``, loading it first if needed; :meth:`release` it when done.

        ``device`` picks the device for a load (a loaded model is returned where it is).
        """
        model = await self._ensure_loaded(model_id, device)
        model.mark_acquired()
        return model

    def release(self, model: LoadedModel) -> None:
        """Let go of a model from :meth:`acquire`; once nobody holds it, it may be evicted."""
        model.mark_released()

    async def load(self, model_id: str, device: int | None = None) -> LoadedModel:
        """Load ``model_id`` without holding it (admin, preload). No-op if already loaded."""
        return await self._ensure_loaded(model_id, device)

    async def unload(self, model_id: str) -> None:
        """Unload ``model_id`` now (admin). Raises :class:`ModelInUseError` if it is held."""
        entry = self.entry(model_id)
        if entry.load_task is not None:
            # Let the load finish (or fail) first: its session must not be left behind.
            with contextlib.suppress(InferenceError):
                await asyncio.shield(entry.load_task)
        model = entry.model
        if model is None:
            return
        if model.refcount > 0:
            raise ModelInUseError(
                f"model {model_id!r} on {model.device.name} is held by {model.refcount} "
                "session(s); end them before unloading it"
            )
        await self._evict([model], "admin")

    async def preload(self) -> list[str]:
        """Load every model configured with ``preload: true``; failures are logged and skipped."""
        wanted = [i for i, m in self._settings.registry.models.items() if m.preload]
        for model_id in wanted:
            self.register(model_id)
        results = await asyncio.gather(
            *(self.load(model_id) for model_id in wanted), return_exceptions=True
        )
        loaded = []
        for model_id, result in zip(wanted, results, strict=True):
            if isinstance(result, InferenceError):
                logger.error("preload of model %s failed: %s", model_id, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                loaded.append(model_id)
        return loaded

    async def _ensure_loaded(self, model_id: str, device: int | None) -> LoadedModel:
        entry = self.entry(model_id)
        if device is not None and not 0 <= device < len(self._devices):
            raise InferenceError(
                f"device {device} does not exist: devices are 0..{len(self._devices) - 1} "
                f"({', '.join(d.name for d in self._devices)})"
            )
        timeout = self._settings.registry.load_timeout_s
        # A loop, not one pass: a model could be evicted between its load finishing and
        # this caller resuming; it is then loaded again.
        while True:
            if self._closed:
                raise ShuttingDownError(f"the model registry is closed; cannot load {model_id!r}")
            if entry.model is not None:
                return entry.model
            task = entry.load_task
            if task is None:
                task = self._start_load(entry, device)
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if task.cancelled() and (current is None or not current.cancelling()):
                    # The load was cancelled by close(), not this caller.
                    raise ShuttingDownError(
                        f"the model registry closed while {model_id!r} was loading"
                    ) from None
                raise
            except TimeoutError:
                raise LoadTimeoutError(
                    f"model {model_id!r} did not load within registry.load_timeout_s="
                    f"{timeout:g} s; it keeps loading in the background, try again later"
                ) from None

    def _start_load(self, entry: ModelEntry, device: int | None) -> asyncio.Task[LoadedModel]:
        entry.state = "loading"
        task = asyncio.create_task(self._load(entry, device), name=f"load-{entry.model_id}")
        entry.load_task = task
        task.add_done_callback(_retrieve_exception)
        return task

    async def _load(self, entry: ModelEntry, requested: int | None) -> LoadedModel:
        model_id = entry.model_id
        try:
            model = await self._place_and_load(model_id, requested)
        except CapacityError as exc:
            entry.state, entry.last_error = "registered", str(exc)
            logger.warning("model %s not loaded: %s", model_id, exc)
            raise
        except asyncio.CancelledError:
            entry.state = "registered"
            raise
        except ModelLoadError as exc:
            entry.state, entry.last_error = "failed", str(exc)
            logger.error("model %s failed to load: %s", model_id, exc)
            self.events.model_load_failed()
            raise
        except Exception as exc:
            entry.state, entry.last_error = "failed", f"unexpected error: {exc!r}"
            logger.exception("model %s failed to load with an unexpected error", model_id)
            self.events.model_load_failed()
            raise ModelLoadError(f"model {model_id!r} failed to load: {exc!r}") from exc
        finally:
            entry.load_task = None
        if self._closed:  # closed while loading: nobody will release this session
            model.close()
            entry.state = "registered"
            raise ShuttingDownError(f"the model registry closed while {model_id!r} was loading")
        entry.model, entry.state, entry.last_error = model, "loaded", None
        return model

    async def _place_and_load(self, model_id: str, requested: int | None) -> LoadedModel:
        preferred = requested
        pinned = requested is not None
        if preferred is None:
            configured = self._settings.registry.models.get(model_id)
            preferred = configured.preferred_device if configured else None
            if preferred is not None and preferred >= len(self._devices):
                logger.warning(
                    "model %s: preferred_device %d does not exist (%d devices); placing it by %s",
                    model_id,
                    preferred,
                    len(self._devices),
                    self._settings.registry.assignment,
                )
                preferred = None
            pinned = preferred is not None
        first = self._choose(preferred)
        # A pinned model goes only where it was pinned; otherwise a device full of held
        # models is skipped for the next best one.
        order = [first] if pinned else [first, *self._fallbacks(first)]
        read: tuple[AvatarPackage, int] | None = None
        refusal: CapacityError | None = None
        for position, index in enumerate(order):
            device = self._devices[index]
            if position > 0:
                self._pending[index] += 1
            try:
                async with self._device_locks[index]:
                    if read is None:
                        read = await self._loader.read(device, model_id)
                    package, file_size = read
                    try:
                        victims = self._victims_for_room(device, file_size, model_id)
                    except CapacityError as exc:
                        refusal = refusal or exc
                        continue
                    await self._evict(victims, "capacity")
                    return await self._build_with_oom_retry(device, package, file_size)
            finally:
                self._pending[index] -= 1
        assert refusal is not None
        raise refusal

    def _choose(self, preferred: int | None) -> int:
        index = choose_device(
            self._settings.registry.assignment,
            self._device_loads(),
            preferred=preferred,
            rr_counter=self._rr_counter,
        )
        if preferred is None:
            self._rr_counter += 1
        self._pending[index] += 1  # counted at once, so concurrent placements spread out
        return index

    def _fallbacks(self, first: int) -> list[int]:
        return [i for i in least_loaded_order(self._device_loads()) if i != first]

    def _device_loads(self) -> list[DeviceLoad]:
        limits = self._settings.devices
        loaded = self._loaded_by_device()
        return [
            DeviceLoad(
                index=d.index,
                models=len(loaded[d.index]) + self._pending[d.index],
                used_bytes=sum(m.memory_bytes for m in loaded[d.index]),
                max_bytes=limits.max_memory_per_device,
                max_models=limits.max_models_per_device,
                queue_depth=self._queue_depth(d.index),
            )
            for d in self._devices
        ]

    def _loaded_by_device(self) -> list[list[LoadedModel]]:
        by_device: list[list[LoadedModel]] = [[] for _ in self._devices]
        for entry in self._entries.values():
            if entry.model is not None:
                by_device[entry.model.device.index].append(entry.model)
        return by_device

    def _victims_for_room(
        self, device: Device, file_size: int, model_id: str = ""
    ) -> list[LoadedModel]:
        """Models to evict from ``device`` so one more fits; CapacityError if impossible.

        Bytes are checked against ``devices.max_memory_per_device`` (the models' measured
        sizes) and, on a GPU whose memory NVML reads, against the GPU itself (what is in
        use now, other processes included): a model that cannot fit is refused here, not
        left to run the device out of memory.
        """
        limits = self._settings.devices
        loaded = self._loaded_by_device()
        here = loaded[device.index]
        need_models = len(here) + 1 - limits.max_models_per_device
        estimate = self._size_estimate(model_id, file_size, loaded)
        need_bytes = 0
        if limits.max_memory_per_device is not None:
            used = sum(m.memory_bytes for m in here)
            need_bytes = used + estimate - limits.max_memory_per_device
        if device.kind == "cuda":
            probe = self._loader.memory_probe
            total = probe.total_bytes(device)
            used_now = probe.used_bytes(device)
            if total and used_now:  # NVML answered
                need_bytes = max(need_bytes, used_now + estimate - total)
        if need_models <= 0 and need_bytes <= 0:
            return []
        return self._pick(device, here, need_models, need_bytes)

    def _size_estimate(
        self, model_id: str, file_size: int, loaded: Sequence[Sequence[LoadedModel]]
    ) -> int:
        """Bytes the model will take: as measured at its last load, else the mean measured
        size of loaded models, else about twice its file (weights + arena)."""
        known = self._measured.get(model_id)
        if known is not None:
            return known
        sizes = [m.memory_bytes for models in loaded for m in models]
        return sum(sizes) // len(sizes) if sizes else 2 * file_size

    def _pick(
        self, device: Device, models: Sequence[LoadedModel], need_models: int, need_bytes: int
    ) -> list[LoadedModel]:
        by_id = {m.model_id: m for m in models}
        candidates = [
            VictimInfo(m.model_id, s.last_used, s.usage_count, m.memory_bytes, s.refcount)
            for m in models
            for s in (m.stats(),)
        ]
        chosen = choose_victims(
            self._settings.registry.eviction_policy,
            candidates,
            need_models,
            need_bytes,
            device_name=device.name,
        )
        return [by_id[model_id] for model_id in chosen]

    async def _build_with_oom_retry(
        self, device: Device, package: AvatarPackage, file_size: int
    ) -> LoadedModel:
        try:
            model = await self._loader.build(device, package, file_size)
        except ModelOutOfMemoryError as exc:
            idle = [m for m in self._loaded_by_device()[device.index] if m.refcount == 0]
            victims = self._pick(device, idle, 1, 0) if idle else []
            logger.warning(
                "model %s ran out of memory on %s (%s); evicting %s and retrying once",
                package.avatar_id,
                device.name,
                exc,
                ",".join(v.model_id for v in victims) or "nothing (no idle model)",
            )
            await self._evict(victims, "capacity")
            model = await self._loader.build(device, package, file_size)
        self._measured[model.model_id] = model.memory_bytes
        self.events.model_loaded(device.name, model.load_seconds or 0.0)
        return model

    # -- eviction -------------------------------------------------------------------

    async def _evict(self, models: Sequence[LoadedModel], reason: EvictionReason) -> None:
        # Detach synchronously first, so no acquire can pick a model that is going away.
        for model in models:
            entry = self._entries[model.model_id]
            entry.model, entry.state = None, "registered"
            self._on_unload(model)
            self._evictions[reason] += 1
            stats = model.stats()
            logger.info(
                "evicted model %s from %s: reason=%s memory_bytes=%d usage_count=%d",
                model.model_id,
                model.device.name,
                reason,
                model.memory_bytes,
                stats.usage_count,
            )
        for model in models:
            await self._loader.close_model(model)

    async def evict_idle(self) -> list[str]:
        """Unload models nobody has held for ``registry.idle_timeout_s`` (0: never).

        Models configured with ``preload: true`` stay: the operator asked for them warm.
        """
        timeout = self._settings.registry.idle_timeout_s
        if timeout <= 0:
            return []
        now = self._clock()
        configured = self._settings.registry.models
        victims = [
            model
            for models in self._loaded_by_device()
            for model in models
            if model.refcount == 0
            and now - model.last_used > timeout
            and not (model.model_id in configured and configured[model.model_id].preload)
        ]
        await self._evict(victims, "idle")
        return [m.model_id for m in victims]

    # -- stats ----------------------------------------------------------------------

    def model_snapshots(self) -> tuple[ModelSnapshot, ...]:
        """One :class:`ModelSnapshot` per registered id, sorted by id."""
        return tuple(
            model_snapshot(e.model_id, e.state, e.model, e.last_error)
            for e in (self._entries[i] for i in sorted(self._entries))
        )

    def device_models(self) -> list[DeviceModels]:
        """Per device (by index): models loaded and loading, and their measured memory."""
        loaded = self._loaded_by_device()
        return [
            DeviceModels(
                models_loaded=len(loaded[d.index]),
                models_loading=self._pending[d.index],
                memory_bytes=sum(m.memory_bytes for m in loaded[d.index]),
            )
            for d in self._devices
        ]

    # -- shutdown -------------------------------------------------------------------

    async def close(self, timeout_s: float | None = None) -> None:
        """Unload every model (held or not: this is shutdown) and stop the load threads,
        within ``timeout_s``: what is still loading or closing then is abandoned, named
        in the log."""
        if self._closed:
            return
        self._closed = True
        tasks = [e.load_task for e in self._entries.values() if e.load_task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        models = [m for models in self._loaded_by_device() for m in models]
        for model in models:
            entry = self._entries[model.model_id]
            entry.model, entry.state = None, "registered"
        # Closing on each device's thread also waits for loads already running there
        # (a cancelled task's thread work cannot be interrupted).
        started = time.monotonic()
        closing = {asyncio.ensure_future(self._loader.close_model(m)): m for m in models}
        if closing:
            _, stuck = await asyncio.wait(closing, timeout=timeout_s)
            if stuck:
                logger.warning(
                    "models still closing %.0f s after shutdown began, abandoned: %s",
                    timeout_s,
                    sorted(closing[f].model_id for f in stuck),
                )
        left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - started))
        await self._loader.close(left)
        logger.info("model registry closed: %d models unloaded", len(models))


def _retrieve_exception(task: asyncio.Task[LoadedModel]) -> None:
    # Waiters may all have timed out or been cancelled; reading the exception here keeps
    # asyncio from logging "exception was never retrieved" for a failure already logged.
    if not task.cancelled():
        task.exception()
