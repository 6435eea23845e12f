"""Inference-core efficiency: raw ``session.run`` vs frames served through the whole core.

    .venv/bin/python benchmarks/core_throughput.py [--width 14] [--rounds 4] [--seconds 5]

1. Raw: a plain onnxruntime session (default options: all cores) of the benchmark UNet
   (unet_328 I/O, ≈4.9 GMAC/frame at the default width), ``session.run`` back to back;
   a short sweep over batch 1, 2, 4, 8 picks the best batch size.
2. Served: the same model as an avatar package, served by ``InferenceCore`` (registry →
   device scheduler → worker pool) to N concurrent synthetic sessions, each keeping
   frames in flight as a live session does (uint8 frames in, uint8 faces out).

Raw and served segments alternate for ``--rounds`` rounds so both see the same machine
conditions; the ratio of their totals is printed (target >= 0.95). Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from config.settings import Settings
from inference_core.avatar import AvatarLocator
from inference_core.benchmark_model import DEFAULT_WIDTH, build_benchmark_unet, estimate_macs
from inference_core.core import InferenceCore, ModelHandle
from inference_core.demo_avatar import write_demo_avatar
from inference_core.devices import detect_devices, session_config


class RawRunner:
    """Back-to-back ``session.run`` on a plain session: onnxruntime's own best on device 0."""

    def __init__(self, model: Path, settings: Settings) -> None:
        device = detect_devices(settings.devices)[0]
        providers, _ = session_config(device, settings.devices)  # CUDA options on a GPU
        self.session = ort.InferenceSession(str(model), providers=providers)
        self.names = [i.name for i in self.session.get_inputs()]
        self.rng = np.random.default_rng(0)

    def frames_in(self, batch: int, seconds: float) -> tuple[int, float]:
        feeds = {
            self.names[0]: self.rng.random((batch, 6, 320, 320), dtype=np.float32),
            self.names[1]: self.rng.normal(0, 1, (batch, 32, 16, 16)).astype(np.float32),
        }
        self.session.run(None, feeds)  # warm this batch size
        frames, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            self.session.run(None, feeds)
            frames += batch
        return frames, time.perf_counter() - start


async def serve_for(
    handles: list[ModelHandle], seconds: float, in_flight: int
) -> tuple[int, float]:
    """Drive every handle as a session for ``seconds``; frames completed and elapsed time."""
    rng = np.random.default_rng(1)
    visual = rng.integers(0, 256, (6, 320, 320), dtype=np.uint8)
    audio = rng.normal(0, 1, (32, 16, 16)).astype(np.float32)
    done = 0
    start = time.perf_counter()
    stop_at = time.monotonic() + seconds

    async def session(index: int) -> None:
        nonlocal done
        pending: set[asyncio.Future[np.ndarray]] = set()
        while time.monotonic() < stop_at:
            while len(pending) < in_flight:
                deadline = time.monotonic() + 60
                pending.add(handles[index].submit(visual, audio, deadline=deadline))
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done += sum(1 for f in finished if f.exception() is None)
        elapsed = time.perf_counter() - start
        await asyncio.gather(*pending, return_exceptions=True)  # drain before the next segment
        timings.append(elapsed)

    timings: list[float] = []
    await asyncio.gather(*(session(i) for i in range(len(handles))))
    return done, max(timings)


async def run(args: argparse.Namespace, root: Path, model: Path) -> dict[str, object]:
    base = {
        "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
        "devices": {"count": 1, "workers_per_device": args.workers},
    }
    raw = RawRunner(model, Settings.model_validate(base))
    sweep = {b: raw.frames_in(b, 2.0) for b in (1, 2, 4, 8)}
    sweep_fps = {b: f / s for b, (f, s) in sweep.items()}
    best = max(sweep_fps, key=lambda b: sweep_fps[b])
    settings = Settings.model_validate(
        {**base, "batching": {"max_batch_size": best, "max_wait_ms": 5, "queue_size": 256}}
    )
    core = InferenceCore(settings, AvatarLocator(root, root / "data", demo=False))
    await core.start()
    handles = [await core.open("bench") for _ in range(args.sessions)]
    in_flight = max(1, -(-2 * best // args.sessions))  # keep ~2 batches queued in total
    await serve_for(handles, 1.0, in_flight)  # warm the served path
    loop = asyncio.get_running_loop()
    raw_frames = raw_seconds = served_frames = served_seconds = 0.0
    for _ in range(args.rounds):
        frames, seconds = await loop.run_in_executor(None, raw.frames_in, best, args.seconds)
        raw_frames, raw_seconds = raw_frames + frames, raw_seconds + seconds
        frames, seconds = await serve_for(handles, args.seconds, in_flight)
        served_frames, served_seconds = served_frames + frames, served_seconds + seconds
    stats = core.schedulers[0].stats()
    for handle in handles:
        handle.close()
    await core.stop()
    raw_fps, served_fps = raw_frames / raw_seconds, served_frames / served_seconds
    return {
        "sweep_fps": sweep_fps,
        "best_batch": best,
        "raw_fps": raw_fps,
        "served_fps": served_fps,
        "ratio": served_fps / raw_fps,
        "mean_batch": stats.mean_batch_size,
        "expired": stats.expired,
        "rejected": stats.rejected,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=DEFAULT_WIDTH)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="per segment")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1, help="workers per device")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "avatars"
        model = write_demo_avatar(root / "bench", count=2) / "lipsync.onnx"
        build_benchmark_unet(model, width=args.width)
        result = asyncio.run(run(args, root, model))

    device = detect_devices(Settings().devices)[0].name
    print(
        f"benchmark UNet width {args.width} ({estimate_macs(args.width) / 1e9:.2f} GMAC/frame) "
        f"on {device}, {os.cpu_count()} CPUs; {args.rounds} rounds x {args.seconds:.0f} s each"
    )
    sweep = result["sweep_fps"]
    assert isinstance(sweep, dict)
    print("  raw sweep: " + ", ".join(f"batch {b}: {f:.1f}" for b, f in sweep.items()))
    print(f"  raw session.run, batch {result['best_batch']}: {result['raw_fps']:.2f} frames/s")
    print(
        f"  served, {args.sessions} sessions, {args.workers} worker(s): "
        f"{result['served_fps']:.2f} frames/s (mean batch {result['mean_batch']:.2f}, "
        f"expired {result['expired']}, rejected {result['rejected']})"
    )
    print(f"  served / raw = {result['ratio']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
