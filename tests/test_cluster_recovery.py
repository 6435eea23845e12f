"""A front whose Ray runtime dies, on a runtime that pretends (no Ray): what it does for each
way it reached Ray, what ``/ready`` and ``/health`` say meanwhile, and that the serve loop
exits non-zero once the front gives up (``docs/design/cluster.md`` §14). The real thing, a
``lipstream serve --workers 2`` whose raylet is killed, is ``tests/test_cluster_runtime.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection

from config.settings import Settings
from tests.fake_ray import FakeRuntime
from tests.live_calls import until
from tests.server_process import free_port
from web.app_keys import LIVENESS
from web.cluster.app import build_front_app
from web.cluster.front import ClusterFront, Recovery
from web.cluster.runtime import RuntimeMode
from web.edge import edge_app
from web.serve import EXIT_FAILED, Drain, run_server

QUICK = Recovery(
    probe_interval_s=0.01,
    probe_timeout_s=1.0,
    restart_attempts=3,
    restart_timeout_s=5.0,
    backoff_first_s=0.01,
    backoff_max_s=0.04,
)


def _settings() -> Settings:
    return Settings.model_validate({"cluster": {"workers": 2, "report_interval_s": 0.05}})


@dataclass
class Started:
    front: ClusterFront
    runtime: FakeRuntime
    given_up: list[str]


async def _front(mode: RuntimeMode, **runtime: Any) -> Started:
    fake = FakeRuntime(mode, **runtime)
    front = ClusterFront(_settings(), runtime=fake, recovery=QUICK)
    given_up: list[str] = []
    await front.start(give_up=given_up.append)
    assert all(w.answering for w in front.workers.values())
    return Started(front, fake, given_up)


def _all_back(front: ClusterFront, incarnation: str) -> bool:
    return front.problem is None and all(
        w.answering and w.report is not None and w.report.incarnation == incarnation
        for w in front.workers.values()
    )


async def test_a_runtime_the_front_started_is_restarted_with_its_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="web.cluster.front")
    started = await _front(RuntimeMode.STARTED)
    front, runtime = started.front, started.runtime
    try:
        runtime.hold = asyncio.Event()
        runtime.dead = "the raylet exited"
        problem = await until(lambda: front.problem, "the front to see its runtime die")
        assert "the raylet exited" in problem
        assert "restarting it with its workers (attempt 1)" in problem
        assert not any(w.usable for w in front.workers.values())  # offers get 503 meanwhile
        runtime.hold.set()
        await until(lambda: _all_back(front, "i1"), "the workers of the new runtime")
        assert runtime.reconnects == 1
        # Each worker is a new incarnation: its calls were lost, and that is counted.
        assert [w.restarts for w in front.workers.values()] == [1, 1]
        assert started.given_up == []
        assert "is back after 1 attempts; 2 of 2 workers up" in caplog.text
    finally:
        await front.close()
    assert runtime.closed


async def test_a_probe_that_fails_counts_as_a_dead_runtime() -> None:
    started = await _front(RuntimeMode.STARTED)
    try:
        started.runtime.probe_error = RuntimeError("GCS client disconnected")
        await until(lambda: started.runtime.reconnects == 1, "the front to restart Ray")
        await until(lambda: _all_back(started.front, "i1"), "the workers of the new runtime")
        assert started.given_up == []
    finally:
        await started.front.close()


async def test_a_started_runtime_that_will_not_come_back_makes_the_front_give_up() -> None:
    started = await _front(RuntimeMode.STARTED, failing_reconnects=10)
    try:
        started.runtime.dead = "the raylet exited"
        (reason,) = await until(lambda: started.given_up, "the front to give up")
        assert started.runtime.reconnects == QUICK.restart_attempts
        assert "3 restarts failed" in reason
        assert "nothing listens there yet" in reason
        assert started.front.problem == reason
    finally:
        await started.front.close()


async def test_a_started_runtime_whose_gcs_is_gone_makes_the_front_give_up_at_once() -> None:
    started = await _front(RuntimeMode.STARTED)
    try:
        started.runtime.gcs_gone = True
        (reason,) = await until(lambda: started.given_up, "the front to give up")
        assert "did not answer" in reason
        assert started.runtime.reconnects == 0  # Ray would end the process anyway
    finally:
        await started.front.close()


async def test_a_joined_cluster_is_reconnected_to_with_backoff_for_as_long_as_it_takes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = await _front(RuntimeMode.JOINED, failing_reconnects=5)
    front, runtime = started.front, started.runtime
    try:
        runtime.dead = "its node died"
        await until(lambda: _all_back(front, "i1"), "the front to reconnect", timeout_s=30)
        assert runtime.reconnects == 6  # past restart_attempts: a joined cluster is waited for
        assert started.given_up == []
        assert "attempt 5 to bring back the fake runtime failed" in caplog.text
        assert "reconnecting with its workers (attempt 6)" in caplog.text
    finally:
        await front.close()


async def test_a_joined_cluster_whose_gcs_is_silent_is_waited_for() -> None:
    started = await _front(RuntimeMode.JOINED)
    front, runtime = started.front, started.runtime
    try:
        runtime.gcs_gone = True
        problem = await until(lambda: front.problem, "the front to say the GCS is silent")
        assert "waiting for it" in problem
        runtime.gcs_gone = False
        await until(lambda: front.problem is None, "the front to see it answer again")
        assert started.given_up == []
        assert runtime.reconnects == 0
    finally:
        await front.close()


async def test_a_given_runtime_is_left_to_its_owner() -> None:
    started = await _front(RuntimeMode.GIVEN)
    try:
        started.runtime.dead = "the test removed the node"
        problem = await until(lambda: started.front.problem, "the front to see it die")
        assert "must restart it" in problem
        assert started.runtime.reconnects == 0
        assert started.given_up == []
    finally:
        await started.front.close()


async def _real_offer() -> str:
    """An aiortc caller's offer (audio both ways, video to receive): the offer check
    passes it."""
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp: str = pc.localDescription.sdp
        return sdp
    finally:
        await pc.close()


def test_backoff_doubles_up_to_its_most() -> None:
    recovery = Recovery(backoff_first_s=1.0, backoff_max_s=30.0)
    assert [recovery.backoff_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


async def test_ready_names_the_problem_and_health_fails_once_the_front_gives_up() -> None:
    runtime = FakeRuntime(RuntimeMode.STARTED, failing_reconnects=10)
    front = ClusterFront(_settings(), runtime=runtime, recovery=QUICK)
    app = build_front_app(_settings(), front=front)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        assert (await client.get("/health")).status == 200
        ready = await client.get("/ready")
        assert ready.status == 200, await ready.text()
        runtime.dead = "the raylet exited"
        await until(lambda: app[LIVENESS].failure, "the front to give up")
        health = await client.get("/health")
        assert health.status == 503
        error = (await health.json())["error"]
        assert error["code"] == "server_failed"
        assert "the raylet exited" in error["message"]
        ready = await client.get("/ready")
        assert ready.status == 503
        reasons = (await ready.json())["reasons"]
        assert any("restarts failed" in reason for reason in reasons), reasons
        # A valid offer passes the gate and reaches placement, which finds no worker:
        # none is tried (a forward to a dead one would name it as not answering).
        errors_before = {name: w.last_error for name, w in front.workers.items()}
        offer = await client.post("/offer", json={"sdp": await _real_offer(), "type": "offer"})
        assert offer.status == 503, await offer.text()
        assert offer.headers["Retry-After"] == "5"
        error = (await offer.json())["error"]
        assert error["code"] == "too_many_sessions"
        assert "0 of 2 workers answering" in error["message"]
        assert "did not answer" not in error["message"]
        assert {name: w.last_error for name, w in front.workers.items()} == errors_before


async def test_the_serve_loop_exits_non_zero_when_the_app_gives_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings.model_validate({"server": {"port": free_port()}})
    app = edge_app(settings)

    async def fails_once_serving(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(asyncio.sleep(0.05), name="test-fail-soon")
        task.add_done_callback(lambda _: app[LIVENESS].fail("the test pulled the plug"))
        yield
        await task

    app.cleanup_ctx.append(fails_once_serving)

    async def nothing_to_drain(app: web.Application, timeout_s: float) -> bool:
        return True

    drain = Drain(wait=nothing_to_drain, live=lambda app: "nothing")
    with caplog.at_level(logging.INFO, logger="web.serve"):
        status = await asyncio.wait_for(
            run_server(app, settings.server, drain, name="test server"), 30
        )
    assert status == EXIT_FAILED
    assert "test server stopping: the test pulled the plug" in caplog.text
    assert "draining" not in caplog.text  # nothing left to save: it stops at once
