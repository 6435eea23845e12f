"""Model cold start: first request to first frame for a model that is not loaded.

    .venv/bin/python -m benchmarks.run --only cold_start [--quick]

For the demo model and the benchmark UNet (each an avatar package under a temp root):
``core.open(id)`` (registry: read the package, create the onnxruntime session, warm
each batch size) then one frame through ``handle.infer``; the model is unloaded
(``registry.unload``) between tries. Median (and min/max) of a few tries, with the
split into open (load) and first inference. Not a test.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import Result, print_table
from config.settings import Settings
from inference_core.assets.benchmark_model import DEFAULT_WIDTH, build_benchmark_unet
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.locator import AvatarLocator
from inference_core.serving.core import InferenceCore


async def _measure(root: Path, tries: int) -> dict[str, Result]:
    avatars = root / "avatars"
    write_demo_avatar(avatars / "demo-model", count=2)
    write_demo_avatar(avatars / "bench-unet", count=2)
    build_benchmark_unet(avatars / "bench-unet" / "lipsync.onnx", width=DEFAULT_WIDTH)
    settings = Settings.model_validate(
        {"avatars": {"root": str(avatars), "data_dir": str(root / "data"), "demo": False}}
    )
    core = InferenceCore(settings, AvatarLocator(avatars))
    await core.start()
    visual = np.zeros((1, 6, 320, 320), dtype=np.float32)
    audio = np.zeros((1, 32, 16, 16), dtype=np.float32)
    results: dict[str, Result] = {}
    try:
        for model_id in ("demo-model", "bench-unet"):
            opens, firsts, totals = [], [], []
            for _ in range(tries):
                start = time.perf_counter()
                async with await core.open(model_id) as handle:
                    opened = time.perf_counter()
                    await handle.infer(visual, audio, timeout_s=60)
                    done = time.perf_counter()
                await core.registry.unload(model_id)
                opens.append((opened - start) * 1000)
                firsts.append((done - opened) * 1000)
                totals.append((done - start) * 1000)
            results[model_id] = {
                "tries": tries,
                "median_ms": statistics.median(totals),
                "min_ms": min(totals),
                "max_ms": max(totals),
                "open_median_ms": statistics.median(opens),
                "first_frame_median_ms": statistics.median(firsts),
                "batch_sizes_warmed": settings.batching.size_for(core.devices[0].kind),
            }
    finally:
        await core.stop()
    return results


def run(quick: bool = False, *, tries: int | None = None) -> Result:
    tries = tries or (3 if quick else 5)
    with tempfile.TemporaryDirectory() as tmp:
        results = asyncio.run(_measure(Path(tmp), tries))
    print_table(
        f"Model cold start: core.open + first frame, unloaded model (median of {tries})",
        ["model", "median ms", "min ms", "max ms", "open (load + warm) ms", "first frame ms"],
        [
            [
                k,
                r["median_ms"],
                r["min_ms"],
                r["max_ms"],
                r["open_median_ms"],
                r["first_frame_median_ms"],
            ]
            for k, r in results.items()
        ],
    )
    return {"models": results}


if __name__ == "__main__":
    run()
