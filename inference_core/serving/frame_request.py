"""One frame of work for a model, and the seam between the scheduler and a loaded model.

A :class:`FrameRequest` is created on the event loop, queued on a device, batched with
other requests for the same model (from any session) and completed from a worker
thread through ``loop.call_soon_threadsafe``: its future gets the output array or an
:class:`~inference_core.exceptions.InferenceError`.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        # A closed loop raises RuntimeError: nobody is waiting for the result any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._deliver, value, error)

    def _deliver(self, value: np.ndarray | None, error: BaseException | None) -> None:
        """On the request's loop: set the future, unless its owner cancelled it meanwhile."""
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            assert value is not None
            self.future.set_result(value)


def complete_batch(
    requests: Sequence[FrameRequest],
    outputs: Sequence[np.ndarray] | None,
    error: BaseException | None = None,
) -> None:
    """Complete a batch's requests (thread-safe): ``outputs`` in order, or all with ``error``.

    One hand-off per event loop, not one per frame: each ``call_soon_threadsafe`` wakes
    the loop through its self-pipe, and a batch's frames usually share one loop.
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[FrameRequest, np.ndarray | None]]] = {}
    for i, request in enumerate(requests):
        value = None if outputs is None else outputs[i]
        by_loop.setdefault(request.loop, []).append((request, value))
    for loop, items in by_loop.items():

        def deliver(items: list[tuple[FrameRequest, np.ndarray | None]] = items) -> None:
            for request, value in items:
                request._deliver(value, error)

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
            loop.call_soon_threadsafe(deliver)


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
