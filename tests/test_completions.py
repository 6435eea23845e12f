"""How finished frames reach their event loops: one wake-up per batch, none more while
the loop is busy, outputs and errors in order, and expired frames failed together.

Hand-offs are counted by wrapping the running loop's ``call_soon_threadsafe``: each call
is one write to the loop's self-pipe, the wake-up these tests are about.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np
import pytest

from inference_core.exceptions import DeadlineExceededError, InferenceError
from inference_core.serving.frame_request import FrameRequest, complete_batch, deliver
from inference_core.serving.scheduler import DeviceScheduler

FAR = 1_000.0


def request(loop: asyncio.AbstractEventLoop, deadline: float = FAR) -> FrameRequest:
    return FrameRequest(
        model_id="m",
        visual=np.zeros(1, dtype=np.uint8),
        audio=np.zeros(1, dtype=np.float32),
        deadline=deadline,
        future=loop.create_future(),
        loop=loop,
    )


@pytest.fixture
async def handoffs() -> AsyncIterator[list[Callable[..., Any]]]:
    """The inference core's hand-offs of finished frames to the running loop, as made."""
    loop = asyncio.get_running_loop()
    calls: list[Callable[..., Any]] = []
    original = loop.call_soon_threadsafe

    def counting(callback: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Handle:
        if not callback.__module__.startswith("asyncio."):  # not asyncio's own hand-offs
            calls.append(callback)
        return original(callback, *args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
    yield calls
    del loop.call_soon_threadsafe  # the instance attribute: the class's method again


def in_thread(work: Callable[[], None]) -> None:
    """Run ``work`` on another thread and wait for it, holding the calling loop meanwhile."""
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def outputs(first: int, count: int) -> list[np.ndarray]:
    return [np.full(1, value) for value in range(first, first + count)]


async def values(requests: Sequence[FrameRequest]) -> list[int | str]:
    done = await asyncio.gather(*(r.future for r in requests), return_exceptions=True)
    return [type(d).__name__ if isinstance(d, BaseException) else int(d[0]) for d in done]


async def test_a_batch_wakes_its_loop_once(handoffs: list[Callable[..., Any]]) -> None:
    loop = asyncio.get_running_loop()
    for batch in range(3):
        requests = [request(loop) for _ in range(4)]
        in_thread(functools.partial(complete_batch, requests, outputs(4 * batch, 4)))
        assert await values(requests) == list(range(4 * batch, 4 * batch + 4))
    assert len(handoffs) == 3  # one per batch, not one per frame


async def test_completions_while_the_loop_is_busy_are_taken_in_one_go(
    handoffs: list[Callable[..., Any]],
) -> None:
    loop = asyncio.get_running_loop()
    requests = [request(loop) for _ in range(12)]

    def worker() -> None:  # three batches and a failed one, while the loop is held
        for start in (0, 4):
            complete_batch(requests[start : start + 4], outputs(start, 4))
        complete_batch(requests[8:10], None, InferenceError("the model failed"))
        complete_batch(requests[10:], outputs(10, 2))

    in_thread(worker)

    assert await values(requests) == [*range(8), "InferenceError", "InferenceError", 10, 11]
    assert len(handoffs) == 1


async def test_a_cancelled_frame_is_skipped_and_the_rest_delivered() -> None:
    loop = asyncio.get_running_loop()
    requests = [request(loop) for _ in range(3)]
    requests[1].future.cancel()  # its session ended while the batch ran
    in_thread(lambda: complete_batch(requests, outputs(0, 3)))
    assert await values(requests) == [0, "CancelledError", 2]


async def test_frames_of_two_loops_each_reach_their_own() -> None:
    loop = asyncio.get_running_loop()
    other = asyncio.new_event_loop()
    try:
        mine, theirs = request(loop), request(other)
        in_thread(lambda: complete_batch([mine, theirs], outputs(0, 2)))
        assert await values([mine]) == [0]
        got: list[np.ndarray] = []
        in_thread(lambda: got.append(other.run_until_complete(theirs.future)))  # a loop apart
        assert int(got[0][0]) == 1
    finally:
        other.close()


async def test_a_closed_loop_costs_the_others_nothing() -> None:
    loop = asyncio.get_running_loop()
    closed = asyncio.new_event_loop()
    gone = request(closed)
    closed.close()
    alive = request(loop)
    in_thread(lambda: deliver([(gone, np.zeros(1), None), (alive, np.ones(1), None)]))
    assert await values([alive]) == [1]
    assert not gone.future.done()  # nobody waits on a closed loop


async def test_frames_expiring_together_fail_in_one_hand_off(
    handoffs: list[Callable[..., Any]],
) -> None:
    """An overload that expires many frames at once wakes the loop once for all of them."""
    loop = asyncio.get_running_loop()
    now = [100.0]
    scheduler = DeviceScheduler(
        "cpu:0", workers=1, queue_size=64, max_batch_size=4, max_wait_ms=0, clock=lambda: now[0]
    )
    gate, started = threading.Event(), threading.Event()

    class Runner:
        model_id, max_batch_size = "m", 4

        def run_batch(self, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
            started.set()
            gate.wait(10)
            return [r.visual for r in requests]

        def count_queue_wait(self, frames: int, seconds: float) -> None:
            pass  # waits are not what this test is about

    scheduler.start()
    try:
        blocker = request(loop)
        scheduler.submit(blocker, Runner())
        assert await asyncio.to_thread(started.wait, 10)
        doomed = [request(loop, deadline=now[0] + 0.5) for _ in range(20)]
        for frame in doomed:
            scheduler.submit(frame, Runner())
        now[0] += 1.0  # every one of them is late by the time the worker looks again
        gate.set()
        results = await values([blocker, *doomed])
    finally:
        await asyncio.to_thread(scheduler.stop)
    assert results == [0, *[DeadlineExceededError.__name__] * 20]
    assert scheduler.stats().expired == 20
    assert len(handoffs) <= 2  # the blocker's batch, then the twenty failures at most
