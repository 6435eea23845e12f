"""One frame of work for a model, and the seam between the scheduler and a loaded model.

A :class:`FrameRequest` is created on the event loop, queued on a device, batched with
other requests for the same model (from any session) and completed from a worker
thread: its future gets the output array or an
:class:`~inference_core.exceptions.InferenceError`.

Completions reach a loop through its outbox: a worker appends them and schedules one
``loop.call_soon_threadsafe`` to drain it, unless one is already waiting to run. Each such
call wakes the loop through its self-pipe (a system call on both sides), so a batch costs
the loop one wake-up, and batches (or expired frames) completing while the loop is busy
cost none more (``docs/design/serving.md`` §4).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(eq=False, slots=True)
class FrameRequest:
    """A frame for ``model_id``.

    ``visual`` is uint8 ``[6,S,S]`` (a session frame) or float32 ``[6,S,S]`` already
    scaled (raw API). ``raw`` asks for the float32 ``[3,S,S]`` model output instead of a
    uint8 BGR ``[S,S,3]`` face. ``deadline`` is on the ``time.monotonic()`` clock: a
    request still queued past it is dropped, never computed late. Its shapes were checked
    when it was submitted (:meth:`~inference_core.serving.handle.ModelHandle.submit`), so
    a worker copies it into the batch without looking again.
    """

    model_id: str
    visual: np.ndarray
    audio: np.ndarray
    deadline: float
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop
    session_id: str | None = None
    raw: bool = False

    def resolve(self, value: np.ndarray) -> None:
        """Complete the future with ``value`` (thread-safe; ignored if already done)."""
        self._complete(value, None)

    def fail(self, error: BaseException) -> None:
        """Complete the future with ``error`` (thread-safe; ignored if already done)."""
        self._complete(None, error)

    def _complete(self, value: np.ndarray | None, error: BaseException | None) -> None:
        _outbox(self.loop).post(self.loop, [(self, value, error)])

    def _deliver(self, value: np.ndarray | None, error: BaseException | None) -> None:
        """On the request's loop: set the future, unless its owner cancelled it meanwhile."""
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            assert value is not None
            self.future.set_result(value)


#: One completion: the request, its output or None, the error or None.
Delivery = tuple[FrameRequest, np.ndarray | None, BaseException | None]


def complete_batch(
    requests: Sequence[FrameRequest],
    outputs: Sequence[np.ndarray] | None,
    error: BaseException | None = None,
) -> None:
    """Complete a batch's requests (thread-safe): ``outputs`` in order, or all with ``error``."""
    if outputs is None:
        deliver([(request, None, error) for request in requests])
    else:
        pairs = zip(requests, outputs, strict=True)
        deliver([(request, output, None) for request, output in pairs])


def deliver(items: Sequence[Delivery]) -> None:
    """Hand ``(request, value, error)`` triples to their loops (thread-safe), in order.

    Through each loop's :class:`_Outbox`: one wake-up per loop for the batch, and none
    at all while an earlier hand-off to that loop is still waiting to run (a busy loop
    takes every completion queued meanwhile in one go).
    """
    if not items:
        return
    first = items[0][0].loop
    if all(item[0].loop is first for item in items):
        _outbox(first).post(first, items)
        return
    by_loop: dict[asyncio.AbstractEventLoop, list[Delivery]] = {}
    for item in items:
        by_loop.setdefault(item[0].loop, []).append(item)
    for loop, mine in by_loop.items():
        _outbox(loop).post(loop, mine)


class _Outbox:
    """Completions waiting for one event loop, and whether a hand-off to drain them is
    already scheduled there (then posting more costs no wake-up of the loop).

    No lock: a deque's append and popleft are atomic, a worker appends before it looks
    at the flag and the drain clears the flag before it takes, so a completion is
    either taken by a drain already under way or finds the flag clear and schedules one
    (two workers posting at once may both schedule: the second drain finds nothing).
    """

    __slots__ = ("_items", "_scheduled")

    def __init__(self) -> None:
        # No reference to the loop: the entry goes when the loop is collected.
        self._items: collections.deque[Delivery] = collections.deque()
        self._scheduled = False

    def post(self, loop: asyncio.AbstractEventLoop, items: Sequence[Delivery]) -> None:
        self._items.extend(items)
        if self._scheduled:
            return
        self._scheduled = True
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # a closed loop: nobody is waiting for these any more
            self._items.clear()
            self._scheduled = False

    def _drain(self) -> None:
        self._scheduled = False
        items = self._items
        while items:
            request, value, error = items.popleft()
            request._deliver(value, error)


# Keyed by the loop's id, each entry removed when its loop is collected: a lookup per
# batch is one dict get (a weak-keyed mapping would make a weak reference per lookup).
_outboxes: dict[int, _Outbox] = {}
_outboxes_lock = threading.Lock()


def _outbox(loop: asyncio.AbstractEventLoop) -> _Outbox:
    found = _outboxes.get(id(loop))
    if found is None:
        with _outboxes_lock:
            found = _outboxes.get(id(loop))
            if found is None:
                found = _outboxes[id(loop)] = _Outbox()
                weakref.finalize(loop, _outboxes.pop, id(loop), None)
    return found


class ModelRunner(Protocol):
    """What a device worker needs from a loaded model."""

    @property
    def model_id(self) -> str: ...

    @property
    def max_batch_size(self) -> int: ...

    def run_batch(self, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
        """Run ``requests`` (same model, ``len <= max_batch_size``) as one batch.

        Returns one output per request, in order: float32 ``[3,S,S]`` for raw requests,
        uint8 BGR ``[S,S,3]`` otherwise. Called from worker threads, concurrently.
        """
        ...

    def count_queue_wait(self, frames: int, seconds: float) -> None:
        """A batch of ``frames`` frames ran without an error, having waited ``seconds`` in
        all in the device's queue (Triton's ``queue`` statistic: each frame's own wait).

        Called from the worker thread that ran it, before the frames' results are handed
        back, so that a caller who has its answer finds its wait counted.
        """
        ...
