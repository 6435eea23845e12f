"""Batch sizes a model runs at, and the host buffers a worker thread fills for them.

**Buckets.** A model runs batches of 1, 2, 4, 8 or 16 frames (those below its
``max_batch_size``) or ``max_batch_size`` itself. Every bucket is warmed at load, so no
shape is seen first in a live call. On CUDA a batch is padded up to its bucket: a new
shape there costs an algorithm search and a graph of its own. On CPU the exact batch
runs, since the model's cost grows with every padded frame (``docs/design/serving.md`` §4).

**Buffers.** Each thread that runs models (a device worker, a load thread) keeps one set
of preallocated host arrays per input geometry, reused by every model of that geometry:
a batch's frames are copied in, nothing full-size is allocated per frame. When the
model runs on CUDA the arrays are page-locked, so their copy to the device is a DMA.

**Faces.** A batch's faces are written into an output slab, and each frame's owner gets
a view of its row. A thread keeps :data:`SLABS` slabs per geometry and reuses one once no
view of it is left (its reference count says so: every numpy view holds its base); when
all are still held it allocates a new one. A fresh array per batch cost a model run at
batch 1 about 15 % more CPU on the 2-core VM (its pages are faulted in by the run).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import logging
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16)
#: Output slabs a thread keeps per geometry: batches whose faces are still being pasted.
SLABS = 4
_serials = itertools.count(1)


def bucket_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes a model with ``max_batch_size`` runs at, smallest first."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    return (*(b for b in BUCKETS if b < max_batch_size), max_batch_size)


def bucket_for(frames: int, sizes: Sequence[int]) -> int:
    """The smallest of ``sizes`` that holds ``frames`` (``frames`` <= the largest)."""
    for size in sizes:
        if size >= frames:
            return size
    raise ValueError(f"{frames} frames do not fit the largest bucket {sizes[-1]}")


@dataclass(eq=False)
class InputBuffers:
    """Preallocated inputs for one geometry: ``capacity`` frames of crops and audio.

    ``serial`` is unique for the life of the process: a model caches what it bound to
    these arrays under it, and a new set (a larger capacity, another thread) gets a new one.
    """

    crops: np.ndarray  # uint8 [capacity, S, S, 3]
    audio: np.ndarray  # float32 [capacity, *audio_shape]
    pinned: bool
    serial: int = field(default_factory=lambda: next(_serials))

    @property
    def capacity(self) -> int:
        return int(self.crops.shape[0])


def _first_refs(slabs: list[np.ndarray]) -> int:
    for slab in slabs:
        return sys.getrefcount(slab)
    return 0


#: The reference count :meth:`ThreadBuffers.faces` sees for a slab nobody else holds
#: (the pool's list, the loop's name, the call's argument), measured the same way.
_IDLE_REFS = _first_refs([np.empty(1)])


@dataclass(eq=False)
class FaceSlab:
    """An output array a batch's faces are written into; ``serial`` as for inputs."""

    faces: np.ndarray  # uint8 [capacity, S, S, 3]
    pooled: bool = True  # False: a one-off, used while every kept slab is still held
    serial: int = field(default_factory=lambda: next(_serials))


class ThreadBuffers:
    """The calling thread's :class:`InputBuffers`, one set per geometry and memory kind,
    and its :class:`FaceSlab` pool."""

    def __init__(self) -> None:
        self._sets: dict[tuple[int, tuple[int, ...], bool], InputBuffers] = {}
        self._slabs: dict[tuple[int, int, bool], list[FaceSlab]] = {}

    def faces(self, input_size: int, capacity: int, *, pinned: bool) -> FaceSlab:
        """A slab of ``capacity`` faces that no view of an earlier batch refers to; a kept
        one is page-locked when ``pinned`` (the copy back from a GPU is then a DMA)."""
        slabs = self._slabs.setdefault((input_size, capacity, pinned), [])
        for slab in slabs:
            if _first_refs([slab.faces]) <= _IDLE_REFS + 1:  # + the slab's own field
                return slab
        faces = np.empty((capacity, input_size, input_size, 3), dtype=np.uint8)
        if len(slabs) >= SLABS:
            return FaceSlab(faces, pooled=False)
        slab = FaceSlab(faces)
        slabs.append(slab)
        if pinned:
            page_lock(faces)
        return slab

    def get(
        self, input_size: int, audio_shape: tuple[int, ...], capacity: int, *, pinned: bool
    ) -> InputBuffers:
        """Buffers holding at least ``capacity`` frames (grown, never shrunk)."""
        key = (input_size, audio_shape, pinned)
        found = self._sets.get(key)
        if found is not None and found.capacity >= capacity:
            return found
        crops = np.empty((capacity, input_size, input_size, 3), dtype=np.uint8)
        audio = np.empty((capacity, *audio_shape), dtype=np.float32)
        locked = pinned and page_lock(crops) and page_lock(audio)
        buffers = InputBuffers(crops, audio, locked)
        self._sets[key] = buffers
        return buffers


_local = threading.local()


def thread_buffers() -> ThreadBuffers:
    """The calling thread's buffers (made on first use, freed with the thread)."""
    buffers: ThreadBuffers | None = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = ThreadBuffers()
    return buffers


# -- page-locked host memory ---------------------------------------------------------------

_cudart_lock = threading.Lock()
_cudart: ctypes.CDLL | None = None
_cudart_tried = False
_cudart_failed_logged = False
_CUDART_NAMES = ("libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


def _load_cudart() -> ctypes.CDLL | None:
    """The CUDA runtime onnxruntime-gpu uses, or None on a machine without one."""
    global _cudart, _cudart_tried
    with _cudart_lock:
        if not _cudart_tried:
            _cudart_tried = True
            names = [*_CUDART_NAMES, ctypes.util.find_library("cudart")]
            for name in filter(None, names):
                try:
                    _cudart = ctypes.CDLL(name)
                    break
                except OSError:
                    continue
            if _cudart is None:
                logger.info("no CUDA runtime library found: host buffers stay pageable")
        return _cudart


def page_lock(array: np.ndarray) -> bool:
    """Register ``array``'s memory with CUDA as page-locked; False where CUDA is absent.

    Unregistered when the array is freed. Failing to lock is never an error: copies from
    pageable memory work, only slower.
    """
    cudart = _load_cudart()
    if cudart is None or array.nbytes == 0:
        return False
    pointer = ctypes.c_void_p(array.ctypes.data)
    status = cudart.cudaHostRegister(pointer, ctypes.c_size_t(array.nbytes), ctypes.c_uint(0))
    if status != 0:
        logger.warning(
            "cudaHostRegister failed (CUDA error %d): host buffers stay pageable", status
        )
        return False
    weakref.finalize(array, cudart.cudaHostUnregister, pointer)
    return True
