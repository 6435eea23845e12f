"""What only a GPU can check: the serving path on CUDA.

Skipped, with the reason, where onnxruntime has no CUDA provider or no GPU is visible;
``scripts/gpu_checks.sh`` runs them (and the GPU benchmark tables) on a GPU machine.
The same code paths run on CPU in tests/test_batch_runs.py and tests/test_serving_graph.py;
here are the parts that differ on a GPU: page-locked buffers, copies to the device,
padded buckets, NVML memory figures, float16 weights and TensorRT.

TensorRT is checked where each of its three cases holds, one outcome each: where its
provider starts, an engine is built and cached; where onnxruntime has no such provider
(this CPU machine's onnxruntime), or lists it without the libraries to start it (an
onnxruntime-gpu wheel without TensorRT installed), the load is refused saying what to
install or set. Which case holds is probed apart from the code under test.
"""

from __future__ import annotations

import asyncio
import functools
import os
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

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


needs_cuda = pytest.mark.skipif(_cuda_missing() is not None, reason=str(_cuda_missing()))
#: onnxruntime's own warning when a requested provider is not in its build (it then
#: falls back; the load must fail regardless).
NOT_IN_BUILD = r"ignore:Specified provider '\w+' is not in available provider names:UserWarning"


@functools.cache
def _tensorrt_state() -> str:
    """``starts``, ``absent`` (not in this onnxruntime) or ``does not start`` (listed, its
    libraries not loadable): a one-node model opened with TensorRT alone, by onnxruntime
    itself, not through the code under test."""
    if TENSORRT_PROVIDER not in ort.get_available_providers():
        return "absent"
    node = helper.make_node("Identity", ["x"], ["y"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    model = helper.make_model(helper.make_graph([node], "probe", [x], [y]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warns; the providers tell
        session = ort.InferenceSession(
            model.SerializeToString(), providers=[TENSORRT_PROVIDER, "CPUExecutionProvider"]
        )
    return "starts" if session.get_providers()[0] == TENSORRT_PROVIDER else "does not start"


def _tensorrt_is(state: str, reason: str) -> None:
    """Skip unless TensorRT is in ``state`` here, saying why."""
    found = _tensorrt_state()
    if found != state:
        pytest.skip(f"{reason}: {TENSORRT_PROVIDER} {found} here")


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


@needs_cuda
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


@needs_cuda
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


@needs_cuda
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


def test_tensorrt_builds_and_caches_an_engine(package: AvatarPackage, tmp_path: Path) -> None:
    """Where the provider starts, the model's session runs on TensorRT and its engine is
    on disk for the next start."""
    _tensorrt_is("starts", f"needs {TENSORRT_PROVIDER} that starts (onnxruntime-gpu, TensorRT)")
    cache = tmp_path / "trt"
    cache.mkdir()
    model = _open(package, CUDA, _settings(tmp_path, tensorrt=True, tensorrt_cache_dir=str(cache)))
    adapter = model.adapter
    assert adapter is not None
    assert adapter.session.get_providers()[0] == TENSORRT_PROVIDER
    assert any(cache.iterdir())


@pytest.mark.filterwarnings(NOT_IN_BUILD)
def test_tensorrt_this_onnxruntime_lacks_is_refused_saying_what_to_install(
    package: AvatarPackage, tmp_path: Path
) -> None:
    """A CUDA device with devices.tensorrt on an onnxruntime built without the provider
    (as here): the load fails naming it, what to install and the setting without it,
    instead of serving from whatever onnxruntime falls back to."""
    _tensorrt_is("absent", f"{TENSORRT_PROVIDER} is in this onnxruntime")
    cache = tmp_path / "trt"
    cache.mkdir()
    settings = _settings(tmp_path, tensorrt=True, tensorrt_cache_dir=str(cache))
    with pytest.raises(ModelLoadError) as refused:
        _open(package, CUDA, settings)
    error = str(refused.value)
    assert f"could not start {TENSORRT_PROVIDER}" in error
    assert f"this onnxruntime has no {TENSORRT_PROVIDER}" in error
    assert "pip install onnxruntime-gpu" in error
    assert "devices.tensorrt: false" in error
    assert not any(cache.iterdir())


@needs_cuda
def test_tensorrt_without_its_libraries_is_refused_naming_libnvinfer(
    package: AvatarPackage, tmp_path: Path
) -> None:
    """onnxruntime-gpu lists the provider whether or not TensorRT is installed; without
    libnvinfer it would run the session on CUDA (seen on an H200, 2026-11-26). The load
    fails naming the library and the setting instead."""
    _tensorrt_is("does not start", f"needs {TENSORRT_PROVIDER} listed without its libraries")
    cache = tmp_path / "trt"
    cache.mkdir()
    settings = _settings(tmp_path, tensorrt=True, tensorrt_cache_dir=str(cache))
    with pytest.raises(ModelLoadError) as refused:
        _open(package, CUDA, settings)
    error = str(refused.value)
    assert f"could not start {TENSORRT_PROVIDER}" in error
    assert "libnvinfer" in error
    assert "devices.tensorrt: false" in error
    assert not any(cache.iterdir())
