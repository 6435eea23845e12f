"""The front's side of a cluster: Ray, the worker actors and what they last reported.

:class:`ClusterFront` joins a Ray cluster (or starts a local Ray runtime), starts
``cluster.workers`` named worker actors (``web/cluster/worker.py``) with the resources
the settings declare, and keeps one :class:`~web.cluster.placement.WorkerState` per
worker from a report pulled every ``cluster.report_interval_s``. Reports are pulled
concurrently, each within ``cluster.report_timeout_s``: a worker that does not answer
(hung, dead, being restarted by Ray) is marked not answering and skipped by placement,
and nothing the front does ever waits on it longer than that (``docs/architecture.md``
§14). Ray restarts a dead worker (``cluster.max_restarts``); its next report carries a
new incarnation, and its old calls are gone.

Ray is imported only here, and only when a cluster is asked for: ``pip install
'lipstream[cluster]'`` adds it, and without it :class:`ClusterUnavailableError` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import time
from typing import Any

from pydantic import SecretStr

from config.settings import Settings
from web.cluster.placement import WorkerReport, WorkerState
from web.cluster.ray_check import INSTALL_HINT
from web.cluster.worker import Worker

logger = logging.getLogger(__name__)

#: How long the first reports may take: each worker loads its inference core first.
FIRST_REPORT_TIMEOUT_S = 120.0
#: The object store of a local Ray runtime: the front passes only small reports.
LOCAL_OBJECT_STORE_BYTES = 80 * 1024 * 1024


class ClusterUnavailableError(RuntimeError):
    """A cluster was configured but cannot be started (Ray missing, no cluster there)."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterUnavailableError(INSTALL_HINT) from None
    return ray


class ClusterFront:
    """The workers of one front (see the module doc); :meth:`start` before use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._cluster = settings.cluster
        # The workers' admin token: the operator's, or one only this front knows (the
        # front applies the operator's access rule; web/cluster/aggregate.py).
        self.worker_admin_token = settings.server.admin_token or SecretStr(
            secrets.token_urlsafe(32)
        )
        server = settings.server.model_copy(update={"admin_token": self.worker_admin_token})
        self._worker_settings = settings.model_copy(update={"server": server})
        self._ray: Any = None
        self._started_ray = False
        self._actors: dict[str, Any] = {}
        self._owned: set[str] = set()  # the workers this front started (and stops)
        self.workers: dict[str, WorkerState] = {}
        self._refresh: asyncio.Task[None] | None = None
        # Reports asked for out of turn (after an offer, a failed request): at most one
        # per worker at a time, each done within the report timeout.
        self._soon: dict[str, asyncio.Task[None]] = {}
        self.started_at = time.monotonic()

    def connect(self) -> None:
        """Join or start Ray now (blocking, a few seconds), before the event loop runs, so
        that nothing waits on it. On the main thread Ray installs a SIGTERM handler; the
        server's own, installed on the loop afterwards, replaces it (drain first)."""
        self._ray = _import_ray()
        self._init_ray()

    async def start(self) -> None:
        """Connect to Ray (if :meth:`connect` did not), start the workers, wait for each
        one's first report."""
        if self._ray is None:
            self._ray = _import_ray()
            await asyncio.to_thread(self._init_ray)
        ray = self._ray
        remote = ray.remote(Worker)
        for index in range(self._cluster.workers):
            name = f"w{index}"
            try:  # another front on this Ray cluster started it: share it, never stop it
                self._actors[name] = ray.get_actor(f"lipstream-{name}")
            except ValueError:
                self._actors[name] = remote.options(
                    name=f"lipstream-{name}",
                    get_if_exists=True,  # two fronts starting at once get one worker
                    num_cpus=self._cluster.cpus_per_worker,
                    num_gpus=self._cluster.gpus_per_worker,
                    max_restarts=self._cluster.max_restarts,
                    max_task_retries=0,  # at most once: a say or a push is never replayed
                ).remote(self._worker_settings, name)
                self._owned.add(name)
            self.workers[name] = WorkerState(name)
        await self.refresh(timeout_s=FIRST_REPORT_TIMEOUT_S)
        up = sum(w.answering for w in self.workers.values())
        logger.info("cluster: %d of %d workers up", up, len(self.workers))
        self._refresh = asyncio.create_task(self._keep_fresh(), name="lipstream-cluster-reports")

    def _init_ray(self) -> None:
        ray = self._ray
        if ray.is_initialized():  # a test's cluster, or connect() ran
            return
        options: dict[str, Any] = {
            "include_dashboard": False,
            # The workers' log lines come out of the front, prefixed "(Worker pid=…)",
            # as well as in Ray's log files on their nodes.
            "log_to_driver": True,
            "logging_level": logging.WARNING,
        }
        if self._cluster.ray_address is not None:
            ray.init(address=self._cluster.ray_address, **options)
        else:  # a local runtime with room for every worker declared
            cpus = max(
                os.cpu_count() or 1,
                math.ceil(self._cluster.workers * self._cluster.cpus_per_worker),
            )
            ray.init(num_cpus=cpus, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **options)
        self._started_ray = True

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
        except Exception as exc:
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
        if name in self._soon:
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

    async def drain(self, timeout_s: float) -> None:
        """Every worker this front started stops taking sessions and waits up to
        ``timeout_s`` for its own (workers shared with another front serve on)."""
        await asyncio.gather(
            *(
                self._call(actor.drain.remote(timeout_s), timeout_s + 5)
                for name, actor in self._actors.items()
                if name in self._owned
            )
        )

    async def close(self) -> None:
        """Stop the reports and the workers, and Ray if this front started it."""
        for task in [self._refresh, *self._soon.values()]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        owned = [actor for name, actor in self._actors.items() if name in self._owned]
        await asyncio.gather(*(self._call(actor.stop.remote(), 30.0) for actor in owned))
        if self._ray is not None:
            for actor in owned:
                self._ray.kill(actor, no_restart=True)
            if self._started_ray:
                await asyncio.to_thread(self._ray.shutdown)
        self._actors.clear()
        self._owned.clear()

    async def _call(self, ref: Any, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(ref, timeout_s)
        except Exception as exc:
            logger.warning("cluster: a worker did not answer while stopping: %r", exc)
