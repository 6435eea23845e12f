"""``lipstream serve --workers 2`` whose local Ray runtime is killed under it.

The front started the runtime; a part of it is killed by the name Ray gives its process.
The raylet (or the dashboard agent the raylet fate-shares with) takes the workers down
with it while the GCS lives on: the front must bring the runtime and its workers back.
The GCS itself leaves nothing to come back to: the front must then exit non-zero so that
a supervisor starts a fresh one. What it must never do is answer ``/health`` 200 for good
with nothing to serve (``docs/design/cluster.md`` §14, docs/operations/failure.md). The front's
policy on numbers is ``tests/test_cluster_recovery.py``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import ClientError, ClientSession

from tests.live_calls import TIMEOUT_S, until
from tests.server_process import Server, descendants, lipstream_serve
from tests.webrtc_client import Caller

logger = logging.getLogger(__name__)

pytestmark = pytest.mark.slow

#: Two workers start on a 2-core machine, each loading its inference core.
STARTUP_TIMEOUT_S = 180.0
#: Death seen (a killed raylet misses its health checks for about 15 s), Ray started
#: again, two workers started again: generous, for a loaded machine.
RECOVERY_TIMEOUT_S = 300.0


async def _worker_pids(http: ClientSession) -> set[int]:
    """The process ids of the workers that answer (the admin API: loopback needs no token)."""
    async with http.get("/admin/workers") as response:
        workers = (await response.json())["workers"]
    return {w["report"]["pid"] for w in workers if w["answering"] and w["report"]}


async def _two_workers_ready(http: ClientSession) -> bool:
    try:
        async with http.get("/ready") as response:
            body = await response.json()
            return response.status == 200 and body["workers"] == {"up": 2, "total": 2}
    except ClientError:
        return False


async def _serving_two_workers(server: Server) -> set[int]:
    """Once both workers report: their process ids, each a process of the front's runtime."""
    http = server.http
    await until(lambda: _two_workers_ready(http), "both workers to report", timeout_s=TIMEOUT_S)
    workers = await _worker_pids(http)
    ray = descendants(server.proc.pid)
    assert workers <= set(ray), (workers, ray)  # the workers run under the front's runtime
    return workers


def _back_or_gone(server: Server, lost: set[int]) -> Callable[[], object]:
    """'exited' once the process ended; 'recovered' once both workers answer from new
    processes (none of ``lost``) and the front is ready; else None."""

    async def state() -> str | None:
        if server.proc.returncode is not None:
            return "exited"
        try:
            if not await _two_workers_ready(server.http):
                return None
            pids = await _worker_pids(server.http)
        except ClientError:
            return None
        return "recovered" if len(pids) == 2 and not pids & lost else None

    return state


SETTINGS = {"ice_loopback_only": "true", "drain_timeout_s": 5}


def _kill(server: Server, name: str) -> None:
    """SIGKILL the process of the front's runtime that the kernel names ``name``."""
    ray = descendants(server.proc.pid)
    (target,) = [pid for pid, its_name in ray.items() if its_name == name]
    os.kill(target, signal.SIGKILL)


async def test_a_front_whose_raylet_is_killed_brings_its_runtime_and_workers_back(
    tmp_path: Path, loopback: None, record_property: Callable[[str, object], None]
) -> None:
    """Only the raylet's side dies, twice in one front: the raylet (the front's child),
    then in the runtime that came back the dashboard agent (the raylet's, which it
    fate-shares with). The GCS answers on, so each restart can succeed and must: an exit
    fails. One front for both kills: the second is a runtime the front restarted."""
    async with lipstream_serve(
        tmp_path, "--workers", "2", server=SETTINGS, startup_timeout_s=STARTUP_TIMEOUT_S
    ) as server:
        http = server.http
        for times, victim in enumerate(("raylet", "ray::DashboardA"), start=1):
            lost = await _serving_two_workers(server)
            caller = Caller(http)
            caller.keep_luma = False
            await caller.connect()
            try:
                await caller.wait_for_frames(5)
                _kill(server, victim)
                killed_at = time.monotonic()
                outcome = await until(
                    _back_or_gone(server, lost),
                    f"the front to bring its workers back or to exit ({victim} killed)",
                    timeout_s=RECOVERY_TIMEOUT_S,
                    poll_s=0.5,
                )
                took_s = time.monotonic() - killed_at
            finally:
                await caller.close()
            record_property(f"took_s_{victim}", round(took_s, 1))
            logger.info("killed %s: %s after %.1f s", victim, outcome, took_s)
            assert outcome == "recovered", (victim, server.log())
            assert server.log().count("is back after") == times, server.log()
            # The call on a dead worker ended with it: its id names the old incarnation.
            async with http.get(f"/sessions/{caller.session_id}") as gone:
                assert gone.status == 410, await gone.text()
                assert (await gone.json())["error"]["code"] == "session_lost"
            # The workers of the new runtime take a new call.
            again = Caller(http)
            again.keep_luma = False
            await again.connect()
            try:
                await again.wait_for_frames(10)
            finally:
                await again.hang_up()
        # And the restarted runtime stops as the first would: drained, then exit 0.
        server.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT_S):
            code = await server.proc.wait()
        assert code == 0, server.log()


async def test_a_front_whose_ray_gcs_is_killed_gives_up_and_exits_non_zero(
    tmp_path: Path, loopback: None
) -> None:
    """Without its GCS a runtime the front started cannot come back (and Ray would end
    the process within a minute anyway): the front's probe times out, the front gives
    up, and the process exits non-zero for a supervisor to start a fresh one."""
    async with lipstream_serve(
        tmp_path, "--workers", "2", server=SETTINGS, startup_timeout_s=STARTUP_TIMEOUT_S
    ) as server:
        await _serving_two_workers(server)
        _kill(server, "gcs_server")
        async with asyncio.timeout(RECOVERY_TIMEOUT_S):
            code = await server.proc.wait()
        log = server.log()
        assert code != 0, log
        assert "cluster: giving up: the Ray GCS of the local Ray runtime did not answer" in log, log
