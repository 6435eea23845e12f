"""The encoded idle loops of a server, built in the background, bounded in bytes.

:meth:`IdleLoopCache.get` never waits: it returns a loop that is ready, or None and
queues its build, once however many calls ask (``docs/design/idle-loops.md`` §16). Builds run
one at a time on one thread of their own, at a lower CPU priority than the calls, so
building a loop takes CPU only when the calls leave some. Loops are kept least recently
used first out until they fit in ``max_bytes``; a call that holds an evicted loop keeps
sending it until it leaves it (its reference keeps the bytes alive that long). Used
from the event loop only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from streaming.idle_loops.loop import EncodedLoop, LoopKey, encode_loop

logger = logging.getLogger(__name__)

#: Builds queued at most; a call whose loop finds the queue full encodes its own frames.
MAX_QUEUED_BUILDS = 32
#: How much lower than the calls the builder thread runs (Linux per-thread nice).
BUILDER_NICE = 10

FrameSource = Callable[[int], np.ndarray]


@dataclass(frozen=True)
class IdleLoopStats:
    """The cache now, and since start-up."""

    bytes: int
    max_bytes: int
    loops: int
    building: int  # queued or being encoded
    built: int
    evicted: int
    failed: int
    hits: int
    misses: int


class IdleLoopCache:
    """Encoded idle loops by :class:`LoopKey`, at most ``max_bytes`` of payload. Each
    clip of an avatar is a loop of its own (its key holds the clip's frame range).

    ``max_bytes`` 0 builds nothing (every call encodes its own frames).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._loops: OrderedDict[LoopKey, EncodedLoop] = OrderedDict()
        self._bytes = 0
        self._builds: dict[LoopKey, asyncio.Task[None]] = {}
        self._refused: set[LoopKey] = set()  # too large, or failed: not built again
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._built = self._evicted = self._failed = self._hits = self._misses = 0

    def peek(self, key: LoopKey) -> EncodedLoop | None:
        """The loop for ``key`` if it is built (nothing queued, no use recorded)."""
        return self._loops.get(key)

    def get(self, key: LoopKey, frames: FrameSource) -> EncodedLoop | None:
        """The loop for ``key`` if it is built; else None, its build queued (from
        ``frames``, avatar frame by index) unless it is already."""
        loop = self._loops.get(key)
        if loop is not None:
            self._loops.move_to_end(key)
            self._hits += 1
            return loop
        self._misses += 1
        if self._may_build(key):
            self._builds[key] = asyncio.create_task(
                self._build(key, frames), name=f"lipstream-idle-loop-{key.avatar_id}"
            )
        return None

    def _may_build(self, key: LoopKey) -> bool:
        return (
            self.max_bytes > 0
            and key not in self._builds
            and key not in self._refused
            and len(self._builds) < MAX_QUEUED_BUILDS
        )

    def stats(self) -> IdleLoopStats:
        return IdleLoopStats(
            bytes=self._bytes,
            max_bytes=self.max_bytes,
            loops=len(self._loops),
            building=len(self._builds),
            built=self._built,
            evicted=self._evicted,
            failed=self._failed,
            hits=self._hits,
            misses=self._misses,
        )

    def evict_avatar(self, avatar_id: str) -> int:
        """Drop every loop of ``avatar_id`` (its frames changed or it was removed)."""
        gone = [key for key in self._loops if key.avatar_id == avatar_id]
        for key in gone:
            self._drop(key)
        self._refused = {key for key in self._refused if key.avatar_id != avatar_id}
        return len(gone)

    async def close(self) -> None:
        """Cancel the builds and stop the builder thread (a loop being encoded finishes
        its current frame's encode, not the loop)."""
        builds = list(self._builds.values())
        for task in builds:
            task.cancel()
        for task in builds:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._builds.clear()  # a build cancelled before it started never removed itself
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._loops.clear()
        self._bytes = 0

    async def _build(self, key: LoopKey, frames: FrameSource) -> None:
        cancelled = threading.Event()
        try:
            loop = await asyncio.get_running_loop().run_in_executor(
                self._builder(), _encode, key, frames, cancelled
            )
        except asyncio.CancelledError:
            cancelled.set()
            raise
        except Exception:
            self._failed += 1
            self._refused.add(key)
            logger.exception(
                "idle loop build failed: avatar=%s clip=%d:%s bitrate=%d; its calls encode "
                "their own idle frames",
                key.avatar_id,
                key.clip_start,
                key.clip_stop,
                key.bitrate,
            )
            return
        finally:
            self._builds.pop(key, None)
        self._keep(loop)

    def _keep(self, loop: EncodedLoop) -> None:
        key, size = loop.key, loop.nbytes
        if size > self.max_bytes:
            self._refused.add(key)
            logger.warning(
                "idle loop of avatar %s is %d bytes, more than cache.idle_loop_bytes (%d): "
                "not kept; its calls encode their own idle frames",
                key.avatar_id,
                size,
                self.max_bytes,
            )
            return
        while self._bytes + size > self.max_bytes and self._loops:
            self._drop(next(iter(self._loops)))
            self._evicted += 1
        self._loops[key] = loop
        self._bytes += size
        self._built += 1
        logger.info(
            "idle loop built: avatar=%s clip=%d:%s bitrate=%d frames=%d keyframes=%d bytes=%d "
            "preset=%s crf=%s",
            key.avatar_id,
            key.clip_start,
            key.clip_stop,
            key.bitrate,
            loop.length,
            len(loop.keyframes),
            size,
            loop.preset,
            loop.crf,
        )

    def _drop(self, key: LoopKey) -> None:
        loop = self._loops.pop(key)
        self._bytes -= loop.nbytes

    def _builder(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="lipstream-idle-loops",
                initializer=_lower_priority,
            )
        return self._pool


def _encode(key: LoopKey, frames: FrameSource, cancelled: threading.Event) -> EncodedLoop:
    def frame_at(index: int) -> np.ndarray:
        if cancelled.is_set():
            raise asyncio.CancelledError
        return frames(index)

    return encode_loop(key, frame_at)


def _lower_priority() -> None:
    """Run this thread ``BUILDER_NICE`` steps nicer than the calls (Linux: per thread)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BUILDER_NICE)
