"""The front's side of a cluster: its Ray runtime, the worker actors and what they last reported.

:class:`ClusterFront` reaches Ray (``web/cluster/runtime.py``: it starts a local runtime,
joins ``cluster.ray_address``, or uses the one it was given), starts ``cluster.workers``
named worker actors (``web/cluster/worker.py``) with the resources the settings declare,
and keeps one :class:`~web.cluster.placement.WorkerState` per worker from a report
pulled every ``cluster.report_interval_s``. Reports are pulled concurrently, each within
``cluster.report_timeout_s``: a worker that does not answer (hung, dead, being restarted
by Ray) is marked not answering and skipped by placement, and nothing the front does ever
waits on it longer than that (``docs/design/cluster.md`` §14). Ray restarts a dead worker
(``cluster.max_restarts``); its next report carries a new incarnation, and its old calls
are gone.

Ray itself can die under the front (its raylet, or an agent the raylet fate-shares with,
killed: the workers on that node die with it, and Ray restarts none of them). The front
probes its own Ray node every :attr:`Recovery.probe_interval_s` and, when it is dead:

- a runtime it **started** is restarted, with its workers (up to
  :attr:`Recovery.restart_attempts` tries in a row); when it cannot be (or its GCS stops
  answering, after which Ray would end the process itself), the front gives up:
  ``/health`` answers 503 with the reason and the process exits non-zero, so that a
  supervisor starts a fresh one;
- a cluster it **joined** is reconnected to with backoff, for as long as it takes;
- a runtime it was **given** is its owner's to restart; the front says so in ``/ready``.

Meanwhile :attr:`ClusterFront.problem` says what is happening (``/ready`` shows it) and
the workers count as not answering, so offers get 503 and the ids of the lost calls get
``410 session_lost`` once the workers report again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from config.settings import Settings
from web.cluster.placement import WorkerReport, WorkerState
from web.cluster.ray_check import ClusterUnavailableError
from web.cluster.runtime import ProbeTimeoutError, RayRuntime, Runtime, RuntimeMode

logger = logging.getLogger(__name__)

#: How long the first reports may take: each worker loads its inference core first.
FIRST_REPORT_TIMEOUT_S = 120.0
#: Bound on the front's own Ray calls (a look-up, a kill) and on stopping its tasks.
CALL_TIMEOUT_S = 30.0
#: Bound on letting go of a runtime that is lost (its GCS may be gone, or the thread busy
#: with a ray.init that waits up to a minute for a raylet).
LOST_CLOSE_S = 10.0


@dataclass(frozen=True)
class Recovery:
    """How the front watches its Ray runtime and brings it back (module doc)."""

    probe_interval_s: float = 2.0
    probe_timeout_s: float = 15.0
    restart_attempts: int = 3  # in a row, for a runtime this front started
    restart_timeout_s: float = 120.0  # for one ray.shutdown + ray.init
    backoff_first_s: float = 1.0
    backoff_max_s: float = 30.0

    def backoff_s(self, attempt: int) -> float:
        """Seconds before try ``attempt + 1``: doubling from the first, up to the most."""
        return float(min(self.backoff_max_s, self.backoff_first_s * 2 ** (attempt - 1)))


class ClusterFront:
    """The workers of one front (see the module doc); :meth:`start` before use."""

    def __init__(
        self,
        settings: Settings,
        *,
        runtime: Runtime | None = None,
        recovery: Recovery | None = None,
    ) -> None:
        self.settings = settings
        self._cluster = settings.cluster
        # The workers' admin token: the operator's, or one only this front knows (the
        # front applies the operator's access rule; web/cluster/aggregate.py).
        self.worker_admin_token = settings.server.admin_token or SecretStr(
            secrets.token_urlsafe(32)
        )
        server = settings.server.model_copy(update={"admin_token": self.worker_admin_token})
        self._worker_settings = settings.model_copy(update={"server": server})
        self._runtime: Runtime = runtime or RayRuntime(settings.cluster)
        self._recovery = recovery or Recovery()
        self._actors: dict[str, Any] = {}
        self._owned: set[str] = set()  # the workers this front started (and stops)
        self.workers: dict[str, WorkerState] = {}
        #: Why the front has no Ray runtime to serve from right now (None while it has).
        self.problem: str | None = None
        self.gave_up = False
        self._give_up: Callable[[str], None] = lambda reason: None
        self._refresh: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        # Reports asked for out of turn (after an offer, a failed request): at most one
        # per worker at a time, each done within the report timeout.
        self._soon: dict[str, asyncio.Task[None]] = {}
        self.started_at = time.monotonic()

    def connect(self) -> None:
        """Join or start Ray now (blocking, a few seconds), before the event loop runs, so
        that nothing waits on it."""
        self._runtime.connect_now()

    async def start(self, give_up: Callable[[str], None] | None = None) -> None:
        """Connect to Ray (if :meth:`connect` did not), start the workers, wait for each
        one's first report, and watch the runtime. ``give_up`` is called with the reason
        when the front cannot go on (``app[LIVENESS].fail``)."""
        if give_up is not None:
            self._give_up = give_up
        await self._runtime.connect()
        await self._start_workers()
        self._refresh = asyncio.create_task(self._keep_fresh(), name="lipstream-cluster-reports")
        self._watch = asyncio.create_task(self._watch_runtime(), name="lipstream-cluster-runtime")

    async def _start_workers(self) -> int:
        """Find or start every worker, pull the first reports; how many answer."""
        for index in range(self._cluster.workers):
            name = f"w{index}"
            actor, created = await self._runtime.worker(name, self._worker_settings, CALL_TIMEOUT_S)
            self._actors[name] = actor
            if created:
                self._owned.add(name)
            self.workers.setdefault(name, WorkerState(name))
        await self.refresh(timeout_s=FIRST_REPORT_TIMEOUT_S)
        up = sum(w.answering for w in self.workers.values())
        logger.info("cluster: %d of %d workers up", up, len(self.workers))
        return up

    async def refresh(self, timeout_s: float | None = None) -> None:
        """Pull every worker's report at once, each within the timeout."""
        timeout = timeout_s if timeout_s is not None else self._cluster.report_timeout_s
        await asyncio.gather(
            *(self._pull(name, actor, timeout) for name, actor in self._actors.items())
        )

    async def _pull(self, name: str, actor: Any, timeout_s: float) -> None:
        state = self.workers[name]
        try:
            report: WorkerReport = await asyncio.wait_for(actor.report.remote(), timeout_s)
        except Exception as exc:  # Ray's errors, a timeout: the worker is not answering
            if state.answering:
                logger.warning("cluster: worker %s stopped answering: %r", name, exc)
            state.answering = False
            state.failures += 1
            state.last_error = f"{type(exc).__name__}: {exc}"[:300]
            return
        old = state.report
        if old is not None and old.incarnation != report.incarnation:
            state.restarts += 1
            logger.warning(
                "cluster: worker %s restarted (incarnation %s -> %s); its %d calls were lost",
                name,
                old.incarnation,
                report.incarnation,
                old.live_sessions,
            )
        if not state.answering:
            logger.info("cluster: worker %s answering at %s", name, report.url)
        state.report, state.answering, state.failures, state.last_error = report, True, 0, None

    def report_soon(self, name: str) -> None:
        """Pull worker ``name``'s report now, without waiting for it (a session started
        there): placement sees its new load before the next round. One already under way
        for that worker stands for this one."""
        if name in self._soon or name not in self._actors:
            return
        task = asyncio.create_task(
            self._pull(name, self._actors[name], self._cluster.report_timeout_s),
            name=f"lipstream-cluster-report-{name}",
        )
        self._soon[name] = task
        task.add_done_callback(lambda _: self._soon.pop(name, None))

    async def _keep_fresh(self) -> None:
        while True:
            await asyncio.sleep(self._cluster.report_interval_s)
            await self.refresh()

    async def _watch_runtime(self) -> None:
        """Probe this front's Ray node; bring the runtime back when it died (module doc).
        Without this task the front would not know, so if it fails the front gives up."""
        try:
            await self._watch_runtime_forever()
        except Exception as exc:  # cancellation is the normal end; anything else is a bug
            logger.exception("cluster: the watch of the Ray runtime failed")
            self._fail(f"the watch of {self._runtime.where} failed: {type(exc).__name__}: {exc}")

    async def _watch_runtime_forever(self) -> None:
        recovery = self._recovery
        while True:
            await asyncio.sleep(recovery.probe_interval_s)
            try:
                dead = await self._runtime.probe(recovery.probe_timeout_s)
            except ProbeTimeoutError as exc:
                if self._runtime.mode is RuntimeMode.STARTED:
                    self._fail(f"{exc}; Ray ends a process that lost its GCS")
                    return
                self._set_problem(f"{exc}; waiting for it")  # the probe goes on waiting
                continue
            except Exception as exc:  # Ray's own errors: the GCS could not tell
                dead = f"asking the Ray GCS failed: {type(exc).__name__}: {str(exc)[:200]}"
            if dead is None:
                if self.problem is not None:
                    logger.info("cluster: %s answers again", self._runtime.where)
                    self.problem = None
                continue
            if not await self._bring_back(dead):
                return

    async def _bring_back(self, why: str) -> bool:
        """Restart or reconnect the runtime and its workers; False when the front gave up."""
        runtime, recovery = self._runtime, self._recovery
        await self._stop_tasks([self._refresh, *self._soon.values()])
        self._refresh = None
        lost = f"this front's node of {runtime.where} died: {why}"
        for state in self.workers.values():
            state.answering, state.last_error = False, lost[:300]
        self._actors.clear()
        self._owned.clear()
        if runtime.mode is RuntimeMode.GIVEN:
            self._set_problem(f"{lost}; the process that gave it must restart it")
            return True
        attempt = 0
        while True:
            attempt += 1
            doing = "restarting it" if runtime.mode is RuntimeMode.STARTED else "reconnecting"
            self._set_problem(f"{lost}; {doing} with its workers (attempt {attempt})")
            try:
                await runtime.reconnect(recovery.restart_timeout_s)
                up = await self._start_workers()
                if up == 0:
                    raise ClusterUnavailableError("no worker answered after it came back")
            except Exception as exc:  # whatever Ray raised: this try failed, the next may not
                error = f"{type(exc).__name__}: {exc}"[:300]
                if runtime.mode is RuntimeMode.STARTED and attempt >= recovery.restart_attempts:
                    self._fail(f"{lost}; {attempt} restarts failed, the last with {error}")
                    return False
                wait_s = recovery.backoff_s(attempt)
                logger.warning(
                    "cluster: attempt %d to bring back %s failed (%s); next in %.0f s",
                    attempt,
                    runtime.where,
                    error,
                    wait_s,
                )
                self._actors.clear()
                self._owned.clear()
                await asyncio.sleep(wait_s)
                continue
            logger.info(
                "cluster: %s is back after %d attempts; %d of %d workers up",
                runtime.where,
                attempt,
                up,
                len(self.workers),
            )
            self.problem = None
            self._refresh = asyncio.create_task(
                self._keep_fresh(), name="lipstream-cluster-reports"
            )
            return True

    def _set_problem(self, problem: str) -> None:
        if problem != self.problem:
            logger.warning("cluster: %s", problem)
        self.problem = problem

    def _fail(self, reason: str) -> None:
        self.problem = reason
        self.gave_up = True
        logger.error("cluster: giving up: %s", reason)
        self._give_up(reason)

    async def drain(self, timeout_s: float) -> int:
        """Every worker this front started stops taking sessions and waits up to
        ``timeout_s`` for its own (workers shared with another front serve on). Returns
        how many sessions are still live (a worker that did not answer counts as one)."""
        left = await asyncio.gather(
            *(
                self._call(actor.drain.remote(timeout_s), timeout_s + 5)
                for name, actor in self._actors.items()
                if name in self._owned
            )
        )
        return sum(1 if n is None else int(n) for n in left)

    async def close(self) -> None:
        """Stop watching and reporting, stop the workers, and let go of Ray. With the
        runtime lost (given up on, or being brought back) there is none to ask: only
        letting go of it is tried, briefly (a local runtime's processes, workers included,
        end with this process)."""
        await self._stop_tasks([self._watch, self._refresh, *self._soon.values()])
        # Without a runtime (given up, or being brought back) there is nothing to ask.
        lost = self.gave_up or self.problem is not None
        owned = [] if lost else [a for n, a in self._actors.items() if n in self._owned]
        await asyncio.gather(*(self._call(actor.stop.remote(), CALL_TIMEOUT_S) for actor in owned))
        for actor in owned:
            try:
                await self._runtime.kill(actor, CALL_TIMEOUT_S)
            except Exception as exc:  # a runtime already gone: nothing left to kill
                logger.warning("cluster: could not kill a worker: %r", exc)
        await self._runtime.close(LOST_CLOSE_S if lost else CALL_TIMEOUT_S)
        self._actors.clear()
        self._owned.clear()

    async def _stop_tasks(self, tasks: list[asyncio.Task[None] | None]) -> None:
        running = [
            task for task in tasks if task is not None and task is not asyncio.current_task()
        ]
        for task in running:
            task.cancel()
        if running:
            _, stuck = await asyncio.wait(running, timeout=CALL_TIMEOUT_S)
            for task in stuck:
                logger.warning("cluster: task %s did not stop in time", task.get_name())

    async def _call(self, ref: Any, timeout_s: float) -> Any:
        try:
            return await asyncio.wait_for(ref, timeout_s)
        except Exception as exc:
            logger.warning("cluster: a worker did not answer while stopping: %r", exc)
            return None
