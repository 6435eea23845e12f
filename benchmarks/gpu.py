"""GPU tables: the serving path on CUDA, raw vs served, fp32 vs fp16 (and TensorRT).

    .venv/bin/python -m benchmarks.run --only gpu
    bash scripts/gpu_checks.sh            # the GPU tests and this, on a GPU machine

Needs onnxruntime-gpu and a visible NVIDIA GPU; elsewhere it prints why it measured
nothing and returns ``{"skipped": reason}``. On device 0:

1. Benchmark UNet frames/s at batch 1, 4, 8 and 16: raw (``session.run`` of the serving
   graph on host arrays, what a caller of onnxruntime would write) against served
   (``LoadedModel.run_batch``: the worker's page-locked buffers, IOBinding, padded
   buckets), alternated, for each precision (fp32, fp16, and TensorRT when onnxruntime
   offers it). Target served/raw >= 0.95.
2. Memory per loaded model (NVML, around load and warm-up) for the UNet and the demo
   model, and how many of each one GPU holds.
3. NVENC: whether FFmpeg's ``h264_nvenc`` opens here (an H100 has no NVENC; lipstream
   encodes with libx264 on the CPU either way).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.common import Result, Target, print_table, print_targets
from config.settings import Settings
from inference_core.adapter.onnx_io import open_session
from inference_core.adapter.serving_graph import AUDIO, CROPS, FACES, SCALED
from inference_core.assets.benchmark_model import DEFAULT_WIDTH, build_benchmark_unet
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.locator import AvatarLocator
from inference_core.exceptions import ModelLoadError
from inference_core.serving.devices import (
    CUDA_PROVIDER,
    TENSORRT_PROVIDER,
    Device,
    SystemMemoryProbe,
    count_visible_gpus,
    session_config,
)
from inference_core.serving.loaded_model import LoadedModel

BATCHES = (1, 4, 8, 16)
TARGET_RATIO = 0.95


def cuda_missing() -> str | None:
    """Why CUDA cannot be measured here, or None when it can."""
    if CUDA_PROVIDER not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no {CUDA_PROVIDER} (install onnxruntime-gpu)"
    gpus, source = count_visible_gpus({})
    if gpus == 0:
        return f"no GPU visible ({source})"
    return None


class _Request:
    """The fields of a frame request that ``run_batch`` reads."""

    def __init__(self, region: np.ndarray, audio: np.ndarray) -> None:
        self.visual, self.audio, self.raw = region, audio, False


def _settings(root: Path, **devices: Any) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
            "devices": {"kind": "cuda", "count": 1, **devices},
            "batching": {"max_batch_size": max(BATCHES)},
        }
    )


def _open(root: Path, model_id: str, settings: Settings) -> LoadedModel:
    device = Device(0, "cuda", 0)
    providers, options = session_config(device, settings.devices)

    def factory(graph: Any, _device: Device) -> ort.InferenceSession:
        return open_session(graph.serialized(), providers=providers, options=options)

    return LoadedModel.open(
        AvatarLocator(root).load(model_id),
        device,
        factory,
        max_batch_size=max(BATCHES),
        fp16=settings.devices.precision == "fp16",
    )


def throughput(model: LoadedModel, seconds: float) -> dict[int, dict[str, float]]:
    """Raw and served frames/s per batch size, alternated in rounds of ``seconds``."""
    adapter = model.adapter
    assert adapter is not None
    rng = np.random.default_rng(0)
    rows: dict[int, dict[str, float]] = {}
    for batch in BATCHES:
        feeds: dict[str, np.ndarray] = {
            CROPS: rng.integers(0, 256, (batch, 320, 320, 3), dtype=np.uint8),
            SCALED: np.zeros((0, 6, 320, 320), np.float32),
            AUDIO: rng.normal(0, 1, (batch, 32, 16, 16)).astype(np.float32),
        }
        requests: list[Any] = [_Request(feeds[CROPS][i], feeds[AUDIO][i]) for i in range(batch)]

        def bare(f: dict[str, np.ndarray] = feeds, s: Any = adapter.session) -> object:
            return s.run([FACES], f)

        def served_run(r: list[Any] = requests) -> object:
            return model.run_batch(r)

        raw_rates, served_rates = [], []
        for _ in range(3):
            raw_rates.append(_rate(bare, batch, seconds))
            served_rates.append(_rate(served_run, batch, seconds))
        raw, served = statistics.median(raw_rates), statistics.median(served_rates)
        rows[batch] = {"raw_fps": raw, "served_fps": served, "ratio": served / raw}
    return rows


def _rate(call: Callable[[], object], batch: int, seconds: float) -> float:
    """Frames/s of ``call`` (``batch`` frames each) repeated for ``seconds`` after one warm run."""
    call()
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        runs += 1
    return runs * batch / (time.perf_counter() - start)


def memory(root: Path, settings: Settings) -> dict[str, dict[str, float]]:
    """NVML bytes per loaded model and how many fit on the GPU, per model kind."""
    probe = SystemMemoryProbe(settings.devices)
    device = Device(0, "cuda", 0)
    out: dict[str, dict[str, float]] = {}
    try:
        total = probe.total_bytes(device) or 0
        for model_id in ("bench-unet", "demo-model"):
            before = probe.used_bytes(device)
            models = [_open(root, model_id, settings) for _ in range(3)]
            per_model = (probe.used_bytes(device) - before) / len(models)
            for model in models:
                model.close()
            del models
            out[model_id] = {
                "mb_per_model": per_model / 1e6,
                "models_per_gpu": total / per_model if per_model else float("nan"),
            }
    finally:
        probe.close()
    return out


def nvenc() -> str:
    """Whether FFmpeg's NVENC H.264 encoder opens on this machine."""
    try:
        import av
    except ImportError as exc:  # a bare GPU box given only the inference dependencies
        return f"not checked: PyAV is not installed ({exc})"

    try:
        codec = av.codec.Codec("h264_nvenc", "w")
    except Exception as exc:  # UnknownCodecError: FFmpeg built without NVENC
        return f"absent from this FFmpeg build ({exc}); libx264 on the CPU encodes"
    try:
        context: Any = av.codec.CodecContext.create(codec)
        context.width, context.height, context.pix_fmt = 1280, 720, "yuv420p"
        context.open()
    except Exception as exc:  # no NVENC engine on the GPU (H100) or no driver support
        return f"listed but does not open ({exc}); libx264 on the CPU encodes"
    return "opens: an NVENC encoder is available (lipstream still encodes with libx264)"


def run(quick: bool = False) -> Result:
    """Measure the GPU tables, or say why they cannot be measured here."""
    reason = cuda_missing()
    if reason is not None:
        print(f"GPU tables not measured: {reason}")
        return {"skipped": reason}
    seconds = 1.0 if quick else 3.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_demo_avatar(root / "demo-model", count=2)
        write_demo_avatar(root / "bench-unet", count=2)
        build_benchmark_unet(root / "bench-unet" / "lipsync.onnx", width=DEFAULT_WIDTH)
        variants: dict[str, dict[str, Any]] = {"fp32": {}, "fp16": {"precision": "fp16"}}
        if TENSORRT_PROVIDER in ort.get_available_providers():
            variants["tensorrt fp16"] = {
                "precision": "fp16",
                "tensorrt": True,
                "tensorrt_cache_dir": str(root / "trt"),
            }
        tables: dict[str, Any] = {}
        not_measured: dict[str, str] = {}
        for name, options in variants.items():
            try:
                model = _open(root, "bench-unet", _settings(root, **options))
            except ModelLoadError as exc:  # TensorRT listed, its libraries absent
                not_measured[name] = str(exc)
                continue
            tables[name] = throughput(model, seconds)
            model.close()
        memory_rows = memory(root, _settings(root))
    rows = [
        [name, batch, r["raw_fps"], r["served_fps"], f"**{r['ratio']:.3f}**"]
        for name, by_batch in tables.items()
        for batch, r in by_batch.items()
    ]
    print_table(
        "Benchmark UNet on the GPU: raw session.run vs LoadedModel.run_batch (median of 3)",
        ["precision", "batch", "raw frames/s", "served frames/s", "served / raw"],
        rows,
    )
    print_table(
        "Memory per loaded model on the GPU (NVML, 3 loads)",
        ["model", "MB per model", "models per GPU"],
        [[m, r["mb_per_model"], r["models_per_gpu"]] for m, r in memory_rows.items()],
    )
    for name, reason in not_measured.items():
        print(f"  {name}: not measured: {reason}")
    encoder = nvenc()
    print(f"  NVENC: {encoder}")
    targets = [
        Target(f"{name} served/raw at batch 8", by_batch[8]["ratio"], TARGET_RATIO, True)
        for name, by_batch in tables.items()
    ]
    print_targets(targets)
    return {
        "throughput": tables,
        "memory": memory_rows,
        "not_measured": not_measured,
        "nvenc": encoder,
        "targets": [t.as_json() for t in targets],
    }
