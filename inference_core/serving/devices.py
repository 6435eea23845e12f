"""Inference devices: which ones to use, how to open a session on one, how full one is.

A :class:`Device` is lipstream's numbering (``index`` 0..N-1) of a GPU (``cuda``, with its
CUDA ``ordinal``) or of a CPU "device" (a share of the machine's cores; several CPU
devices are allowed so the core can be run and tested without a GPU).

:func:`detect_devices` turns ``devices:`` settings into devices, :func:`session_config`
gives the onnxruntime providers and options for a device (``docs/design/serving.md`` §4), and a
:class:`MemoryProbe` reports memory in use: NVML per GPU, process RSS for CPU devices.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import onnxruntime as ort

from config.settings import DevicesSettings
from inference_core.exceptions import InferenceError

logger = logging.getLogger(__name__)

DeviceKind = Literal["cpu", "cuda"]
#: What :func:`session_config` returns: onnxruntime providers, as ``open_session`` takes them.
Providers = list[str | tuple[str, dict[str, str]]]

CUDA_PROVIDER = "CUDAExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
_NVIDIA_SMI_TIMEOUT_S = 10.0
_shared_arena_lock = threading.Lock()
_shared_arena_registered = False


def shared_cpu_arena() -> None:
    """Register one CPU memory arena for every CPU session of this process (idempotent).

    onnxruntime's default gives each session its own arena, which keeps the peak of
    that session's largest run forever: ≈50 MB per loaded demo model after warming
    batch 8, times hundreds of avatars. Sessions opened with
    ``session.use_env_allocators`` share this one instead, so the process keeps
    roughly the peak of the runs in flight at once (≈7 MB per loaded demo model,
    measured; throughput unchanged). The arena belongs to onnxruntime's process-wide
    environment, hence the module-level flag.
    """
    global _shared_arena_registered
    with _shared_arena_lock:
        if _shared_arena_registered:
            return
        memory = ort.OrtMemoryInfo(
            "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
        )
        # 0 / -1: no size limit, default extend strategy, chunk size and dead bytes.
        ort.create_and_register_allocator(memory, ort.OrtArenaCfg(0, -1, -1, -1))
        _shared_arena_registered = True


@dataclass(frozen=True)
class Device:
    """One inference device. ``name`` defaults to ``cuda:<ordinal>`` or ``cpu:<index>``."""

    index: int
    kind: DeviceKind = "cpu"
    ordinal: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        if self.index < 0 or self.ordinal < 0:
            raise ValueError(f"device index and ordinal must be >= 0, got {self}")
        if not self.name:
            number = self.ordinal if self.kind == "cuda" else self.index
            object.__setattr__(self, "name", f"{self.kind}:{number}")


def detect_devices(
    settings: DevicesSettings,
    *,
    available_providers: Sequence[str] | None = None,
    gpu_count: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Device]:
    """Choose the inference devices from ``settings``.

    ``kind: auto`` means CUDA when onnxruntime has the CUDA execution provider and at least
    one GPU is visible, else CPU. ``kind: cuda`` without a usable GPU raises
    :class:`InferenceError` saying what was found and how to fix it. ``count: null`` means
    every visible GPU (cuda) or one device (cpu). ``available_providers``, ``gpu_count``
    and ``environ`` default to onnxruntime's providers, the visible GPUs and
    ``os.environ``; tests pass them.
    """
    providers = list(
        ort.get_available_providers() if available_providers is None else available_providers
    )
    env = os.environ if environ is None else environ
    has_provider = CUDA_PROVIDER in providers
    gpus, gpu_source = (0, "no CUDA provider")
    if has_provider and settings.kind != "cpu":
        gpus, gpu_source = (
            (gpu_count, "given") if gpu_count is not None else count_visible_gpus(env)
        )

    if settings.kind == "cpu" or (settings.kind == "auto" and (not has_provider or gpus == 0)):
        count = settings.count or 1
        if settings.kind == "cpu":
            why = "devices.kind is cpu"
        elif not has_provider:
            why = f"auto: onnxruntime has no {CUDA_PROVIDER} (providers: {', '.join(providers)})"
        else:
            why = f"auto: {CUDA_PROVIDER} present but no GPU visible ({gpu_source})"
        devices = [Device(i, "cpu") for i in range(count)]
        _log_choice(devices, why)
        return devices

    if not has_provider or gpus == 0:
        found = (
            f"onnxruntime {ort.__version__} offers {', '.join(providers) or 'no providers'}"
            if not has_provider
            else f"{CUDA_PROVIDER} is available but no GPU is visible ({gpu_source})"
        )
        raise InferenceError(
            f"devices.kind is cuda but CUDA cannot be used: {found}. Install onnxruntime-gpu "
            "matching your CUDA/cuDNN (pip install onnxruntime-gpu, and uninstall onnxruntime), "
            "check nvidia-smi and CUDA_VISIBLE_DEVICES, or set devices.kind: cpu"
        )
    count = settings.count or gpus
    if count > gpus:
        raise InferenceError(
            f"devices.count is {count} but only {gpus} GPU(s) are visible ({gpu_source}); "
            f"set devices.count to at most {gpus} or leave it empty to use all of them"
        )
    devices = [Device(i, "cuda", ordinal=i) for i in range(count)]
    why = f"{CUDA_PROVIDER} present, {gpus} GPU(s) visible ({gpu_source})"
    if settings.kind == "auto":
        why = "auto: " + why
    _log_choice(devices, why)
    return devices


def _log_choice(devices: Sequence[Device], why: str) -> None:
    logger.info("inference devices: %s (%s)", ",".join(d.name for d in devices), why)


def _visible_entries(environ: Mapping[str, str]) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as a list, or None when it is not set."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",") if e.strip()]
    # CUDA stops at the first invalid entry; "-1" is the usual way to hide every GPU.
    visible = []
    for entry in entries:
        if entry.startswith("-"):
            break
        visible.append(entry)
    return visible


def count_visible_gpus(environ: Mapping[str, str]) -> tuple[int, str]:
    """How many GPUs CUDA will show this process, and how that was found out.

    NVML (``pynvml``), else ``nvidia-smi -L``, else none without a loadable CUDA driver (a
    GPU image on a machine without one) and one otherwise; ``CUDA_VISIBLE_DEVICES`` caps it.
    """
    physical, source = _physical_gpu_count()
    if physical is None and not _cuda_driver_loads():
        physical, source = 0, "no CUDA driver: libcuda.so.1 cannot be loaded"
    visible = _visible_entries(environ)
    if visible is None:
        return (1, "assumed 1: no NVML, no nvidia-smi") if physical is None else (physical, source)
    if physical is None:
        return len(visible), f"CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']!r}"
    return min(physical, len(visible)), f"{source}, CUDA_VISIBLE_DEVICES caps it"


def _physical_gpu_count() -> tuple[int | None, str]:
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        nvml = None
    if nvml is not None:
        try:
            nvml.nvmlInit()
            try:
                return int(nvml.nvmlDeviceGetCount()), "NVML"
            finally:
                nvml.nvmlShutdown()
        except Exception as exc:  # pynvml raises NVMLError subclasses; no driver is one
            logger.debug("NVML unusable: %s", exc)
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            listing = subprocess.run(
                [smi, "-L"],
                capture_output=True,
                text=True,
                timeout=_NVIDIA_SMI_TIMEOUT_S,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            logger.debug("nvidia-smi -L failed: %s", exc)
        else:
            return sum(1 for line in listing.splitlines() if line.startswith("GPU ")), "nvidia-smi"
    return None, "unknown"


def _cuda_driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")  # the NVIDIA driver's CUDA library
    except OSError:
        return False
    return True


def session_config(
    device: Device, settings: DevicesSettings
) -> tuple[Providers, ort.SessionOptions]:
    """onnxruntime providers and session options for a session on ``device``.

    CUDA: the device's ordinal, arenas that grow by what is asked (not doubled: hundreds
    of models share a GPU), heuristic cuDNN algorithm search (exhaustive search re-runs
    for every new input shape), initializers in the device allocator. CPU:
    ``cpu_threads_per_session`` intra-op threads, or when 0 the cores divided among the
    workers of all CPU devices, since that many sessions run at once; threads do not
    spin-wait (the rest of the server needs the cores); memory comes from the
    process's :func:`shared_cpu_arena`.
    """
    options = ort.SessionOptions()
    if device.kind == "cuda":
        cuda_options = {
            "device_id": str(device.ordinal),
            "arena_extend_strategy": "kSameAsRequested",
            "cudnn_conv_algo_search": "HEURISTIC",
        }
        options.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
        providers: Providers = [(CUDA_PROVIDER, cuda_options), CPU_PROVIDER]
        if settings.tensorrt:
            providers.insert(0, (TENSORRT_PROVIDER, tensorrt_options(device, settings)))
        return providers, options
    cores = os.cpu_count() or 1
    concurrent = settings.workers_for(device.kind) * (settings.count or 1)
    threads = settings.cpu_threads_per_session or max(1, cores // concurrent)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Spin-waiting pool threads would steal cores from the event loop, compositing,
    # encoding and other sessions; a server is never running one model alone.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    shared_cpu_arena()
    options.add_session_config_entry("session.use_env_allocators", "1")
    return [CPU_PROVIDER], options


def tensorrt_options(device: Device, settings: DevicesSettings) -> dict[str, str]:
    """TensorRT provider options: engines and timing caches kept on disk between starts.

    Building an engine takes minutes per model and batch profile; with the caches a
    restart loads it in seconds. fp16 kernels follow ``devices.precision``.
    """
    cache = str(settings.tensorrt_cache_dir)
    return {
        "device_id": str(device.ordinal),
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": cache,
        "trt_fp16_enable": "True" if settings.precision == "fp16" else "False",
    }


def check_gpu_options(settings: DevicesSettings, devices: Sequence[Device]) -> None:
    """Refuse GPU options this onnxruntime cannot honour, naming the setting and the fix."""
    if settings.tensorrt and any(d.kind == "cuda" for d in devices):
        if TENSORRT_PROVIDER not in ort.get_available_providers():
            raise InferenceError(
                f"devices.tensorrt is on but onnxruntime {ort.__version__} offers no "
                f"{TENSORRT_PROVIDER}; install onnxruntime-gpu with the TensorRT libraries "
                "(pip install tensorrt) or set devices.tensorrt: false"
            )
        settings.tensorrt_cache_dir.mkdir(parents=True, exist_ok=True)


class MemoryProbe(Protocol):
    """Memory in use on a device; the registry measures a model's size around its load."""

    def used_bytes(self, device: Device) -> int:
        """Bytes in use now (the whole GPU for cuda, this process's RSS for cpu)."""
        ...

    def total_bytes(self, device: Device) -> int | None:
        """Bytes the device has, or None when unknown."""
        ...


_STATM = Path("/proc/self/statm")
_MEMINFO = Path("/proc/meminfo")
_MEMTOTAL_RE = re.compile(r"^MemTotal:\s+(\d+)\s+kB", re.MULTILINE)


class SystemMemoryProbe:
    """The default :class:`MemoryProbe`: NVML for cuda devices, /proc for cpu devices.

    CPU devices share one process, so ``used_bytes`` is the process's RSS for each of
    them; a model's size is the RSS delta across its load (the registry serialises the
    measured part of CPU loads). Without NVML, cuda devices report 0 used and unknown
    total, and the registry falls back to the ONNX file size. Call :meth:`close` when done.
    """

    def __init__(
        self, settings: DevicesSettings, *, environ: Mapping[str, str] | None = None
    ) -> None:
        self._max_bytes = settings.max_memory_per_device
        self._environ = dict(os.environ if environ is None else environ)
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._lock = threading.Lock()  # loads on different devices probe from their threads
        self._nvml: Any = None
        self._nvml_tried = False
        self._handles: dict[int, Any] = {}

    def used_bytes(self, device: Device) -> int:
        if device.kind == "cuda":
            handle = self._handle(device)
            return 0 if handle is None else int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
        try:
            resident_pages = int(_STATM.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return 0
        return resident_pages * self._page_size

    def total_bytes(self, device: Device) -> int | None:
        if device.kind == "cuda":
            handle = self._handle(device)
            if handle is None:
                return self._max_bytes
            total = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).total)
            return min(total, self._max_bytes) if self._max_bytes else total
        if self._max_bytes is not None:
            return self._max_bytes
        try:
            match = _MEMTOTAL_RE.search(_MEMINFO.read_text())
        except OSError:
            return None
        return None if match is None else int(match.group(1)) * 1024

    def close(self) -> None:
        """Shut NVML down if this probe started it."""
        with self._lock:
            if self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except Exception as exc:  # NVMLError; nothing left to do at shutdown
                    logger.debug("nvmlShutdown failed: %s", exc)
            self._nvml = None
            self._handles.clear()

    def _handle(self, device: Device) -> Any:
        with self._lock:
            if not self._nvml_tried:
                self._nvml_tried = True
                self._nvml = _start_nvml()
            if self._nvml is None:
                return None
            if device.ordinal not in self._handles:
                try:
                    self._handles[device.ordinal] = self._nvml_handle(device.ordinal)
                except Exception as exc:  # NVMLError: measuring must never fail a load
                    logger.warning("NVML has no handle for %s: %s", device.name, exc)
                    self._handles[device.ordinal] = None
            return self._handles[device.ordinal]

    def _nvml_handle(self, ordinal: int) -> Any:
        # NVML numbers physical GPUs; CUDA ordinals count only CUDA_VISIBLE_DEVICES.
        visible = _visible_entries(self._environ)
        entry = visible[ordinal] if visible is not None and ordinal < len(visible) else None
        if entry is not None and not entry.isdigit():
            return self._nvml.nvmlDeviceGetHandleByUUID(entry)
        return self._nvml.nvmlDeviceGetHandleByIndex(int(entry) if entry else ordinal)


def _start_nvml() -> Any:
    try:
        nvml: Any = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as exc:  # ImportError or NVMLError (no driver)
        logger.warning(
            "NVML unavailable (%s): GPU model sizes fall back to ONNX file sizes; "
            "install nvidia-ml-py to measure them",
            exc,
        )
        return None
    return nvml
