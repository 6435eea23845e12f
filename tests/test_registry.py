"""The model registry on real tiny models and several CPU devices; eviction policies."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import threading
import tracemalloc
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort
import pytest

from config.settings import AvatarsSettings, Settings
from inference_core.adapter.lipsync import LipSyncAdapter
from inference_core.adapter.onnx_io import open_session
from inference_core.adapter.serving_graph import ServingGraph
from inference_core.assets.builtin import avatar_locator
from inference_core.avatars.exceptions import AvatarNotFoundError, InvalidAvatarIdError
from inference_core.avatars.locator import AvatarLocator
from inference_core.exceptions import (
    CapacityError,
    InferenceError,
    ModelInUseError,
    ModelLoadError,
    ModelOutOfMemoryError,
    ShuttingDownError,
)
from inference_core.serving.devices import Device
from inference_core.serving.frame_request import FrameRequest
from inference_core.serving.placement import VictimInfo, choose_victims
from inference_core.serving.registry import ModelRegistry
from tests.packages import make_package

MIB = 1024 * 1024
VISUAL = (6, 320, 320)
REGION = (320, 320, 3)
AUDIO = (32, 16, 16)


# -- eviction policy (pure) -----------------------------------------------------------


def _history() -> list[VictimInfo]:
    # "old" was used long ago but often; "busy" recently and often; "once" recently, once.
    return [
        VictimInfo("old", last_used=10.0, usage_count=50, memory_bytes=100),
        VictimInfo("once", last_used=90.0, usage_count=1, memory_bytes=100),
        VictimInfo("busy", last_used=95.0, usage_count=40, memory_bytes=100),
    ]


def test_lru_and_lfu_pick_different_victims_on_the_same_history() -> None:
    assert choose_victims("lru", _history(), 1, 0) == ["old"]
    assert choose_victims("lfu", _history(), 1, 0) == ["once"]
    assert choose_victims("lru", _history(), 2, 0) == ["old", "once"]
    assert choose_victims("lfu", _history(), 2, 0) == ["once", "busy"]


def test_lfu_breaks_ties_by_recency() -> None:
    tied = [VictimInfo("new", 50.0, 3, 1), VictimInfo("stale", 5.0, 3, 1)]
    assert choose_victims("lfu", tied, 1, 0) == ["stale"]


def test_victims_are_chosen_until_bytes_are_freed() -> None:
    history = [*_history(), VictimInfo("big", last_used=80.0, usage_count=2, memory_bytes=500)]
    # LRU order: old (100), big (500) → 600 >= 550
    assert choose_victims("lru", history, 0, 550) == ["old", "big"]
    assert choose_victims("lru", history, 0, 0) == []


def test_models_in_use_are_never_victims() -> None:
    history = [
        VictimInfo("held", last_used=1.0, usage_count=1, memory_bytes=100, refcount=2),
        VictimInfo("idle", last_used=50.0, usage_count=9, memory_bytes=100),
    ]
    assert choose_victims("lru", history, 1, 0) == ["idle"]
    assert choose_victims("lfu", history, 1, 0) == ["idle"]


def test_impossible_eviction_raises_capacity_error() -> None:
    held = [VictimInfo(f"m{i}", 1.0, 1, 100, refcount=1) for i in range(3)]
    with pytest.raises(CapacityError) as caught:
        choose_victims("lru", held, 1, 0, device_name="cuda:1")
    message = str(caught.value)
    assert "cuda:1" in message
    assert "3 model(s)" in message
    assert "max_models_per_device" in message
    assert "max_memory_per_device" in message
    assert "add devices" in message
    with pytest.raises(CapacityError, match="1000 bytes"):
        choose_victims("lfu", _history(), 0, 1000)


# -- fixtures ---------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float = 1.0) -> None:
        self.now += seconds


class MakeRegistry(Protocol):
    def __call__(
        self,
        ids: tuple[str, ...] = ...,
        *,
        n_devices: int = ...,
        config: dict[str, Any] | None = ...,
        **seams: Any,
    ) -> ModelRegistry: ...


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_package(tmp_path_factory.mktemp("template") / "pkg")


@pytest.fixture
def avatar_root(tmp_path: Path) -> Path:
    return tmp_path / "avatars"


@pytest.fixture
async def make_registry(
    avatar_root: Path, template: Path, tmp_path: Path
) -> AsyncIterator[MakeRegistry]:
    made: list[ModelRegistry] = []

    def make(
        ids: tuple[str, ...] = ("a", "b", "c", "d"),
        *,
        n_devices: int = 3,
        config: dict[str, Any] | None = None,
        **seams: Any,
    ) -> ModelRegistry:
        for model_id in ids:
            if not (avatar_root / model_id).exists():
                shutil.copytree(template, avatar_root / model_id)
        config = config or {}
        settings = Settings.model_validate(
            {
                "avatars": {"root": str(avatar_root), "data_dir": str(tmp_path / "data")},
                "devices": {"kind": "cpu", "cpu_threads_per_session": 1}
                | config.get("devices", {}),
                "registry": config.get("registry", {}),
                "batching": {"max_batch_size": 2},
            }
        )
        locator = AvatarLocator(avatar_root)
        kind = seams.pop("device_kind", "cpu")
        devices = [Device(i, kind, i) for i in range(n_devices)]
        registry = ModelRegistry(settings, locator, devices, **seams)
        registry.register_all()
        made.append(registry)
        return registry

    yield make
    for registry in made:
        await registry.close()


def _device_of(registry: ModelRegistry, model_id: str) -> str | None:
    model = registry.entry(model_id).model
    return None if model is None else model.device.name


def _loaded(registry: ModelRegistry) -> set[str]:
    return {s.model_id for s in registry.model_snapshots() if s.state == "loaded"}


def _requests(n: int, *, raw: bool, seed: int = 0) -> list[FrameRequest]:
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(n):
        visual: np.ndarray = (
            rng.random(VISUAL, dtype=np.float32)
            if raw
            else rng.integers(0, 256, REGION, dtype=np.uint8)
        )
        audio = rng.normal(0, 1, AUDIO).astype(np.float32)
        requests.append(FrameRequest("m", visual, audio, 0.0, loop.create_future(), loop, raw=raw))
    return requests


class CountingFactory:
    """The session-factory seam: real sessions, counted; optionally failing first."""

    def __init__(self, failures: dict[str, list[Exception]] | None = None) -> None:
        self.calls: list[str] = []
        self.failures = failures or {}
        self.lock = threading.Lock()

    def __call__(self, graph: ServingGraph, device: Device) -> ort.InferenceSession:
        assert graph.source is not None
        model_id = graph.source.parent.name
        with self.lock:
            self.calls.append(model_id)
            pending = self.failures.get(model_id)
            if pending:
                raise pending.pop(0)
        return open_session(graph.serialized())


# -- placement --------------------------------------------------------------------------


async def test_round_robin_placement_cycles_devices(make_registry: MakeRegistry) -> None:
    registry = make_registry(config={"registry": {"assignment": "round-robin"}})
    for model_id in ("a", "b", "c", "d"):
        await registry.load(model_id)
    devices = [_device_of(registry, i) for i in ("a", "b", "c", "d")]
    assert devices == ["cpu:0", "cpu:1", "cpu:2", "cpu:0"]


async def test_least_loaded_placement_uses_memory_then_queue_depth(
    make_registry: MakeRegistry,
) -> None:
    registry = make_registry(queue_depth=lambda index: 5 if index == 0 else 0)
    await registry.load("a")  # all empty: cpu:0 has the longest queue
    await registry.load("b")  # cpu:1 now holds a model: cpu:2 has the most room
    await registry.load("c")  # cpu:0 is the only device without a model
    assert [_device_of(registry, i) for i in ("a", "b", "c")] == ["cpu:1", "cpu:2", "cpu:0"]


async def test_concurrent_loads_spread_over_devices(make_registry: MakeRegistry) -> None:
    registry = make_registry()
    await asyncio.gather(*(registry.load(i) for i in ("a", "b", "c")))
    assert {_device_of(registry, i) for i in ("a", "b", "c")} == {"cpu:0", "cpu:1", "cpu:2"}


async def test_preferred_and_explicit_devices(make_registry: MakeRegistry) -> None:
    registry = make_registry(
        config={
            "registry": {"models": {"b": {"preferred_device": 2}, "c": {"preferred_device": 2}}}
        }
    )
    await registry.load("b")
    assert _device_of(registry, "b") == "cpu:2"
    await registry.load("c", device=1)  # an explicit device beats the preferred one
    assert _device_of(registry, "c") == "cpu:1"
    model = await registry.acquire("a", device=2)
    assert model.device.name == "cpu:2"
    assert (await registry.acquire("a", device=0)) is model  # loaded: stays where it is
    with pytest.raises(InferenceError, match="device 7 does not exist"):
        await registry.acquire("d", device=7)


# -- capacity and eviction ------------------------------------------------------------


async def test_capacity_by_count_evicts_the_least_recently_used_idle_model(
    make_registry: MakeRegistry,
) -> None:
    clock = FakeClock()
    registry = make_registry(
        n_devices=1, config={"devices": {"max_models_per_device": 2}}, clock=clock
    )
    a = await registry.acquire("a")
    clock.advance()
    b = await registry.acquire("b")
    clock.advance()
    registry.release(b)  # b was released first: least recently used
    clock.advance()
    registry.release(a)
    clock.advance()
    await registry.load("c")
    assert _loaded(registry) == {"a", "c"}
    assert registry.entry("b").state == "registered"
    assert b.closed
    assert registry.evictions == {"capacity": 1, "idle": 0, "admin": 0}


async def test_lfu_evicts_the_least_used_model(make_registry: MakeRegistry) -> None:
    clock = FakeClock()
    registry = make_registry(
        n_devices=1,
        config={"devices": {"max_models_per_device": 2}, "registry": {"eviction_policy": "lfu"}},
        clock=clock,
    )
    for _ in range(3):  # "a" is used most but longest ago
        registry.release(await registry.acquire("a"))
        clock.advance()
    registry.release(await registry.acquire("b"))
    clock.advance()
    await registry.load("c")
    assert _loaded(registry) == {"a", "c"}


class FixedSizeProbe:
    """The memory-probe seam: every session opened adds ``size`` bytes on its device.

    ``total`` plays NVML's total; ``base`` what other processes hold on the device.
    """

    def __init__(self, size: int, *, total: int | None = None, base: int = 0) -> None:
        self.size = size
        self.total = total
        self.used: dict[int, int] = {}
        self.base = base

    def used_bytes(self, device: Device) -> int:
        return self.base + self.used.get(device.index, 0)

    def total_bytes(self, device: Device) -> int | None:
        return self.total

    def factory(self, graph: ServingGraph, device: Device) -> ort.InferenceSession:
        self.used[device.index] = self.used.get(device.index, 0) + self.size
        return open_session(graph.serialized())


async def test_capacity_by_bytes_uses_measured_sizes(make_registry: MakeRegistry) -> None:
    probe = FixedSizeProbe(40 * MIB)
    clock = FakeClock()
    registry = make_registry(
        n_devices=1,
        config={"devices": {"max_memory_per_device": 100 * MIB}},
        memory_probe=probe,
        session_factory=probe.factory,
        clock=clock,
    )
    await registry.load("a")
    clock.advance()
    await registry.load("b")
    clock.advance()
    assert [s.memory_bytes for s in registry.model_snapshots() if s.state == "loaded"] == [
        40 * MIB,
        40 * MIB,
    ]
    assert registry.device_models()[0].memory_bytes == 80 * MIB
    await registry.load("c")  # 80 + 40 (the mean measured size) > 100 MiB: "a" goes
    assert _loaded(registry) == {"b", "c"}
    assert registry.device_models()[0].memory_bytes == 80 * MIB


async def test_a_gpu_without_room_evicts_or_refuses_before_loading(
    make_registry: MakeRegistry,
) -> None:
    """No max_memory_per_device set: the GPU's own total (NVML) bounds what loads."""
    probe = FixedSizeProbe(40 * MIB, total=120 * MIB, base=10 * MIB)  # 10 MiB not ours
    clock = FakeClock()
    registry = make_registry(
        n_devices=1,
        memory_probe=probe,
        session_factory=probe.factory,
        clock=clock,
        device_kind="cuda",
    )
    a = await registry.acquire("a")
    clock.advance()
    await registry.load("b")
    clock.advance()
    assert probe.used_bytes(registry.devices[0]) == 90 * MIB
    await registry.load("c")  # 90 + 40 measured > 120: idle "b" goes first, "a" is held
    assert _loaded(registry) == {"a", "c"}
    c = await registry.acquire("c")
    probe.base = 60 * MIB  # another process took memory meanwhile
    with pytest.raises(CapacityError, match="no room on cuda:0"):
        await registry.acquire("d")  # both held: evicting nothing makes room
    assert registry.entry("d").state != "loaded"
    assert probe.used.get(0) == 120 * MIB  # "d" never opened a session
    registry.release(a)
    registry.release(c)


async def test_models_in_use_are_never_evicted(make_registry: MakeRegistry) -> None:
    registry = make_registry(n_devices=1, config={"devices": {"max_models_per_device": 2}})
    a = await registry.acquire("a")
    await registry.acquire("b")
    with pytest.raises(CapacityError) as caught:
        await registry.acquire("c")
    assert "2 model(s)" in str(caught.value)
    assert "max_models_per_device" in str(caught.value)
    assert _loaded(registry) == {"a", "b"}
    entry = registry.entry("c")
    assert entry.state == "registered"  # not the model's fault: it may load later
    assert entry.last_error is not None
    registry.release(a)
    await registry.acquire("c")
    assert _loaded(registry) == {"b", "c"}


async def test_full_device_of_held_models_falls_back_to_another(
    make_registry: MakeRegistry,
) -> None:
    registry = make_registry(
        n_devices=2,
        config={
            "devices": {"max_models_per_device": 1},
            "registry": {"assignment": "round-robin"},
        },
    )
    await registry.acquire("a")  # cpu:0, held
    registry.release(await registry.acquire("b"))  # cpu:1, idle
    await registry.load("c")  # round-robin says cpu:0, full of held models → cpu:1
    assert _device_of(registry, "c") == "cpu:1"
    assert _loaded(registry) == {"a", "c"}


async def test_idle_timeout_evicts_only_idle_models(make_registry: MakeRegistry) -> None:
    clock = FakeClock()
    registry = make_registry(
        ids=("a", "b", "p"),
        config={"registry": {"idle_timeout_s": 60, "models": {"p": {"preload": True}}}},
        clock=clock,
    )
    assert await registry.preload() == ["p"]
    registry.release(await registry.acquire("a"))
    await registry.acquire("b")  # held
    clock.advance(30)
    assert await registry.evict_idle() == []
    clock.advance(31)
    assert await registry.evict_idle() == ["a"]
    assert _loaded(registry) == {"b", "p"}  # held, and preloaded
    assert registry.evictions["idle"] == 1


async def test_idle_timeout_zero_never_evicts(make_registry: MakeRegistry) -> None:
    clock = FakeClock()
    registry = make_registry(config={"registry": {"idle_timeout_s": 0}}, clock=clock)
    await registry.load("a")
    clock.advance(10**9)
    assert await registry.evict_idle() == []


# -- loading --------------------------------------------------------------------------


async def test_concurrent_acquires_share_one_load(make_registry: MakeRegistry) -> None:
    factory = CountingFactory()
    registry = make_registry(session_factory=factory)
    models = await asyncio.gather(*(registry.acquire("a") for _ in range(5)))
    assert factory.calls == ["a"]
    assert all(m is models[0] for m in models)
    assert models[0].refcount == 5
    for model in models:
        registry.release(model)
    stats = {s.model_id: s for s in registry.model_snapshots()}["a"]
    assert (stats.refcount, stats.usage_count) == (0, 5)
    with pytest.raises(ValueError, match="released more often"):
        registry.release(models[0])


async def test_broken_models_fail_clearly_while_others_keep_serving(
    make_registry: MakeRegistry, avatar_root: Path
) -> None:
    registry = make_registry(
        ids=("good", "corrupt", "missing"),
        config={"registry": {"models": {"ghost": {}}}},
    )
    (avatar_root / "corrupt" / "lipsync.onnx").write_bytes(b"not an onnx model")
    (avatar_root / "missing" / "lipsync.onnx").unlink()
    good = await registry.acquire("good")

    failures = await asyncio.gather(
        *(registry.acquire("corrupt") for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(f, ModelLoadError) for f in failures)
    assert all(f is failures[0] for f in failures)  # one shared load, one error
    for model_id, expected in [
        ("corrupt", "lipsync.onnx"),
        ("missing", "lipsync.onnx is missing"),
        ("ghost", "no avatar 'ghost'"),
    ]:
        if model_id != "corrupt":
            with pytest.raises(ModelLoadError, match=expected):
                await registry.acquire(model_id)
        entry = registry.entry(model_id)
        assert entry.state == "failed"
        assert entry.last_error is not None
        assert expected in entry.last_error
        assert model_id in entry.last_error

    outputs = good.run_batch(_requests(2, raw=False))
    assert [o.shape for o in outputs] == [(320, 320, 3)] * 2

    # the next acquire retries: a repaired model loads
    shutil.copy(avatar_root / "good" / "lipsync.onnx", avatar_root / "corrupt" / "lipsync.onnx")
    repaired = await registry.acquire("corrupt")
    assert registry.entry("corrupt").state == "loaded"
    assert registry.entry("corrupt").last_error is None
    assert repaired.run_batch(_requests(1, raw=True))[0].shape == (3, 320, 320)


async def test_unknown_and_invalid_ids(make_registry: MakeRegistry) -> None:
    registry = make_registry()
    with pytest.raises(AvatarNotFoundError, match="nobody"):
        await registry.acquire("nobody")
    with pytest.raises(InvalidAvatarIdError):
        await registry.acquire("../a")
    assert "nobody" not in registry.ids()


async def test_out_of_memory_evicts_an_idle_model_and_retries(
    make_registry: MakeRegistry,
) -> None:
    clock = FakeClock()
    factory = CountingFactory({"c": [ModelOutOfMemoryError("simulated: out of memory")]})
    registry = make_registry(n_devices=1, session_factory=factory, clock=clock)
    await registry.load("a")
    clock.advance()
    await registry.load("b")
    clock.advance()
    model = await registry.acquire("c")
    assert factory.calls == ["a", "b", "c", "c"]
    assert _loaded(registry) == {"b", "c"}  # "a" (least recently used) made room
    assert registry.evictions["capacity"] == 1
    assert model.run_batch(_requests(1, raw=False))[0].dtype == np.uint8


async def test_a_second_out_of_memory_surfaces(make_registry: MakeRegistry) -> None:
    # onnxruntime's own wording is recognised as out-of-memory too
    oom = "Failed to allocate memory for requested buffer of size 1234567"
    factory = CountingFactory({"c": [RuntimeError(oom), RuntimeError(oom)]})
    registry = make_registry(n_devices=1, session_factory=factory)
    await registry.load("a")
    await registry.load("b")
    with pytest.raises(ModelOutOfMemoryError, match="ran out of device memory"):
        await registry.acquire("c")
    assert factory.calls.count("c") == 2
    assert registry.entry("c").state == "failed"
    assert _loaded(registry) == {"b"}  # one idle model was evicted for the retry


# -- scale, stats, lifetime -------------------------------------------------------------


async def test_twelve_hundred_avatars_register_cheaply(tmp_path: Path) -> None:
    root = tmp_path / "avatars"
    for i in range(1200):
        (root / f"avatar-{i:04d}").mkdir(parents=True)
        (root / f"avatar-{i:04d}" / "avatar.json").write_text("{}")
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(tmp_path / "data")},
            "registry": {"models": {"configured-only": {}}},
        }
    )
    registry = ModelRegistry(
        settings,
        avatar_locator(AvatarsSettings(root=root, data_dir=tmp_path / "data")),
        [Device(0)],
    )
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        count = registry.register_all()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert count == 1202  # 1,200 packages + demo + one id named only in the settings
    assert {"demo", "configured-only", "avatar-0000", "avatar-1199"} <= set(registry.ids())
    assert grown / count < 2048, f"{grown / count:.0f} bytes per registered avatar"
    assert {s.state for s in registry.model_snapshots()} == {"registered"}
    assert registry.device_models()[0].models_loaded == 0
    await registry.close()


async def test_stats_reflect_loads_usage_and_frames(make_registry: MakeRegistry) -> None:
    registry = make_registry()
    model = await registry.acquire("a")
    await registry.acquire("a")
    model.run_batch(_requests(2, raw=False) + _requests(1, raw=True))
    model.run_batch(_requests(1, raw=False))
    # Handles check frames when they are submitted; a runner given a malformed one anyway
    # fails its batch, and the failure is counted.
    with pytest.raises(ValueError, match="broadcast"):
        model.run_batch(
            [dataclasses.replace(_requests(1, raw=False)[0], audio=np.zeros(3, np.float32))]
        )
    stats = {s.model_id: s for s in registry.model_snapshots()}
    a = stats["a"]
    assert a.state == "loaded"
    assert a.device == model.device.name
    assert a.memory_bytes > 0
    assert (a.refcount, a.usage_count, a.frames, a.batches, a.failures) == (2, 2, 4, 2, 1)
    assert a.inference_ms_total > 0
    assert a.mean_ms_per_frame == pytest.approx(a.inference_ms_total / 4)
    assert a.loaded_at is not None
    assert a.last_used is not None
    assert a.last_used >= a.loaded_at
    assert a.load_seconds is not None
    assert a.load_seconds > 0
    assert stats["b"].state == "registered"
    assert stats["b"].device is None
    on_device = registry.device_models()[model.device.index]
    assert (on_device.models_loaded, on_device.memory_bytes) == (1, a.memory_bytes)


async def test_run_batch_matches_the_adapter(make_registry: MakeRegistry) -> None:
    registry = make_registry()
    model = await registry.acquire("a")
    reference = LipSyncAdapter.from_path(model.package.lipsync_path, model.package.manifest.adapter)
    faces = _requests(3, raw=False, seed=1)
    raws = _requests(2, raw=True, seed=2)
    mixed = model.run_batch([faces[0], raws[0], faces[1], raws[1], faces[2]])
    expected_faces = reference.run(
        np.stack([r.visual for r in faces]), np.stack([r.audio for r in faces])
    )
    expected_raw = reference.run_raw(
        np.stack([r.visual for r in raws]), np.stack([r.audio for r in raws])
    )
    for got, want in zip([mixed[0], mixed[2], mixed[4]], expected_faces, strict=True):
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, want)
    for got, want in zip([mixed[1], mixed[3]], expected_raw, strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-6)


async def test_unload(make_registry: MakeRegistry) -> None:
    registry = make_registry()
    held = await registry.acquire("a")
    with pytest.raises(ModelInUseError, match="held by 1 session"):
        await registry.unload("a")
    registry.release(held)
    assert held.adapter is not None
    session = weakref.ref(held.adapter.session)
    await registry.unload("a")
    assert registry.entry("a").state == "registered"
    assert held.closed
    assert session() is None  # destroyed at once: its memory is returned now, not at a GC
    await registry.unload("a")  # not loaded: nothing to do
    with pytest.raises(AvatarNotFoundError):
        await registry.unload("nobody")
    assert registry.evictions["admin"] == 1
    # unloaded models load again on demand
    assert not (await registry.acquire("a")).closed


async def test_close_unloads_everything_and_stops_load_threads(
    make_registry: MakeRegistry,
) -> None:
    registry = make_registry()
    held = await registry.acquire("a")
    await registry.load("b")
    assert any(t.name.startswith("lipstream-load") for t in threading.enumerate())
    await registry.close()
    assert not any(t.name.startswith("lipstream-load") for t in threading.enumerate())
    assert held.closed
    assert _loaded(registry) == set()
    with pytest.raises(ShuttingDownError):
        await registry.acquire("a")
    with pytest.raises(ModelLoadError, match="unloaded"):
        held.run_batch(_requests(1, raw=False))
    registry.release(held)  # a late release after shutdown is harmless
    await registry.close()  # idempotent


async def test_close_during_a_load_leaves_no_thread(make_registry: MakeRegistry) -> None:
    opening, release = threading.Event(), threading.Event()

    def held_open(graph: ServingGraph, device: Device) -> ort.InferenceSession:
        opening.set()
        release.wait(10)
        return open_session(graph.serialized())

    registry = make_registry(session_factory=held_open)
    loading = asyncio.ensure_future(registry.acquire("a"))
    # The load is on its device thread (not merely queued) when close() comes.
    assert await asyncio.to_thread(opening.wait, 10), "the load never reached its thread"
    assert registry.entry("a").state == "loading"
    closing = asyncio.ensure_future(registry.close())
    with pytest.raises(ShuttingDownError, match="closed while 'a' was loading"):
        await asyncio.wait_for(loading, 10)  # fails as soon as close() cancels the load
    assert not closing.done()  # close() waits for the thread's work
    release.set()
    await asyncio.wait_for(closing, 10)
    assert registry.entry("a").model is None
    assert registry.entry("a").state == "registered"
    assert not any(t.name.startswith("lipstream-load") for t in threading.enumerate())


async def test_close_abandons_a_load_past_its_bound_and_names_it(
    make_registry: MakeRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    opening, release = threading.Event(), threading.Event()

    def stuck_open(graph: ServingGraph, device: Device) -> ort.InferenceSession:
        opening.set()
        release.wait(30)  # a load that takes longer than shutdown may (a TensorRT build)
        return open_session(graph.serialized())

    registry = make_registry(session_factory=stuck_open)
    loading = asyncio.ensure_future(registry.acquire("a"))
    assert await asyncio.to_thread(opening.wait, 10), "the load never reached its thread"
    try:
        with caplog.at_level(logging.WARNING, logger="inference_core.serving"):
            # Returns within its bound although the load's thread is still busy.
            await asyncio.wait_for(registry.close(timeout_s=0.2), 10)
        with pytest.raises(ShuttingDownError):
            await asyncio.wait_for(loading, 10)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("abandoned" in w and "model loads" in w for w in warnings), warnings
        assert registry.entry("a").state == "registered"
    finally:
        release.set()
