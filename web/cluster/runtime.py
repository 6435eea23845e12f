"""Ray in a front's process: how it was reached, whether it is still there, and bringing it back.

A front reaches Ray one of three ways (:class:`RuntimeMode`): it **started** a local runtime
(``ray.init()`` with no address: the GCS, the raylet and its agents are this process's
children), it **joined** a cluster at ``cluster.ray_address``, or it was **given** one
already initialised by the process it runs in (a test's cluster). :class:`RayRuntime`
does every control call of Ray for the front; the front decides what to do when it dies
(``web/cluster/front.py``, ``docs/design/cluster.md`` §14).

- **One thread of its own.** ``ray.init``, ``ray.shutdown``, worker look-ups and the
  liveness probe run on one daemon thread, ``lipstream-ray``: never on the event loop
  (``ray.init`` takes seconds, and a call to a dead GCS blocks for a minute), and always on
  the same thread. Ray 2.60 initialised again on another thread than the first time
  leaves a client of the old GCS behind, which ends the process a minute later ("Failed
  to connect to GCS within 60 seconds"): measured on the 2-core VM in every run that
  re-initialised on a new thread, and in none of those that kept to one thread (100 s
  watched after the restart). A daemon thread, so that a call stuck on a dead GCS never
  holds up the process's exit.
- **Liveness** is the front's own Ray node as the GCS sees it (``ray.nodes()``): alive, or
  dead with Ray's reason. The raylet fate-shares with its agents (the dashboard agent, the
  runtime-env agent): killing either takes the raylet down, and the GCS marks the node dead
  at once; a raylet killed outright is marked dead when it misses its health checks (about
  15 s here). The workers on that node die with it. A probe the GCS does not answer within
  the timeout means the GCS itself is gone (:class:`ProbeTimeoutError`); Ray then ends the
  process on its own a minute later, whatever the front does.
- **Signals.** ``ray.init`` installs Ray's own C handler for SIGTERM (it logs a stack and
  exits, found when a restarted front died on SIGTERM instead of draining): after an
  ``init`` under a running loop, the handlers Python had (the serve loop's) are put back.

Ray is imported only here and in ``front`` (for its install hint): ``pip install
'lipstream[cluster]'`` adds it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import math
import os
import queue
import signal
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from config.settings import ClusterSettings, Settings
from web.cluster.ray_check import INSTALL_HINT, ClusterUnavailableError
from web.cluster.worker import Worker

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The object store of a local Ray runtime: the front passes only small reports.
LOCAL_OBJECT_STORE_BYTES = 80 * 1024 * 1024


class ProbeTimeoutError(TimeoutError):
    """The Ray GCS did not answer a liveness probe in time."""


class RuntimeMode(enum.Enum):
    STARTED = "started"  # ray.init() here: a local runtime this process owns
    JOINED = "joined"  # ray.init(address=cluster.ray_address)
    GIVEN = "given"  # initialised by the process the front runs in; never re-initialised


class Runtime(Protocol):
    """What a :class:`~web.cluster.front.ClusterFront` needs of Ray (a seam for tests)."""

    @property
    def mode(self) -> RuntimeMode: ...

    @property
    def where(self) -> str: ...

    def connect_now(self) -> None: ...

    async def connect(self) -> None: ...

    async def reconnect(self, timeout_s: float) -> None: ...

    async def probe(self, timeout_s: float) -> str | None: ...

    async def worker(self, name: str, settings: Settings, timeout_s: float) -> tuple[Any, bool]: ...

    async def kill(self, actor: Any, timeout_s: float) -> None: ...

    async def close(self, timeout_s: float) -> None: ...


class RayRuntime:
    """Ray for one front, every control call on the ``lipstream-ray`` thread (module doc)."""

    def __init__(self, cluster: ClusterSettings) -> None:
        self._cluster = cluster
        self._ray: Any = None
        self._mode: RuntimeMode | None = None
        self._node_id = ""
        self._thread = _ControlThread("lipstream-ray")
        # A probe still waiting on the GCS: the next probe waits for it instead of queueing.
        self._probing: concurrent.futures.Future[str | None] | None = None

    @property
    def mode(self) -> RuntimeMode:
        if self._mode is None:
            raise RuntimeError("RayRuntime.connect() has not run")
        return self._mode

    @property
    def where(self) -> str:
        """The runtime, as a log line names it."""
        if self._mode is RuntimeMode.GIVEN:
            return "the Ray runtime this process was given"
        if self._cluster.ray_address is not None:
            return f"the Ray cluster at {self._cluster.ray_address}"
        return "the local Ray runtime"

    def connect_now(self) -> None:
        """Join or start Ray, blocking (before the event loop runs). Ray installs no SIGTERM
        handler off the main thread: the server's own, on the loop, drains first."""
        self._thread.submit(self._connect).result()

    async def connect(self) -> None:
        """Join or start Ray unless :meth:`connect_now` did."""
        if self._mode is None:
            await self._call(self._connect, None)
            _restore_python_signal_handlers()

    async def reconnect(self, timeout_s: float) -> None:
        """Let go of Ray (stopping what is left of a runtime this front started) and reach
        it again: a fresh local runtime, or the cluster at its address."""
        if self.mode is RuntimeMode.GIVEN:
            raise ClusterUnavailableError(f"{self.where} cannot be restarted by the front")
        try:
            await self._call(self._reconnect, timeout_s)
        finally:
            _restore_python_signal_handlers()

    async def probe(self, timeout_s: float) -> str | None:
        """None while this front's Ray node is alive, else why it is not; raises
        :class:`ProbeTimeoutError` when the GCS does not answer within ``timeout_s``."""
        if self._probing is None or self._probing.done():
            self._probing = self._thread.submit(self._node_state)
        try:
            return await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(self._probing)), timeout_s
            )
        except TimeoutError:
            raise ProbeTimeoutError(
                f"the Ray GCS of {self.where} did not answer within {timeout_s:.0f} s"
            ) from None

    async def worker(self, name: str, settings: Settings, timeout_s: float) -> tuple[Any, bool]:
        """The actor of worker ``name``, and whether this call created it (a worker another
        front started is shared, never stopped by this one)."""
        return await self._call(lambda: self._worker(name, settings), timeout_s)

    async def kill(self, actor: Any, timeout_s: float) -> None:
        """End ``actor`` for good (Ray does not restart it)."""
        await self._call(lambda: self._ray.kill(actor, no_restart=True), timeout_s)

    async def close(self, timeout_s: float) -> None:
        """Let go of Ray (stopping a runtime this front started) and end the thread; a
        thread still stuck on a dead GCS is left behind (it is a daemon) and logged."""
        if self._mode in (RuntimeMode.STARTED, RuntimeMode.JOINED):
            try:
                await self._call(self._ray.shutdown, timeout_s)
            except TimeoutError:
                logger.warning(
                    "cluster: Ray did not shut down within %.0f s; leaving it", timeout_s
                )
            except Exception as exc:  # a runtime half gone: what is left ends with us
                logger.warning("cluster: Ray's shutdown failed: %r", exc)
        self._thread.stop()

    async def _call(self, fn: Callable[[], T], timeout_s: float | None) -> T:
        return await asyncio.wait_for(asyncio.wrap_future(self._thread.submit(fn)), timeout_s)

    # What follows runs on the lipstream-ray thread only.

    def _connect(self) -> None:
        try:
            import ray
        except ImportError:
            raise ClusterUnavailableError(INSTALL_HINT) from None
        self._ray = ray
        logging.getLogger("ray._private.worker").addFilter(_not_the_sigterm_warning)
        if ray.is_initialized():  # a test's cluster, or the host process's
            self._mode = RuntimeMode.GIVEN
        else:
            self._init()
            self._mode = (
                RuntimeMode.STARTED if self._cluster.ray_address is None else RuntimeMode.JOINED
            )
        self._node_id = str(ray.get_runtime_context().get_node_id())

    def _init(self) -> None:
        try:
            self._init_ray()
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError...
            joined = self._cluster.ray_address is not None
            raise ClusterUnavailableError(_unreachable(self.where, joined, exc)) from exc

    def _init_ray(self) -> None:
        options: dict[str, Any] = {
            "include_dashboard": False,
            # The workers' log lines come out of the front, prefixed "(Worker pid=…)",
            # as well as in Ray's log files on their nodes.
            "log_to_driver": True,
            "logging_level": logging.WARNING,
        }
        if self._cluster.ray_address is not None:
            self._ray.init(address=self._cluster.ray_address, **options)
            return
        cpus = max(  # a local runtime with room for every worker declared
            os.cpu_count() or 1, math.ceil(self._cluster.workers * self._cluster.cpus_per_worker)
        )
        self._ray.init(num_cpus=cpus, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **options)

    def _reconnect(self) -> None:
        self._ray.shutdown()  # stops the processes a local runtime has left; else disconnects
        self._init()
        self._node_id = str(self._ray.get_runtime_context().get_node_id())

    def _node_state(self) -> str | None:
        for node in self._ray.nodes():
            if node.get("NodeID") == self._node_id:
                if node.get("Alive"):
                    return None
                return str(node.get("DeathReasonMessage") or "Ray marked it dead").rstrip(".")
        return "Ray no longer lists it"

    def _worker(self, name: str, settings: Settings) -> tuple[Any, bool]:
        ray = self._ray
        try:  # another front on this Ray cluster started it: share it
            return ray.get_actor(f"lipstream-{name}"), False
        except ValueError:
            pass
        cluster = self._cluster
        # ray.remote again after each init: a shutdown forgets the class.
        actor = (
            ray.remote(Worker)
            .options(
                name=f"lipstream-{name}",
                get_if_exists=True,  # two fronts starting at once get one worker
                num_cpus=cluster.cpus_per_worker,
                num_gpus=cluster.gpus_per_worker,
                max_restarts=cluster.max_restarts,
                max_task_retries=0,  # at most once: a say or a push is never replayed
            )
            .remote(settings, name)
        )
        return actor, True


def _unreachable(where: str, joined: bool, exc: Exception) -> str:
    """What to check when Ray could not be started or joined."""
    hint = (
        "check cluster.ray_address (--ray-address), that the cluster is up, and, if it uses "
        "token authentication, RAY_AUTH_MODE=token and its token (~/.ray/auth_token or "
        "RAY_AUTH_TOKEN) in this process's environment"
        if joined
        else "see Ray's own lines above and /tmp/ray/session_latest/logs"
    )
    return f"could not start or reach {where}: {type(exc).__name__}: {str(exc)[:300]}; {hint}"


def _restore_python_signal_handlers() -> None:
    """Put back, for SIGTERM and SIGINT, the handler Python has on record (the serve
    loop's) over the C handler ``ray.init`` installed (module doc). Only the main thread
    may set handlers; elsewhere there is no serve loop's to keep."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(sig)
        if handler is not None:
            signal.signal(sig, handler)


def _not_the_sigterm_warning(record: logging.LogRecord) -> bool:
    """Ray warns that it set no SIGTERM handler when initialised off the main thread; the
    front handles SIGTERM itself (it drains), so the warning would only mislead."""
    return not str(record.msg).startswith("SIGTERM handler is not set")


class _ControlThread:
    """One daemon thread running submitted calls in order (started on first use)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None
        ]
        self._jobs = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future

    def stop(self) -> None:
        """End the thread once the calls already submitted have run."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up before it ran
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the awaiting caller, which logs it
                future.set_exception(exc)
