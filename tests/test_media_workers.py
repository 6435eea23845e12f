"""MediaWorkers: the loop's one-wake-up hand-off of per-frame work to threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from streaming.live.workers import MediaWorkers


@pytest.fixture
def workers() -> MediaWorkers:
    return MediaWorkers(2, name="test-media")


async def test_a_job_runs_on_a_worker_and_its_result_reaches_the_loop(
    workers: MediaWorkers,
) -> None:
    try:
        names = await asyncio.gather(
            *(workers.run(lambda: threading.current_thread().name) for _ in range(10))
        )
        assert set(names) <= {"test-media_0", "test-media_1"}
        assert await workers.run(pow, 3, 4) == 81
    finally:
        workers.shutdown()


async def test_an_exception_reaches_whoever_awaits_the_job(workers: MediaWorkers) -> None:
    try:
        with pytest.raises(ZeroDivisionError):
            await workers.run(lambda: 1 / 0)
        assert await workers.run(len, "still working") == 13  # the worker survived
    finally:
        workers.shutdown()


async def test_a_cancelled_wait_leaves_the_workers_serving(workers: MediaWorkers) -> None:
    gate = threading.Event()
    try:
        blocked = [workers.run(gate.wait) for _ in range(2)]  # both threads busy
        waiting = workers.run(len, "abc")  # queued behind them
        waiting.cancel()
        gate.set()
        assert await asyncio.gather(*blocked) == [True, True]
        assert await workers.run(len, "abcd") == 4
        assert waiting.cancelled()
    finally:
        workers.shutdown()


async def test_it_is_an_executor_too(workers: MediaWorkers) -> None:
    loop = asyncio.get_running_loop()
    try:
        assert await loop.run_in_executor(workers, sorted, [3, 1, 2]) == [1, 2, 3]
        assert workers.submit(max, 4, 9).result(timeout=10) == 9
    finally:
        workers.shutdown()


async def test_shutdown_finishes_queued_jobs_then_refuses_new_ones() -> None:
    workers = MediaWorkers(1)
    done: list[int] = []
    futures = [workers.submit(done.append, i) for i in range(5)]
    workers.shutdown(wait=True)
    assert done == [0, 1, 2, 3, 4]
    assert all(f.done() for f in futures)
    with pytest.raises(RuntimeError, match="shut down"):
        workers.run(len, "x")
    with pytest.raises(RuntimeError, match="shut down"):
        workers.submit(len, "x")


def test_it_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        MediaWorkers(0)
