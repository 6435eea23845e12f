"""The stats snapshots: what they hold, that they survive JSON, and that web reads only them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

from compositor.background_cache import CacheStats
from config.settings import Settings
from inference_core.avatars.locator import AvatarLocator
from inference_core.serving.core import InferenceCore
from inference_core.serving.snapshot import CoreSnapshot
from streaming.live.manager import SessionManager
from streaming.live.snapshot import (
    SessionsSnapshot,
    SessionTotals,
)
from tests.packages import make_package
from tests.snapshots import session_snapshot

REPO = Path(__file__).resolve().parent.parent


def _settings(root: Path) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
            "devices": {"kind": "cpu", "count": 2, "workers_per_device": 2},
            "batching": {"max_batch_size": 4, "max_wait_ms": 2},
        }
    )


async def test_the_core_snapshot_holds_devices_models_and_survives_json(tmp_path: Path) -> None:
    make_package(tmp_path / "alice")
    make_package(tmp_path / "bob")
    core = InferenceCore(_settings(tmp_path), AvatarLocator(tmp_path))
    before = await core.snapshot()
    assert not before.running
    assert [d.workers_alive for d in before.devices] == [0, 0]  # not started: no threads
    await core.start()
    try:
        handle = await core.open("alice")
        rng = np.random.default_rng(0)
        visual = rng.integers(0, 256, (3, 320, 320, 3), dtype=np.uint8)
        audio = rng.normal(0, 1, (3, 32, 16, 16)).astype(np.float32)
        await handle.infer(visual, audio, timeout_s=30, raw=False)
        snapshot = await core.snapshot()
        handle.close()
    finally:
        await core.stop()
    assert snapshot.running
    assert [d.name for d in snapshot.devices] == ["cpu:0", "cpu:1"]
    assert [d.workers_alive for d in snapshot.devices] == [2, 2]
    alice = snapshot.model("alice")
    assert alice is not None
    assert snapshot.model("bob") is not None
    assert (alice.state, alice.refcount, alice.frames) == ("loaded", 1, 3)
    assert snapshot.model("nobody") is None
    device = next(d for d in snapshot.devices if d.name == alice.device)
    assert (device.models_loaded, device.model_memory_bytes) == (1, alice.memory_bytes)
    assert device.scheduler.completed == 3
    assert sum(device.scheduler.batch_sizes.values()) == device.scheduler.batches >= 1
    assert device.memory_used_bytes > 0

    copy = CoreSnapshot.from_json(snapshot.to_json())
    assert copy == snapshot
    assert isinstance(copy.devices[0].scheduler.batch_sizes, dict)
    assert all(isinstance(size, int) for d in copy.devices for size in d.scheduler.batch_sizes)

    stopped = await core.snapshot()
    assert not stopped.running
    assert [d.workers_alive for d in stopped.devices] == [0, 0]


async def test_the_sessions_snapshot_survives_json(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    manager = SessionManager(settings, InferenceCore(settings, AvatarLocator(tmp_path)))
    try:
        empty = manager.snapshot()
    finally:
        await manager.close_all()
    assert empty.sessions == ()
    assert empty.totals.live == 0
    assert empty.cache.max_bytes == settings.cache.background_cache_bytes
    snapshot = dataclasses.replace(
        empty,
        sessions=(session_snapshot(session_id="one"), session_snapshot(session_id="two")),
        totals=SessionTotals(
            live=2,
            started=5,
            ended=3,
            rejected=1,
            failed=0,
            frames_sent=900,
            frames_inferred=500,
            frames_dropped={"late": 2},
            ended_by_reason={"hung up by API": 3},
        ),
        cache=CacheStats(hits=10, misses=2, evictions=0, bytes=4096, entries=2, max_bytes=8192),
    )
    copy = SessionsSnapshot.from_json(snapshot.to_json())
    assert copy == snapshot
    assert copy.cache.hit_rate == snapshot.cache.hit_rate


def test_web_reads_only_snapshots() -> None:
    """No handler walks the registry, the schedulers, sessions or threads itself."""
    walks = re.compile(
        # settings.registry is the registry's settings section, not the registry
        r"(?<!client)(?<!settings)\.registry\b|\.schedulers\b|scheduler_for|threading\.enumerate"
        r"|\.stats\(\)|\.sessions\b|\.counters\b"
    )
    offenders = []
    for path in sorted((REPO / "web").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if walks.search(line) and "snapshot()" not in line:
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "read core.snapshot() / sessions.snapshot() instead:\n" + "\n".join(
        offenders
    )
