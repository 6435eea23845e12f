"""Byte-bounded LRU of background frames, and lazy per-avatar frame loading."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from pathlib import Path

import cv2
import numpy as np
import pytest

from compositor.background_cache import AvatarFrames, BackgroundCache
from compositor.exceptions import FrameLoadError
from compositor.yuv import bgr_to_i420, frame_size


class CountingLoader:
    """Makes loaders that return ``size`` bytes filled with the key, and counts calls."""

    def __init__(self, size: int | Callable[[int], int] = 100) -> None:
        self._size = size
        self.calls: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, key: int) -> Callable[[], np.ndarray]:
        def load() -> np.ndarray:
            with self._lock:
                self.calls.append(key)
            size = self._size(key) if callable(self._size) else self._size
            return np.full(size, key % 256, dtype=np.uint8)

        return load


def test_bytes_never_exceed_bound_over_random_accesses() -> None:
    cache = BackgroundCache(max_bytes=1000)
    loader = CountingLoader(size=lambda key: 50 + 37 * key)  # 50 … 753 bytes
    rng = np.random.default_rng(0)
    for key in rng.integers(0, 20, 2000):
        frame = cache.get(int(key), loader(int(key)))
        assert frame.nbytes == 50 + 37 * int(key)
        assert frame[0] == key
        stats = cache.stats()
        assert stats.bytes <= 1000
    stats = cache.stats()
    assert stats.hits + stats.misses == 2000
    assert stats.misses == len(loader.calls)
    assert stats.evictions > 0


def test_counts_are_exact_for_a_scripted_sequence() -> None:
    cache = BackgroundCache(max_bytes=200)  # two 100-byte frames fit
    loader = CountingLoader()
    for key in [1, 2, 1, 3, 2, 1, 1]:
        cache.get(key, loader(key))
    # 1 miss, 2 miss, 1 hit, 3 miss (evicts 2), 2 miss (evicts 1), 1 miss (evicts 3), 1 hit
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions) == (2, 5, 3)
    assert (stats.entries, stats.bytes, stats.max_bytes) == (2, 200, 200)
    assert loader.calls == [1, 2, 3, 2, 1]
    assert stats.hit_rate == pytest.approx(2 / 7)


def test_recently_used_entry_survives_eviction() -> None:
    cache = BackgroundCache(max_bytes=300)
    loader = CountingLoader()
    for key in [1, 2, 3]:
        cache.get(key, loader(key))
    cache.get(1, loader(1))  # 1 becomes most recent; 2 is now the oldest
    cache.get(4, loader(4))  # evicts 2
    loader.calls.clear()
    for key in [1, 3, 4]:
        cache.get(key, loader(key))
    assert loader.calls == []
    cache.get(2, loader(2))
    assert loader.calls == [2]


def test_oversize_item_is_returned_but_not_kept() -> None:
    cache = BackgroundCache(max_bytes=100)
    loader = CountingLoader()
    cache.get(1, loader(1))
    big = cache.get(9, CountingLoader(size=101)(9))
    assert big.nbytes == 101
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.evictions) == (1, 100, 0)
    cache.get(1, loader(1))
    assert cache.stats().hits == 1  # the small entry was not pushed out


def test_cached_frames_are_read_only() -> None:
    cache = BackgroundCache(max_bytes=1000)
    frame = cache.get("k", CountingLoader()(5))
    assert not frame.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        frame[0] = 1
    assert not cache.get("k", CountingLoader()(5)).flags.writeable


def test_evict_where_drops_matching_keys_and_clear_drops_all() -> None:
    cache = BackgroundCache(max_bytes=10_000)
    loader = CountingLoader()
    for avatar in ["a", "b"]:
        for i in range(3):
            cache.get((avatar, i), loader(i))
    assert cache.evict_where(lambda key: isinstance(key, tuple) and key[0] == "a") == 3
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.evictions) == (3, 300, 0)
    cache.get(("b", 0), loader(0))
    assert cache.stats().hits == 1
    cache.clear()
    assert (cache.stats().entries, cache.stats().bytes) == (0, 0)


def test_preload_fills_without_counting_gets() -> None:
    cache = BackgroundCache(max_bytes=10_000)
    loader = CountingLoader()
    items: list[tuple[Hashable, Callable[[], np.ndarray]]] = [(i, loader(i)) for i in range(4)]
    cache.preload(items)
    cache.preload(items)  # already cached: not loaded again
    assert loader.calls == [0, 1, 2, 3]
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (0, 0, 4)
    cache.get(2, loader(2))
    assert cache.stats().hits == 1


def test_concurrent_gets_keep_the_bound_and_exact_counts() -> None:
    cache = BackgroundCache(max_bytes=1000)
    loader = CountingLoader()
    per_thread = 400
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for key in rng.integers(0, 16, per_thread):
            frame = cache.get(int(key), loader(int(key)))
            if frame[0] != key or frame.nbytes != 100:
                errors.append(f"key {key} got wrong frame")
            if cache.stats().bytes > 1000:
                errors.append("byte bound exceeded")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = cache.stats()
    assert stats.hits + stats.misses == 8 * per_thread
    assert stats.misses == len(loader.calls)
    assert stats.bytes == 100 * stats.entries <= 1000


def _write_frames(folder: Path, colours: list[tuple[int, int, int]], w: int, h: int) -> list[Path]:
    paths = []
    for i, colour in enumerate(colours):
        path = folder / f"{i:05d}.jpg"
        image = np.zeros((h, w, 3), dtype=np.uint8)
        image[...] = colour
        assert cv2.imwrite(str(path), image)
        paths.append(path)
    return paths


def test_avatar_frames_load_jpegs_lazily_as_i420(tmp_path: Path) -> None:
    colours = [(30, 60, 200), (200, 100, 20), (90, 200, 90)]
    paths = _write_frames(tmp_path, colours, 64, 48)
    cache = BackgroundCache(max_bytes=10 * 64 * 72)
    frames = AvatarFrames("alice", paths, cache)
    assert len(frames) == 3
    assert cache.stats().misses == 0  # nothing read until asked
    assert frames.size == (64, 48)
    assert frames.size == (64, 48)  # remembered: no second cache access
    for i, colour in enumerate(colours):
        frame = frames.get(i)
        assert frame_size(frame) == (64, 48)
        expected = bgr_to_i420(np.full((48, 64, 3), colour, dtype=np.uint8))
        assert np.abs(frame.astype(int) - expected.astype(int)).max() <= 3
        crop = frames.crop_bgr(i, (8, 8, 24, 40))
        assert crop.shape == (32, 16, 3)
        assert np.abs(crop.astype(int) - np.array(colour)).max() <= 4
    stats = cache.stats()
    assert stats.misses == 3  # frame 0 was loaded once, by .size
    assert stats.hits == 4
    assert frames.evict() == 3
    assert cache.stats().entries == 0


def test_avatar_frames_missing_file_names_the_path(tmp_path: Path) -> None:
    paths = _write_frames(tmp_path, [(1, 2, 3)], 16, 16)
    missing = tmp_path / "00001.jpg"
    frames = AvatarFrames("bob", [*paths, missing], BackgroundCache(max_bytes=10_000))
    frames.get(0)
    with pytest.raises(FrameLoadError, match=r"00001\.jpg"):
        frames.get(1)


def test_avatar_frames_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.jpg"
    path.write_bytes(b"not a jpeg at all")
    cache = BackgroundCache(max_bytes=10_000)
    frames = AvatarFrames("bob", [path], cache)
    with pytest.raises(FrameLoadError, match=r"broken\.jpg"):
        frames.get(0)
    assert cache.stats().entries == 0  # a failed load caches nothing


def test_avatar_frames_odd_size_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "odd.png"
    assert cv2.imwrite(str(path), np.zeros((15, 16, 3), dtype=np.uint8))
    frames = AvatarFrames("carol", [path], BackgroundCache(max_bytes=10_000))
    with pytest.raises(FrameLoadError, match="even"):
        frames.get(0)


def test_avatar_frames_index_out_of_range(tmp_path: Path) -> None:
    paths = _write_frames(tmp_path, [(1, 2, 3)], 16, 16)
    frames = AvatarFrames("dave", paths, BackgroundCache(max_bytes=10_000))
    with pytest.raises(IndexError, match="out of range"):
        frames.get(1)
