"""What only a GPU can check: the serving path on CUDA.

Skipped, with the reason, where onnxruntime has no CUDA provider or no GPU is visible;
``scripts/gpu_checks.sh`` runs them (and the GPU benchmark tables) on a GPU machine.
The same code paths run on CPU in tests/test_batch_runs.py and tests/test_serving_graph.py;
here are the parts that differ on a GPU: page-locked buffers, copies to the device,
padded buckets, NVML memory figures, float16 weights and TensorRT.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from config.settings import Settings
from inference_core.adapter.onnx_io import open_session
from inference_core.adapter.serving_graph import ServingGraph
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.locator import AvatarLocator
from inference_core.avatars.package import AvatarPackage
from inference_core.exceptions import ModelLoadError
from inference_core.serving.batch_buffers import thread_buffers
from inference_core.serving.core import InferenceCore
from inference_core.serving.devices import (
    CUDA_PROVIDER,
    TENSORRT_PROVIDER,
    Device,
    count_visible_gpus,
    session_config,
)
from inference_core.serving.frame_request import FrameRequest
from inference_core.serving.loaded_model import LoadedModel


def _cuda_missing() -> str | None:
    if CUDA_PROVIDER not in ort.get_available_providers():
        return f"needs onnxruntime-gpu ({CUDA_PROVIDER} absent); scripts/gpu_checks.sh"
    if count_visible_gpus(os.environ)[0] == 0:
        return "needs a visible NVIDIA GPU; scripts/gpu_checks.sh"
    return None


pytestmark = pytest.mark.skipif(_cuda_missing() is not None, reason=str(_cuda_missing()))

CUDA = Device(0, "cuda", 0)


def _settings(root: Path, **devices: object) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
            "devices": {"kind": "cuda", "count": 1, **devices},
        }
    )


@pytest.fixture
def package(tmp_path: Path) -> AvatarPackage:
    write_demo_avatar(tmp_path / "demo", count=2)
    return AvatarLocator(tmp_path).load("demo")


def _open(package: AvatarPackage, device: Device, settings: Settings) -> LoadedModel:
    providers, options = session_config(device, settings.devices)

    def factory(graph: ServingGraph, _device: Device) -> ort.InferenceSession:
        return open_session(graph.serialized(), providers=providers, options=options)

    return LoadedModel.open(
        package, device, factory, max_batch_size=8, fp16=settings.devices.precision == "fp16"
    )


def _requests(n: int, loop: asyncio.AbstractEventLoop) -> list[FrameRequest]:
    rng = np.random.default_rng(1)
    return [
        FrameRequest(
            "demo",
            rng.integers(0, 256, (320, 320, 3), dtype=np.uint8),
            rng.normal(0, 1, (32, 16, 16)).astype(np.float32),
            0.0,
            loop.create_future(),
            loop,
        )
        for _ in range(n)
    ]


def test_cuda_faces_match_cpu_faces_with_padded_page_locked_batches(
    package: AvatarPackage, tmp_path: Path
) -> None:
    loop = asyncio.new_event_loop()
    try:
        settings = _settings(tmp_path)
        gpu = _open(package, CUDA, settings)
        cpu = _open(package, Device(0), settings)
        assert gpu.pad_batches
        assert not cpu.pad_batches
        adapter = gpu.adapter
        assert adapter is not None
        assert adapter.session.get_providers()[0] == CUDA_PROVIDER
        requests = _requests(5, loop)  # runs as bucket 8
        faces = gpu.run_batch(requests)
        assert len(faces) == 5
        diff = np.abs(np.stack(faces).astype(np.int16) - np.stack(cpu.run_batch(requests)))
        assert diff.max() <= 1  # cuDNN and MLAS round differently, rarely
        assert thread_buffers().get(320, (32, 16, 16), 8, pinned=True).pinned
    finally:
        loop.close()


def test_fp16_on_cuda_stays_close(package: AvatarPackage, tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    try:
        full = _open(package, CUDA, _settings(tmp_path))
        half = _open(package, CUDA, _settings(tmp_path, precision="fp16"))
        requests = _requests(4, loop)
        diff = np.abs(
            np.stack(full.run_batch(requests)).astype(np.int16) - np.stack(half.run_batch(requests))
        )
        assert diff.max() <= 3
        assert diff.mean() < 0.05
    finally:
        loop.close()


async def test_nvml_measures_each_model_on_the_gpu(tmp_path: Path) -> None:
    write_demo_avatar(tmp_path / "one", count=2)
    write_demo_avatar(tmp_path / "two", count=2)
    core = InferenceCore(_settings(tmp_path), AvatarLocator(tmp_path))
    await core.start()
    try:
        assert core.registry.memory_probe.used_bytes(CUDA) > 0
        for model_id in ("one", "two"):
            async with await core.open(model_id) as handle:
                assert handle.device.kind == "cuda"
        snapshots = {s.model_id: s for s in core.registry.model_snapshots()}
        file_size = (tmp_path / "one" / "lipsync.onnx").stat().st_size
        assert snapshots["one"].memory_bytes >= file_size
        assert snapshots["two"].memory_bytes >= file_size
    finally:
        await core.stop()


@pytest.mark.skipif(
    TENSORRT_PROVIDER not in ort.get_available_providers(),
    reason=f"needs onnxruntime-gpu built with TensorRT ({TENSORRT_PROVIDER} absent)",
)
def test_tensorrt_builds_and_caches_an_engine_or_says_what_is_missing(
    package: AvatarPackage, tmp_path: Path
) -> None:
    """With its libraries, TensorRT builds an engine into the cache; without them (an
    onnxruntime-gpu wheel lists the provider either way) the load fails naming libnvinfer,
    instead of serving from CUDA as onnxruntime would (seen on an H200, 2026-11-26)."""
    cache = tmp_path / "trt"
    settings = _settings(tmp_path, tensorrt=True, tensorrt_cache_dir=str(cache))
    cache.mkdir()
    error = ""
    try:
        model = _open(package, CUDA, settings)
    except ModelLoadError as exc:
        error = str(exc)
    if error:
        assert f"could not start {TENSORRT_PROVIDER}" in error
        assert "libnvinfer" in error
        assert "devices.tensorrt: false" in error
        assert not any(cache.iterdir())
        return
    adapter = model.adapter
    assert adapter is not None
    assert adapter.session.get_providers()[0] == TENSORRT_PROVIDER
    assert any(cache.iterdir())  # the engine is on disk for the next start
