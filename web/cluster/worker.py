"""One cluster worker: a whole lipstream server in its own process, run as a Ray actor.

The worker is the single-process server (``web.app.build_app``: its inference core, its
sessions, their encoders and peer connections, its own event loop) listening on
``cluster.worker_host`` at a port the OS picks (and, unless ``server.grpc_port`` is null,
serving the raw inference front doors over gRPC there at another port the OS picks,
``WorkerReport.grpc_port``). The front reaches it over HTTP for every request it routes
(media never passes the front: the caller's UDP goes to the worker's own ICE
candidates) and over Ray only for the small :class:`WorkerReport` and to drain it
(``docs/design/cluster.md`` §14).

Ray runs this class as an async actor, so its methods run on the actor's event loop, the
same loop the aiohttp server and aiortc use. The server starts on the first call (Ray
re-runs ``__init__`` when it restarts a dead worker, and ``__init__`` cannot await), and
each start is a new incarnation: session ids made before a restart name the old one, and
the front answers them ``410 session_lost``. Nothing here imports Ray: the front wraps
the class with ``ray.remote`` (``web/cluster/runtime.py``); only the node id in a report asks
Ray, when it runs the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Mapping

from aiohttp import web
from pydantic import ValidationError

from config.settings import ServerSettings, Settings
from streaming.webrtc.compat import loopback_only_ice
from web.app import build_app
from web.app_keys import CORE, DRAINING, SESSIONS
from web.cluster.placement import SEPARATOR, WorkerReport
from web.inference.grpc_server import GrpcListener, start_inference_grpc
from web.log_format import configure_logging

logger = logging.getLogger(__name__)


#: A node's own public address (1:1 NAT), set in the environment Ray's processes start in.
PUBLIC_ADDRESS_ENV = "LIPSTREAM_SERVER__ICE_PUBLIC_ADDRESS"


def worker_settings(settings: Settings, environ: Mapping[str, str] = os.environ) -> Settings:
    """A worker's settings: the server's, as one process on an OS-chosen port.

    The front limits offers per caller address before any worker is asked, so the
    workers (which see only the front's address) do not limit them again. A node's
    ``LIPSTREAM_SERVER__ICE_PUBLIC_ADDRESS`` is its workers' public address. A worker given
    a share of a GPU (``cluster.gpus_per_worker`` below 1) may fill that share of
    ``devices.max_memory_per_device``: k workers on one GPU together stay within it.
    """
    update: dict[str, object] = {
        "host": settings.cluster.worker_host,  # the port is the OS's choice (_start)
        "offer_rate_limit_per_minute": 0,
    }
    if environ.get(PUBLIC_ADDRESS_ENV):  # this node's own, over the front's settings
        update["ice_public_address"] = environ[PUBLIC_ADDRESS_ENV]
    try:  # validated: a bad address on one node names the variable
        server = ServerSettings.model_validate({**dict(settings.server), **update})
    except ValidationError as exc:
        raise ValueError(f"{PUBLIC_ADDRESS_ENV} on this node: {exc.errors()[0]['msg']}") from None
    cluster = settings.cluster.model_copy(update={"workers": 0})
    devices = settings.devices
    share = settings.cluster.gpus_per_worker
    if 0 < share < 1 and devices.max_memory_per_device is not None:
        cap = max(1, int(devices.max_memory_per_device * share))
        devices = devices.model_copy(update={"max_memory_per_device": cap})
    return settings.model_copy(update={"server": server, "cluster": cluster, "devices": devices})


class Worker:
    """A lipstream server named ``name`` (``lipstream-w0``…), started on first use."""

    def __init__(self, settings: Settings, name: str) -> None:
        self._settings = worker_settings(settings)
        self._name = name
        self._incarnation = secrets.token_hex(4)
        self._runner: web.AppRunner | None = None
        self._grpc: GrpcListener | None = None
        self._url = ""
        self._lock = asyncio.Lock()
        self._node, self._node_id = _node_address(), _ray_node_id()  # fixed for the process
        configure_logging(settings.logging.level, settings.logging.format)
        if self._settings.server.ice_loopback_only:  # for the life of this process
            self._loopback = contextlib.ExitStack()
            self._loopback.enter_context(loopback_only_ice())

    async def report(self) -> WorkerReport:
        """What this worker holds and how much room it has (starting it if needed)."""
        app = await self._app()
        totals = app[SESSIONS].snapshot().totals
        core = await app[CORE].snapshot()
        return WorkerReport(
            name=self._name,
            incarnation=self._incarnation,
            url=self._url,
            node=self._node,
            node_id=self._node_id,
            pid=os.getpid(),
            models=frozenset(m.model_id for m in core.models if m.state == "loaded"),
            live_sessions=totals.live,
            room_places=totals.room_places,
            room_share=totals.room_share,
            draining=app[DRAINING].draining,
            gpus=os.environ.get("CUDA_VISIBLE_DEVICES"),
            grpc_port=self._grpc.port if self._grpc is not None else None,
        )

    async def drain(self, timeout_s: float) -> int:
        """Take no new sessions; wait up to ``timeout_s`` for the live ones to end.
        Returns how many are still live."""
        app = await self._app()
        app[DRAINING].start()
        sessions = app[SESSIONS]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sessions.wait_until_empty(), timeout_s)
        return sessions.live_count

    async def stop(self) -> None:
        """Close the sessions, stop the server (the process then exits with the actor)."""
        if self._grpc is not None:  # before the core its calls use stops
            await self._grpc.close(self._settings.server.request_timeout_s)
            self._grpc = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            logger.info("worker %s (%s) stopped", self._name, self._incarnation)

    async def _app(self) -> web.Application:
        async with self._lock:
            if self._runner is None:
                await self._start()
            assert self._runner is not None
            return self._runner.app

    async def _start(self) -> None:
        server = self._settings.server
        prefix = f"{self._name}{SEPARATOR}{self._incarnation}{SEPARATOR}"
        app = build_app(self._settings, session_id_prefix=prefix)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=server.request_timeout_s)
        await runner.setup()
        site = web.TCPSite(runner, server.host, 0)
        await site.start()
        port = runner.addresses[0][1]
        host = self._node if server.host in ("0.0.0.0", "::", "") else server.host
        if server.grpc_port is not None:  # the front's port; a worker takes any free one
            try:
                self._grpc = await start_inference_grpc(app, server.host, 0)
            except BaseException:
                await runner.cleanup()
                raise
        self._url = f"http://{host}:{port}"
        self._runner = runner
        logger.info(
            "worker %s (incarnation %s, pid %d) serving on %s (gRPC: %s)",
            self._name,
            self._incarnation,
            os.getpid(),
            self._url,
            f"port {self._grpc.port}" if self._grpc is not None else "off",
        )


def _ray_node_id() -> str:
    """The Ray node this worker runs on ("" when not run by Ray, as in unit tests)."""
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # not in a Ray worker: no node id to give
        return ""


def _node_address() -> str:
    """This node's address as other nodes reach it (the one a default route uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent, a route is chosen
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"
