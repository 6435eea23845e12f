"""The instrument of ``benchmarks/core_overhead.py``: its identity model is one (served
through the whole core, a face comes back as the region that went in), and its model
clock sees the model's own runs, so the core's cost it reports is what lies outside them.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.core_overhead import ModelClock, build_identity_model
from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.locator import AvatarLocator
from inference_core.serving.core import InferenceCore


async def test_the_identity_model_gives_back_each_region_and_its_runs_are_timed(
    tmp_path: Path,
) -> None:
    build_identity_model(write_demo_avatar(tmp_path / "bench", count=2) / "lipsync.onnx")
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "data"), "demo": False},
            "devices": {"kind": "cpu", "count": 1, "workers_per_device": 1},
            "batching": {"max_batch_size": 4, "max_wait_ms": 5},
        }
    )
    core = InferenceCore(settings, AvatarLocator(tmp_path))
    await core.start()
    rng = np.random.default_rng(3)
    regions = rng.integers(0, 256, (6, 320, 320, 3), dtype=np.uint8)
    audio = rng.normal(0, 1, (32, 16, 16)).astype(np.float32)
    try:
        with ModelClock().installed() as clock:
            async with await core.open("bench") as model:
                deadline = time.monotonic() + 30
                futures = [model.submit(r, audio, deadline=deadline) for r in regions]
                for region, future in zip(regions, futures, strict=True):
                    np.testing.assert_array_equal(await future, region)
        assert clock.us > 0  # the runs were seen (and only while installed)
        runs = core.schedulers[0].stats().batches
        assert runs >= 2  # six frames, batches of at most four
    finally:
        await core.stop()
