"""Device detection, session configuration, memory probing and device placement."""

from __future__ import annotations

import mmap
import os
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from config.settings import DevicesSettings
from inference_core.adapter.onnx_io import open_session
from inference_core.assets.demo_models import build_lipsync_model
from inference_core.exceptions import InferenceError, ModelLoadError
from inference_core.serving import devices
from inference_core.serving.devices import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    Device,
    SystemMemoryProbe,
    check_gpu_options,
    detect_devices,
    session_config,
)
from inference_core.serving.placement import DeviceLoad, choose_device, least_loaded_order

CPU_ONLY = [CPU_PROVIDER]
WITH_CUDA = ["TensorrtExecutionProvider", CUDA_PROVIDER, CPU_PROVIDER]
MIB = 1024 * 1024


def _settings(**values: object) -> DevicesSettings:
    return DevicesSettings.model_validate(values)


def test_device_names_follow_kind() -> None:
    assert Device(2).name == "cpu:2"
    assert Device(0, "cuda", ordinal=3).name == "cuda:3"
    assert Device(1, "cpu", name="custom").name == "custom"
    with pytest.raises(ValueError, match=">= 0"):
        Device(-1)


def test_auto_picks_cpu_without_the_cuda_provider() -> None:
    devices = detect_devices(_settings(), available_providers=CPU_ONLY, gpu_count=4)
    assert devices == [Device(0, "cpu", 0, "cpu:0")]


def test_auto_picks_cuda_when_provider_and_gpus_exist() -> None:
    devices = detect_devices(_settings(), available_providers=WITH_CUDA, gpu_count=2)
    assert [(d.index, d.kind, d.ordinal, d.name) for d in devices] == [
        (0, "cuda", 0, "cuda:0"),
        (1, "cuda", 1, "cuda:1"),
    ]


def test_auto_falls_back_to_cpu_when_no_gpu_is_visible() -> None:
    assert detect_devices(_settings(), available_providers=WITH_CUDA, gpu_count=0) == [Device(0)]
    # CUDA_VISIBLE_DEVICES=-1 hides every GPU whatever NVML or nvidia-smi would count
    hidden = detect_devices(
        _settings(), available_providers=WITH_CUDA, environ={"CUDA_VISIBLE_DEVICES": "-1"}
    )
    assert [d.kind for d in hidden] == ["cpu"]


def test_no_nvml_no_nvidia_smi_and_no_cuda_driver_means_no_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA image started without a GPU: onnxruntime-gpu lists CUDA, nothing counts
    GPUs, and the driver is absent: serve on the CPU, not on an assumed GPU."""
    monkeypatch.setattr(devices, "_physical_gpu_count", lambda: (None, "unknown"))
    monkeypatch.setattr(devices, "_cuda_driver_loads", lambda: False)
    assert devices.count_visible_gpus({}) == (0, "no CUDA driver: libcuda.so.1 cannot be loaded")
    chosen = detect_devices(_settings(kind="auto"), available_providers=WITH_CUDA)
    assert [d.kind for d in chosen] == ["cpu"]
    monkeypatch.setattr(devices, "_cuda_driver_loads", lambda: True)
    assert devices.count_visible_gpus({}) == (1, "assumed 1: no NVML, no nvidia-smi")
    assert devices.count_visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"})[0] == 0


def test_forced_cuda_without_provider_explains_the_fix() -> None:
    with pytest.raises(InferenceError) as caught:
        detect_devices(_settings(kind="cuda"), available_providers=CPU_ONLY, gpu_count=1)
    message = str(caught.value)
    assert "devices.kind is cuda" in message
    assert CPU_PROVIDER in message  # what was found
    assert "onnxruntime-gpu" in message
    assert "devices.kind: cpu" in message


def test_forced_cuda_with_provider_but_no_gpu_fails() -> None:
    with pytest.raises(InferenceError, match="no GPU is visible"):
        detect_devices(_settings(kind="cuda"), available_providers=WITH_CUDA, gpu_count=0)


def test_count_handling() -> None:
    cpu3 = detect_devices(_settings(kind="cpu", count=3), available_providers=WITH_CUDA)
    assert [d.name for d in cpu3] == ["cpu:0", "cpu:1", "cpu:2"]
    assert [d.index for d in cpu3] == [0, 1, 2]
    one_of_two = detect_devices(_settings(count=1), available_providers=WITH_CUDA, gpu_count=2)
    assert [d.name for d in one_of_two] == ["cuda:0"]
    all_four = detect_devices(_settings(kind="cuda"), available_providers=WITH_CUDA, gpu_count=4)
    assert len(all_four) == 4
    with pytest.raises(InferenceError, match="only 2 GPU"):
        detect_devices(_settings(count=3), available_providers=WITH_CUDA, gpu_count=2)


def test_session_config_for_cuda() -> None:
    providers, options = session_config(Device(1, "cuda", ordinal=1), _settings())
    assert providers == [
        (
            CUDA_PROVIDER,
            {
                "device_id": "1",
                "arena_extend_strategy": "kSameAsRequested",
                "cudnn_conv_algo_search": "HEURISTIC",
            },
        ),
        CPU_PROVIDER,
    ]
    entry = "session.use_device_allocator_for_initializers"
    assert options.get_session_config_entry(entry) == "1"


def test_tensorrt_goes_first_with_its_caches_or_is_refused_by_name(tmp_path: Path) -> None:
    cache = tmp_path / "trt"
    settings = _settings(tensorrt=True, precision="fp16", tensorrt_cache_dir=str(cache))
    providers, _ = session_config(Device(0, "cuda", ordinal=0), settings)
    name, options = providers[0]  # type: ignore[misc]
    assert name == "TensorrtExecutionProvider"
    assert options["trt_engine_cache_path"] == str(cache)
    assert options["trt_timing_cache_path"] == str(cache)
    assert options["trt_fp16_enable"] == "True"
    assert [p[0] if isinstance(p, tuple) else p for p in providers[1:]] == [
        CUDA_PROVIDER,
        CPU_PROVIDER,
    ]
    # A CPU device ignores it; a CUDA device without TensorRT is refused at start-up.
    assert session_config(Device(0), settings)[0] == [CPU_PROVIDER]
    check_gpu_options(settings, [Device(0)])
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(InferenceError, match=r"devices\.tensorrt is on .* or set"):
            check_gpu_options(settings, [Device(0, "cuda", ordinal=0)])


def test_session_config_for_cpu() -> None:
    providers, options = session_config(Device(0), _settings(cpu_threads_per_session=3))
    assert providers == [CPU_PROVIDER]
    assert options.intra_op_num_threads == 3
    cores = os.cpu_count() or 1
    _, alone = session_config(Device(0), _settings())  # one CPU device, one worker
    assert alone.intra_op_num_threads == cores
    assert alone.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    # 2 devices x 2 workers share the cores: split them, and do not spin-wait.
    _, shared = session_config(Device(0), _settings(count=2, workers_per_device=2))
    assert shared.intra_op_num_threads == max(1, cores // 4)
    assert shared.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_cpu_sessions_share_one_arena(tmp_path: Path) -> None:
    """Per-session arenas kept ≈50 MB each after a batch-8 run of the demo model."""
    model = build_lipsync_model(tmp_path / "m.onnx")
    feeds = {
        "visual": np.zeros((8, 6, 320, 320), np.float32),
        "audio": np.zeros((8, 32, 16, 16), np.float32),
    }
    providers, options = session_config(Device(0), _settings())
    assert options.get_session_config_entry("session.use_env_allocators") == "1"

    def open_and_run() -> ort.InferenceSession:
        session = ort.InferenceSession(str(model), options, providers=providers)
        names = [i.name for i in session.get_inputs()]
        session.run(None, {names[0]: feeds["visual"], names[1]: feeds["audio"]})
        return session

    sessions = [open_and_run()]  # the shared arena grows to one run's peak once
    probe = SystemMemoryProbe(_settings())
    before = probe.used_bytes(Device(0))
    sessions += [open_and_run() for _ in range(4)]
    grown = probe.used_bytes(Device(0)) - before
    probe.close()
    assert grown < 4 * 20 * MIB, f"{grown / MIB:.0f} MiB for 4 more sessions"


@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(),
    reason="onnxruntime-gpu starts CUDA here; tests/test_gpu.py checks TensorRT's fallback",
)
def test_an_accelerator_onnxruntime_replaces_quietly_is_a_load_error(tmp_path: Path) -> None:
    """onnxruntime only warns when it cannot start a requested provider and runs the next
    one: a GPU deployment would serve from the CPU (seen on an H200 whose TensorRT
    libraries were missing: the TensorRT session ran on CUDA). The load fails instead."""
    model = build_lipsync_model(tmp_path / "m.onnx")
    cuda_first: list[str | tuple[str, dict[str, str]]] = [
        ("CUDAExecutionProvider", {"device_id": "0"}),
        "CPUExecutionProvider",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnxruntime's own "not in available providers"
        with pytest.raises(ModelLoadError, match=r"could not start \w+ExecutionProvider") as err:
            open_session(model, label="m.onnx", providers=cuda_first)
    assert "m.onnx" in str(err.value)
    assert "devices.kind: cpu" in str(err.value)
    assert open_session(model, providers=["CPUExecutionProvider"]).get_providers() == [
        "CPUExecutionProvider"
    ]


def test_cpu_memory_probe_sees_allocations() -> None:
    probe = SystemMemoryProbe(_settings())
    # A fresh anonymous mapping, every page written: the heap may hold freed memory that
    # a numpy allocation would reuse without growing the RSS.
    with mmap.mmap(-1, 64 * MIB) as block:
        before = probe.used_bytes(Device(0))
        pages = np.frombuffer(block, dtype=np.uint8)
        pages[:] = 1
        after = probe.used_bytes(Device(0))
        del pages
    assert after - before >= 60 * MIB
    total = probe.total_bytes(Device(0))
    assert total is not None
    assert total > after
    assert SystemMemoryProbe(_settings(max_memory_per_device="1GiB")).total_bytes(Device(1)) == (
        1024 * MIB
    )
    probe.close()


def _load(index: int, *, models: int = 0, used: int = 0, queue: int = 0) -> DeviceLoad:
    return DeviceLoad(index, models, used, max_bytes=1000, max_models=4, queue_depth=queue)


def test_round_robin_cycles() -> None:
    loads = [_load(0), _load(1, models=3), _load(2)]
    picks = [choose_device("round-robin", loads, preferred=None, rr_counter=n) for n in range(5)]
    assert picks == [0, 1, 2, 0, 1]


def test_least_loaded_prefers_free_memory_then_queue_then_fewer_models() -> None:
    def pick(loads: list[DeviceLoad]) -> int:
        return choose_device("least-loaded", loads, preferred=None, rr_counter=0)

    # most free memory wins even against a longer queue
    assert pick([_load(0, used=500), _load(1, used=100, queue=9)]) == 1
    # equal memory: the shorter queue wins
    assert pick([_load(0, used=100, queue=3), _load(1, used=100, queue=1)]) == 1
    # equal memory and queue: fewer models wins
    assert pick([_load(0, models=2, used=100), _load(1, models=1, used=100)]) == 1
    # a device that would need an eviction comes last
    assert pick([_load(0, models=4), _load(1, models=1, used=900)]) == 1
    # no byte limit: less used memory counts as more free
    unlimited = [
        DeviceLoad(0, 1, 300, None, 4),
        DeviceLoad(1, 1, 200, None, 4),
    ]
    assert pick(unlimited) == 1
    # the order the registry falls back along when its first choice is full of held models
    assert least_loaded_order([_load(0, models=4), _load(1, used=500), _load(2)]) == [2, 1, 0]


def test_preferred_device_wins_if_it_exists() -> None:
    loads = [_load(0), _load(1, used=999, queue=50)]
    assert choose_device("least-loaded", loads, preferred=1, rr_counter=0) == 1
    assert choose_device("round-robin", loads, preferred=1, rr_counter=0) == 1
    # a preferred device that does not exist is ignored
    assert choose_device("least-loaded", loads, preferred=7, rr_counter=0) == 0
