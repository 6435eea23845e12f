"""Lazy, byte-bounded LRU cache of avatar background frames (``docs/design/compositing.md`` §5).

Frames are loaded on first use and kept as I420 (1.5 B/px), so a 720p frame costs
1.38 MB. The cache is shared by every session and touched from executor threads, so it
is thread-safe; loads run outside the lock so one slow disk read never stalls other
sessions' hits.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import cv2
import numpy as np
import numpy.typing as npt

from compositor.exceptions import FrameLoadError
from compositor.yuv import Frame, Rect, bgr_to_i420, crop_bgr, frame_size

logger = logging.getLogger(__name__)

Loader = Callable[[], Frame]


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a :class:`BackgroundCache`'s counters.

    ``evictions`` counts entries dropped to respect ``max_bytes``; explicit removals
    (``evict_where``, ``clear``) are not counted.
    """

    hits: int
    misses: int
    evictions: int
    bytes: int
    entries: int
    max_bytes: int

    @property
    def hit_rate(self) -> float:
        """Fraction of ``get`` calls served from memory (0.0 before any call)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class BackgroundCache:
    """Thread-safe LRU of frames bounded by total ``nbytes``.

    Cached arrays are made read-only: they are shared between sessions, so a caller
    that composes into a frame must copy it first.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, Frame] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    def get(self, key: Hashable, load: Loader) -> Frame:
        """Return the frame for ``key``, calling ``load()`` on a miss.

        ``load`` runs outside the lock; if two threads miss the same key at once both
        load it, both count a miss, and the first stored copy wins. An item larger than
        ``max_bytes`` is returned but not kept.
        """
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return cached
            self._misses += 1
        return self._load_and_store(key, load)

    def preload(self, items: Iterable[tuple[Hashable, Loader]]) -> None:
        """Load ``items`` that are not cached yet, without touching hit/miss counts.

        Loading more than ``max_bytes`` evicts the earliest preloaded entries.
        """
        for key, load in items:
            with self._lock:
                if key in self._entries:
                    continue
            self._load_and_store(key, load)

    def evict_where(self, predicate: Callable[[Hashable], bool]) -> int:
        """Drop every entry whose key satisfies ``predicate``; returns how many."""
        with self._lock:
            doomed = [key for key in self._entries if predicate(key)]
            for key in doomed:
                self._bytes -= self._entries.pop(key).nbytes
        if doomed:
            logger.debug("dropped %d cached frames", len(doomed))
        return len(doomed)

    def clear(self) -> None:
        """Drop all entries; counters are kept."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        """Return a consistent snapshot of the counters."""
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                bytes=self._bytes,
                entries=len(self._entries),
                max_bytes=self._max_bytes,
            )

    def _load_and_store(self, key: Hashable, load: Loader) -> Frame:
        frame = load()
        if not isinstance(frame, np.ndarray):
            raise TypeError(f"loader for {key!r} returned {type(frame).__name__}, not an ndarray")
        frame.flags.writeable = False
        size = frame.nbytes
        if size > self._max_bytes:
            logger.warning(
                "frame %r is %d bytes, more than the cache's %d; not cached",
                key,
                size,
                self._max_bytes,
            )
            return frame
        with self._lock:
            existing = self._entries.get(key)
            if existing is not None:
                # Another thread loaded it meanwhile; keep one copy so memory stays bounded.
                self._entries.move_to_end(key)
                return existing
            self._entries[key] = frame
            self._bytes += size
            while self._bytes > self._max_bytes:
                _, old = self._entries.popitem(last=False)
                self._bytes -= old.nbytes
                self._evictions += 1
        return frame


class AvatarFrames:
    """One avatar's background frames, loaded lazily through a shared cache.

    Keys in the cache are ``(avatar_id, i)``, so ``cache.evict_where`` can drop one
    avatar's frames when it is unloaded.
    """

    def __init__(self, avatar_id: str, paths: Sequence[Path], cache: BackgroundCache) -> None:
        if not paths:
            raise ValueError(f"avatar {avatar_id!r} has no background frames")
        self.avatar_id = avatar_id
        self._paths = tuple(Path(p) for p in paths)
        self._cache = cache
        self._size: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self._paths)

    def get(self, i: int) -> Frame:
        """Return frame ``i`` as a read-only I420 array (loaded on first use).

        Raises :class:`FrameLoadError` if the file is missing, unreadable or has an odd size.
        """
        if not 0 <= i < len(self._paths):
            raise IndexError(
                f"frame {i} out of range for avatar {self.avatar_id!r} "
                f"with {len(self._paths)} frames"
            )
        path = self._paths[i]
        return self._cache.get((self.avatar_id, i), lambda: _load_i420(path))

    def crop_bgr(self, i: int, rect: Rect) -> npt.NDArray[np.uint8]:
        """Return ``rect`` of frame ``i`` as BGR (only that region is converted)."""
        return crop_bgr(self.get(i), rect)

    @property
    def size(self) -> tuple[int, int]:
        """``(w, h)`` of the avatar's frames, read from the first frame once."""
        if self._size is None:
            self._size = frame_size(self.get(0))
        return self._size

    @property
    def source(self) -> str:
        """Names these frames as they are on disk now: their folder, count, and the first
        and last file's size and modification time (a re-imported avatar differs)."""
        ends = [self._paths[0], self._paths[-1]]
        stamps = []
        for path in ends:
            try:
                stat = path.stat()
                stamps.append(f"{stat.st_size}:{stat.st_mtime_ns}")
            except OSError:
                stamps.append("missing")
        return f"{self._paths[0].parent}|{len(self._paths)}|{'|'.join(stamps)}"

    def evict(self) -> int:
        """Drop this avatar's frames from the shared cache; returns how many were cached."""
        avatar_id = self.avatar_id
        return self._cache.evict_where(
            lambda key: isinstance(key, tuple) and len(key) == 2 and key[0] == avatar_id
        )


def _load_i420(path: Path) -> Frame:
    if not path.is_file():
        raise FrameLoadError(f"background frame {path} does not exist or is not a file")
    bgr = cast(npt.NDArray[np.uint8] | None, cv2.imread(str(path), cv2.IMREAD_COLOR))
    if bgr is None:
        raise FrameLoadError(f"background frame {path} is not a readable JPEG/PNG image")
    h, w = bgr.shape[:2]
    if w % 2 or h % 2:
        raise FrameLoadError(
            f"background frame {path} is {w}x{h}; frames must have even width and height "
            "for yuv420p (re-export the avatar video at an even size)"
        )
    return bgr_to_i420(bgr)
