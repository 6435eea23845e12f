"""The inference core: sessions share batches, failures stay contained, stop is clean."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from config.settings import Settings
from inference_core.avatars.locator import AvatarLocator
from inference_core.exceptions import (
    DeadlineExceededError,
    ModelInputError,
    ModelLoadError,
    ShuttingDownError,
)
from inference_core.serving.core import InferenceCore
from tests.packages import make_package


def _core(root: Path, **batching: float) -> InferenceCore:
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
            "devices": {"kind": "cpu", "count": 2, "workers_per_device": 2},
            "batching": {"max_batch_size": 4, "max_wait_ms": 20, **batching},
        }
    )
    return InferenceCore(settings, AvatarLocator(root))


def _frame(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 256, (320, 320, 3), dtype=np.uint8),
        rng.normal(0, 1, (32, 16, 16)).astype(np.float32),
    )


def _lipstream_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("lipstream-")]


async def test_sessions_share_batches_and_get_their_own_results(tmp_path: Path) -> None:
    make_package(tmp_path / "alice")
    core = _core(tmp_path)
    await core.start()
    try:
        handles = [await core.open("alice") for _ in range(4)]
        assert len({h.device.name for h in handles}) == 1  # one model, one device
        frames = [_frame(i) for i in range(4)]
        # Submit every session's frame in the same loop iteration: one batch can take all.
        futures = [
            h.submit(v, a, deadline=time.monotonic() + 10, session_id=f"s{i}")
            for i, (h, (v, a)) in enumerate(zip(handles, frames, strict=True))
        ]
        faces = await asyncio.gather(*futures)
        expected = handles[0].infer  # reference: each frame alone through the same model
        for (v, a), face in zip(frames, faces, strict=True):
            alone = await expected(v[None], a[None], timeout_s=10, raw=False)
            np.testing.assert_array_equal(face, alone[0])
        stats = core.scheduler_for(handles[0].device).stats()
        assert stats.batch_sizes.get(4, 0) >= 1  # the four sessions went through together
        for handle in handles:
            handle.close()
    finally:
        await core.stop()


async def test_late_frames_are_dropped_not_run(tmp_path: Path) -> None:
    make_package(tmp_path / "alice")
    core = _core(tmp_path)
    await core.start()
    try:
        async with await core.open("alice") as model:
            v, a = _frame(0)
            with pytest.raises(DeadlineExceededError, match="deadline"):
                await model.submit(v, a, deadline=time.monotonic() - 0.01)
            stats = core.scheduler_for(model.device).stats()
            assert stats.expired == 1
            assert stats.completed == 0
    finally:
        await core.stop()


async def test_a_broken_model_fails_alone(tmp_path: Path) -> None:
    make_package(tmp_path / "alice")
    broken = make_package(tmp_path / "broken")
    (broken / "lipsync.onnx").write_bytes(b"corrupt")
    core = _core(tmp_path)
    await core.start()
    try:
        async with await core.open("alice") as alice:
            with pytest.raises(ModelLoadError, match="broken"):
                await core.open("broken")
            v, a = _frame(1)
            face = await alice.submit(v, a, deadline=time.monotonic() + 10)
            assert face.shape == (320, 320, 3)
    finally:
        await core.stop()


async def test_stop_fails_queued_work_and_leaves_nothing_running(tmp_path: Path) -> None:
    make_package(tmp_path / "alice")
    before_tasks = asyncio.all_tasks()
    core = _core(tmp_path, max_wait_ms=100)
    await core.start()
    handle = await core.open("alice")
    v, a = _frame(2)
    pending = [handle.submit(v, a, deadline=time.monotonic() + 30) for _ in range(12)]
    await core.stop()
    results = await asyncio.gather(*pending, return_exceptions=True)
    # Each frame either ran before the stop or was failed with a clear shutdown error.
    for result in results:
        assert isinstance(result, np.ndarray | ShuttingDownError), result
    with pytest.raises(ShuttingDownError):
        handle.submit(v, a, deadline=time.monotonic() + 1)
    with pytest.raises(ShuttingDownError):
        await core.open("alice")
    assert _lipstream_threads() == []
    assert asyncio.all_tasks() == before_tasks
    await core.stop()  # idempotent


async def test_a_malformed_frame_is_refused_to_its_sender_alone(tmp_path: Path) -> None:
    make_package(tmp_path / "alice")
    core = _core(tmp_path)
    await core.start()
    try:
        handles = [await core.open("alice") for _ in range(3)]
        frames = [_frame(i) for i in range(2)]
        good = [
            h.submit(v, a, deadline=time.monotonic() + 10, session_id=f"s{i}")
            for i, (h, (v, a)) in enumerate(zip(handles, frames, strict=False))
        ]
        v, a = _frame(9)
        with pytest.raises(ModelInputError, match=r"uint8 \[320, 320, 3\], got float32"):
            handles[2].submit(v.astype(np.float32), a, deadline=time.monotonic() + 10)
        with pytest.raises(ModelInputError, match=r"audio input must be \[32, 16, 16\]"):
            handles[2].submit(v, a[:8], deadline=time.monotonic() + 10)
        # The frames beside it in the same loop iteration ran, and nothing failed.
        faces = await asyncio.gather(*good)
        for (v, a), face in zip(frames, faces, strict=True):
            alone = await handles[0].infer(v[None], a[None], timeout_s=10, raw=False)
            np.testing.assert_array_equal(face, alone[0])
        stats = core.scheduler_for(handles[0].device).stats()
        assert (stats.failed, stats.submitted) == (0, 4)
        for handle in handles:
            handle.close()
    finally:
        await core.stop()


SESSIONS = 32
FRAMES = 50
POOL = 64  # distinct visuals and audio windows, combined differently for every frame


async def test_thirty_two_sessions_get_the_models_outputs_in_order(tmp_path: Path) -> None:
    """32 sessions x 50 frames through the core: every frame's output is the model's own
    output for that frame (in each session's order); frames a session cancels while their
    batch may be running are never delivered, and the others are not disturbed."""
    make_package(tmp_path / "alice")
    core = _core(tmp_path, max_batch_size=8, max_wait_ms=2, queue_size=512)
    await core.start()
    rng = np.random.default_rng(0)
    visuals = rng.integers(0, 256, (POOL, 320, 320, 3), dtype=np.uint8)
    audios = rng.normal(0, 1, (POOL, 32, 16, 16)).astype(np.float32)

    def pair(session: int, frame: int) -> tuple[int, int]:
        return (session * 7 + frame) % POOL, (session * 3 + 2 * frame) % POOL

    try:
        handles = [await core.open("alice") for _ in range(SESSIONS)]
        cancelled: list[asyncio.Future[np.ndarray]] = []

        async def session(index: int) -> list[np.ndarray]:
            handle, outputs = handles[index], []
            pending: list[asyncio.Future[np.ndarray]] = []
            for frame in range(FRAMES):
                v, a = pair(index, frame)
                deadline = time.monotonic() + 30
                pending.append(
                    handle.submit(visuals[v], audios[a], deadline=deadline, session_id=f"s{index}")
                )
                if index % 8 == 7 and frame % 10 == 9:  # this session drops a frame in flight
                    dropped = handle.submit(
                        visuals[v], audios[a], deadline=deadline, session_id=f"s{index}"
                    )
                    dropped.cancel()
                    cancelled.append(dropped)
                if len(pending) == 3:  # three in flight, awaited oldest first
                    outputs.append(await pending.pop(0))
            outputs += await asyncio.gather(*pending)
            return outputs

        results = await asyncio.gather(*(session(i) for i in range(SESSIONS)))
        model = core.registry.entry("alice").model
        assert model is not None
        assert model.adapter is not None
        for index, outputs in enumerate(results):
            assert len(outputs) == FRAMES
            chosen = [pair(index, frame) for frame in range(FRAMES)]
            want = model.adapter.run(
                visuals[[v for v, _ in chosen]], audios[[a for _, a in chosen]]
            )
            for frame, (got, expected) in enumerate(zip(outputs, want, strict=True)):
                np.testing.assert_array_equal(got, expected, err_msg=f"session {index} {frame}")
        assert len(cancelled) == 4 * FRAMES // 10
        assert all(f.cancelled() for f in cancelled)  # never given a result
        stats = core.scheduler_for(handles[0].device).stats()
        assert stats.failed == 0
        assert stats.mean_batch_size > 1  # sessions shared batches
        for handle in handles:
            handle.close()
    finally:
        await core.stop()
