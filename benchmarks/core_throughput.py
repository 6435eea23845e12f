"""Inference-core efficiency: raw ``session.run`` vs frames served through the whole core.

    .venv/bin/python benchmarks/core_throughput.py [--width 14] [--seconds 20] [--sessions 8]

1. Raw: one onnxruntime session of the benchmark UNet (unet_328 I/O, ≈4.9 GMAC/frame at
   the default width), ``session.run`` back to back at batch 1, 2, 4, 8; the best
   frames/s is the ceiling.
2. Served: the same model as an avatar package, served by ``InferenceCore`` (registry →
   device scheduler → worker pool) to N concurrent synthetic sessions, each keeping
   frames in flight as a live session does; frames/s completed.

Prints both and their ratio (target >= 0.95), measured in one run. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from config.settings import Settings
from inference_core.avatar import AvatarLocator
from inference_core.benchmark_model import DEFAULT_WIDTH, build_benchmark_unet, estimate_macs
from inference_core.core import InferenceCore
from inference_core.demo_avatar import write_demo_avatar
from inference_core.devices import detect_devices, session_config


def raw_fps(model: Path, settings: Settings, batch: int, seconds: float) -> float:
    """Frames/s of back-to-back ``session.run`` at ``batch``, same session config as served."""
    device = detect_devices(settings.devices)[0]
    providers, options = session_config(device, settings.devices)
    session = ort.InferenceSession(str(model), sess_options=options, providers=providers)
    names = [i.name for i in session.get_inputs()]
    rng = np.random.default_rng(0)
    feeds = {
        names[0]: rng.random((batch, 6, 320, 320), dtype=np.float32),
        names[1]: rng.normal(0, 1, (batch, 32, 16, 16)).astype(np.float32),
    }
    session.run(None, feeds)  # warm-up
    frames, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        session.run(None, feeds)
        frames += batch
    return frames / (time.perf_counter() - start)


async def served_fps(
    settings: Settings, root: Path, sessions: int, seconds: float
) -> dict[str, float]:
    """Frames/s served to ``sessions`` concurrent synthetic sessions through the core."""
    a = settings.avatars
    core = InferenceCore(settings, AvatarLocator(a.root, a.data_dir, demo=False))
    await core.start()
    rng = np.random.default_rng(1)
    visual = rng.integers(0, 256, (6, 320, 320), dtype=np.uint8)
    audio = rng.normal(0, 1, (32, 16, 16)).astype(np.float32)
    handles = [await core.open("bench") for _ in range(sessions)]
    await handles[0].submit(visual, audio, deadline=time.monotonic() + 60)  # warm path
    in_flight = max(1, settings.batching.max_batch_size // sessions + 1)
    done = 0
    stop_at = time.monotonic() + seconds

    async def session(index: int) -> None:
        nonlocal done
        handle = handles[index]
        pending: set[asyncio.Future[np.ndarray]] = set()
        while time.monotonic() < stop_at:
            while len(pending) < in_flight:
                pending.add(
                    handle.submit(
                        visual, audio, deadline=time.monotonic() + 30, session_id=f"s{index}"
                    )
                )
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done += sum(1 for f in finished if f.exception() is None)
        for future in pending:
            future.cancel()

    start = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    elapsed = time.perf_counter() - start
    stats = core.schedulers[0].stats()
    for handle in handles:
        handle.close()
    await core.stop()
    return {"fps": done / elapsed, "mean_batch": stats.mean_batch_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=DEFAULT_WIDTH)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "avatars"
        package = write_demo_avatar(root / "bench", count=2)
        model = package / "lipsync.onnx"
        build_benchmark_unet(model, width=args.width)
        base = {
            "avatars": {"root": str(root), "data_dir": str(Path(tmp) / "data"), "demo": False},
            "devices": {"count": 1, "workers_per_device": args.workers},
        }
        raw_settings = Settings.model_validate(base)
        raw = {b: raw_fps(model, raw_settings, b, args.seconds / 4) for b in (1, 2, 4, 8)}
        best = max(raw, key=lambda b: raw[b])
        served_settings = Settings.model_validate(
            {**base, "batching": {"max_batch_size": best, "max_wait_ms": 5, "queue_size": 256}}
        )
        served = asyncio.run(served_fps(served_settings, root, args.sessions, args.seconds))
        shutil.rmtree(root, ignore_errors=True)

    ratio = served["fps"] / raw[best]
    device = detect_devices(Settings().devices)[0].name
    print(
        f"benchmark UNet width {args.width} ({estimate_macs(args.width) / 1e9:.2f} GMAC/frame) "
        f"on {device}, {os.cpu_count()} CPUs"
    )
    for b, fps in raw.items():
        print(f"  raw session.run  batch {b}: {fps:7.1f} frames/s")
    print(
        f"  served ({args.sessions} sessions, {args.workers} worker(s), max batch {best}): "
        f"{served['fps']:7.1f} frames/s, mean batch {served['mean_batch']:.2f}"
    )
    print(f"  served / raw(best) = {ratio:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"raw": raw, "served": served, "ratio": ratio}))


if __name__ == "__main__":
    main()
