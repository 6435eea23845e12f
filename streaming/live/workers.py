"""The threads sessions hand their per-frame CPU work to, one wake-up each way.

Every live frame crosses from the event loop to a thread and back several times
(a 20 ms chunk's features and Opus packet, a frame's crop, its paste, its encode), so the
cost of one crossing is paid ≈6 times per frame per session. ``loop.run_in_executor``
pays it through a ``concurrent.futures.Future`` chained to an asyncio future: a lock and a
semaphore in ``submit``, two futures, their callbacks and state copies. Here the loop puts
(function, arguments, its own future) on a queue, and a worker resolves that future with
one ``call_soon_threadsafe``: one write to the loop's self-pipe, nothing else
(``docs/design/threads.md`` §7).

:class:`MediaWorkers` is also a :class:`concurrent.futures.Executor`, so code that only
needs an executor (``run_in_executor``, tests) can use it as one.

The queue needs no limit of its own: every job is awaited by the task that put it, and
each session has at most one timeline job, one video frame job and
``MAX_FRAMES_IN_FLIGHT`` compositing jobs out at a time, so what waits is bounded by the
sessions admission let in. The :class:`~streaming.live.manager.SessionManager` owns the
workers and shuts them down after its sessions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Offload(Protocol):
    """Runs a function off the event loop; what timelines, renderers and senders need."""

    def run(self, fn: Callable[..., T], /, *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on another thread; the loop's future for its result."""
        ...


_Job = tuple[
    Callable[..., Any],
    tuple[Any, ...],
    asyncio.AbstractEventLoop | None,
    "asyncio.Future[Any] | concurrent.futures.Future[Any]",
]


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():  # the awaiting task may have been cancelled meanwhile
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class MediaWorkers(concurrent.futures.Executor):
    """``threads`` threads, started at once, taking jobs from one queue in order."""

    def __init__(self, threads: int, name: str = "lipstream-compose") -> None:
        if threads < 1:
            raise ValueError(f"MediaWorkers needs at least one thread, got {threads}")
        self.threads = threads
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
            for i in range(threads)
        ]
        for worker in self._workers:
            worker.start()

    def run(self, fn: Callable[..., T], /, *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on a worker; await the returned future for its result."""
        if self._closed:
            raise RuntimeError("the media workers are shut down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((fn, args, loop, future))
        return future

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        if self._closed:
            raise RuntimeError("the media workers are shut down")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((functools.partial(fn, *args, **kwargs), (), None, future))
        return future

    def shutdown(
        self, wait: bool = True, *, cancel_futures: bool = False, timeout_s: float | None = None
    ) -> None:
        """Stop taking jobs; the workers finish those queued, then exit. With ``wait``,
        return once they have, or once ``timeout_s`` has passed, logging the threads
        still running then (daemon threads: they do not hold the process)."""
        if not self._closed:
            self._closed = True
            for _ in self._workers:
                self._queue.put(None)
        if not wait:
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for worker in self._workers:
            worker.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        running = [worker.name for worker in self._workers if worker.is_alive()]
        if running:
            logger.warning(
                "media workers still busy %.0f s after shutdown, abandoned: %s",
                timeout_s,
                running,
            )

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            fn, args, loop, future = job
            if loop is None:
                assert isinstance(future, concurrent.futures.Future)
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args))
                    except BaseException as exc:  # handed to whoever awaits it
                        future.set_exception(exc)
                continue
            assert isinstance(future, asyncio.Future)
            if future.cancelled():  # a plain read; at worst a cancelled job still runs
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to whoever awaits it
                self._hand_back(loop, _fail, future, exc)
            else:
                self._hand_back(loop, _resolve, future, result)

    @staticmethod
    def _hand_back(
        loop: asyncio.AbstractEventLoop,
        callback: Callable[[asyncio.Future[Any], Any], None],
        future: asyncio.Future[Any],
        value: Any,
    ) -> None:
        try:
            loop.call_soon_threadsafe(callback, future, value)
        except RuntimeError:  # the loop closed while the job ran: nobody awaits it
            logger.debug("a media job finished after its event loop closed")
