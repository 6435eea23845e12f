"""``lipstream serve``: the process entry, from listening to exit, for one process or a front.

One serve loop runs both kinds of server (``docs/design/failure.md`` §12,
``docs/design/cluster.md`` §14): open the guarded listener (and the gRPC listener of the
raw inference front doors on ``server.grpc_port``: one process's own, or a front's that
relays to its workers), wait for SIGTERM or SIGINT (or for the app to give up,
``app[LIVENESS]``), drain, close the listeners, then let ``cleanup_ctx`` stop what the
app started. What differs is the :class:`Drain`: one process waits for its own sessions
to end, a front for every worker's. The app factories (``web/app.py``,
``web/cluster/app.py``) know nothing of this module, so a cluster worker, which runs the
single-process app inside a Ray actor, imports no process entry and no signal handling.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from config.settings import ServerSettings, Settings
from streaming.live.reporting import delay_budget
from streaming.webrtc.compat import loopback_only_ice
from web.app import build_app
from web.app_keys import DRAINING, LIVENESS, SESSIONS
from web.cluster.app import FRONT, build_front_app
from web.cluster.front import ClusterFront
from web.cluster.grpc_front import start_front_grpc
from web.connection_guard import GUARD
from web.inference.grpc_server import GrpcListener, start_inference_grpc
from web.open_files import raise_open_file_limit

logger = logging.getLogger(__name__)

#: The exit status of a server that gave up (``app[LIVENESS]``): a supervisor restarts it.
EXIT_FAILED = 1


@dataclass(frozen=True)
class Drain:
    """How one kind of server drains. ``wait`` returns True once everything it serves has
    ended (False when it stopped waiting with calls still live); the serve loop bounds it
    by ``server.drain_timeout_s`` and a second signal. ``live`` says what is still being
    served, for the log."""

    wait: Callable[[web.Application, float], Coroutine[Any, Any, bool]]
    live: Callable[[web.Application], str]


async def _sessions_ended(app: web.Application, timeout_s: float) -> bool:
    await app[SESSIONS].wait_until_empty()
    return True


async def _workers_drained(app: web.Application, timeout_s: float) -> bool:
    return await app[FRONT].drain(timeout_s) == 0


def _live_sessions(app: web.Application) -> str:
    return f"{app[SESSIONS].live_count} live sessions"


def _live_on_workers(app: web.Application) -> str:
    workers = app[FRONT].workers.values()
    live = sum(w.report.live_sessions for w in workers if w.report is not None)
    return f"{live} live sessions on {len(workers)} workers"


ONE_PROCESS = Drain(wait=_sessions_ended, live=_live_sessions)
FRONT_OF_WORKERS = Drain(wait=_workers_drained, live=_live_on_workers)

#: Opens a started app's gRPC listener (the app's startup has run when it is called).
OpenGrpc = Callable[[web.Application], Awaitable[GrpcListener]]


def serve(settings: Settings) -> int:
    """Run the server until SIGTERM or SIGINT, then drain and stop; return the exit status.

    The first signal turns ``/ready`` to 503 and new offers away (503 + Retry-After);
    live sessions run on until they end or ``server.drain_timeout_s`` passes (a second
    signal cuts that short). Then the listener closes and ``cleanup_ctx`` closes the
    remaining sessions and stops the inference core (or the workers). A server that gives
    up (a front whose Ray runtime cannot be brought back) stops at once and returns
    :data:`EXIT_FAILED`.
    """
    raise_open_file_limit()
    factory = event_loop_factory(settings.server.event_loop)
    if settings.cluster.workers:
        front = ClusterFront(settings)
        front.connect()  # Ray, before the loop runs (web/cluster/front.py)
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(_serve_front(settings, front))
    loopback = loopback_only_ice() if settings.server.ice_loopback_only else nullcontext()
    with loopback, asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_serve_one(settings))


def event_loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the server's event loop (``server.event_loop``); None: asyncio's own.

    uvloop where it is asked for and installed; else asyncio's, said once in the log."""
    if name != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        logger.warning("server.event_loop is uvloop but uvloop is not installed: using asyncio")
        return None
    logger.info("event loop: uvloop %s", importlib.metadata.version("uvloop"))
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def _serve_one(settings: Settings) -> int:
    log_delay(settings)
    server = settings.server
    app = build_app(settings)
    return await run_server(app, server, ONE_PROCESS, name="server", grpc=_inference_grpc(server))


def _inference_grpc(server: ServerSettings) -> OpenGrpc | None:
    """The raw inference front doors on ``server.grpc_port`` (None when that is null)."""
    port = server.grpc_port
    if port is None:
        return None

    async def open_grpc(app: web.Application) -> GrpcListener:
        return await start_inference_grpc(app, server.host, port)

    return open_grpc


async def _serve_front(settings: Settings, front: ClusterFront) -> int:
    app = build_front_app(settings, front=front)
    name = f"front of {settings.cluster.workers} workers"
    server = settings.server
    return await run_server(app, server, FRONT_OF_WORKERS, name=name, grpc=_front_grpc(server))


def _front_grpc(server: ServerSettings) -> OpenGrpc | None:
    """The front doors on ``server.grpc_port``, relayed to the workers' own
    (``web/cluster/grpc_front.py``); None when that is null (the workers open none)."""
    port = server.grpc_port
    if port is None:
        return None

    async def open_grpc(app: web.Application) -> GrpcListener:
        return await start_front_grpc(app, server.host, port)

    return open_grpc


async def run_server(
    app: web.Application,
    server: ServerSettings,
    drain: Drain,
    *,
    name: str,
    grpc: OpenGrpc | None = None,
) -> int:
    """Serve ``app`` on ``server.host:port`` (and gRPC, when ``grpc`` opens a listener)
    until a signal (then drain) or until the app gives up; return the exit status
    (module doc). The gRPC listener closes with the HTTP one: its running calls get
    ``server.request_timeout_s`` to finish, as HTTP requests do."""
    # Requests still running once the drain is over may take their own limit to finish.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=server.request_timeout_s)
    # Handlers go in before start-up, so a signal during it still ends in a clean exit.
    with ShutdownSignals(asyncio.get_running_loop()) as signals:
        await runner.setup()
        grpc_listener: GrpcListener | None = None
        try:
            # After runner.setup(), which ran the app's startup; before the HTTP listener,
            # so that a server whose /health answers answers gRPC too.
            if grpc is not None:
                grpc_listener = await grpc(app)
            freeze_startup_heap()
            # aiohttp's protocols, wrapped by the connection guard (head timeout, cap).
            listener = await app[GUARD].listen(runner, server.host, server.port)
            logger.info("%s serving on http://%s:%d", name, server.host, server.port)
            failure = await _until_stopped(signals, app)
            if failure is None:
                await _drain(app, drain, server.drain_timeout_s, signals)
            else:
                app[DRAINING].start()
                logger.error(
                    "%s stopping: %s; exiting with status %d so that a supervisor starts it again",
                    name,
                    failure,
                    EXIT_FAILED,
                )
            listener.close()  # no new connections; the open ones are closed next
        finally:
            if grpc_listener is not None:  # before cleanup stops the core its calls use
                await grpc_listener.close(server.request_timeout_s)
            await runner.cleanup()
    logger.info("%s stopped", name)
    return 0 if app[LIVENESS].failure is None else EXIT_FAILED


def freeze_startup_heap() -> int:
    """Move every object alive once start-up is done out of the cycle collector's reach
    (``gc.freeze``), after one full collection; returns how many were frozen.

    A full collection walks every tracked object, and a started server holds ~110k of
    them (modules, classes, settings, the app): ~90 ms on the 2-core development VM, the
    event loop and every call's frames held meanwhile (a missed slot each, 2-3 frames).
    What start-up made lives as long as the process, so it need not be walked again;
    afterwards a full collection walks only what calls made since (0.0 ms measured right
    after start-up). The price: a cycle among frozen objects that later becomes garbage
    is never freed, which start-up's objects, alive until exit, do not make. The process
    entry does this, not the app factory: it is a policy of the process, and an app
    built in a test or a cluster worker's actor leaves its process's collector alone.
    """
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("start-up heap frozen: %d objects left out of cycle collections", frozen)
    return frozen


async def _until_stopped(signals: ShutdownSignals, app: web.Application) -> str | None:
    """Wait for a signal (None) or for the app to give up (its reason)."""
    signalled = asyncio.create_task(signals.wait(), name="serve-signal")
    failed = asyncio.create_task(app[LIVENESS].wait(), name="serve-failure")
    try:
        await asyncio.wait({signalled, failed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (signalled, failed):
            task.cancel()
        await asyncio.gather(signalled, failed, return_exceptions=True)
    return app[LIVENESS].failure


async def _drain(
    app: web.Application, drain: Drain, timeout_s: float, signals: ShutdownSignals
) -> None:
    """Refuse new sessions and wait for the live ones to end (or the timeout, or a signal)."""
    app[DRAINING].start()
    loop = asyncio.get_running_loop()
    started = loop.time()
    logger.info(
        "draining: %s; new offers get 503; waiting up to %.0f s for them to end",
        drain.live(app),
        timeout_s,
    )
    ended = asyncio.create_task(drain.wait(app, timeout_s), name="drain-ended")
    again = asyncio.create_task(signals.wait(), name="drain-second-signal")
    try:
        await asyncio.wait({ended, again}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (ended, again):
            task.cancel()
        await asyncio.gather(ended, again, return_exceptions=True)
    if ended.done() and not ended.cancelled() and ended.exception() is None and ended.result():
        why = "every session ended"
    elif again.done() and not again.cancelled():
        why = "a second signal"
    else:
        why = "server.drain_timeout_s passed"
    logger.info(
        "drain over after %.1f s (%s): closing %s and stopping",
        loop.time() - started,
        why,
        drain.live(app),
    )


def log_delay(settings: Settings) -> None:
    """State the delay a caller hears: what the server adds, and what a browser adds on top.

    The configured figure alone reads as mic → heard, which it is not: it starts once the
    audio is on the session's timeline (``docs/design/delay.md`` §8).
    """
    budget = delay_budget(settings)
    low, high = budget.browser_extra_ms
    logger.info(
        "delay: the server adds server_ms=%.1f (lookahead_ms=%.1f + tick_ms=%.0f + "
        "pipeline_margin_ms=%.1f, for a 25 fps avatar with unet_328's audio features; each "
        "session logs its own); a browser caller typically measures mic to heard %.0f-%.0f ms: "
        "its capture, jitter buffer and decoder and the server's inbound slack add %.0f-%.0f ms "
        "(headless Chromium on loopback, docs/performance/live-calls.md)",
        budget.server_ms,
        budget.lookahead_ms,
        budget.tick_ms,
        budget.margin_ms,
        budget.server_ms + low,
        budget.server_ms + high,
        low,
        high,
    )


class ShutdownSignals:
    """SIGTERM and SIGINT as something to await, installed on the loop while in use."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._received = asyncio.Event()

    def __enter__(self) -> ShutdownSignals:
        for sig in self.SIGNALS:
            self._loop.add_signal_handler(sig, self._on_signal, sig)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig in self.SIGNALS:
            self._loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        logger.info("received %s", sig.name)
        self._received.set()

    async def wait(self) -> None:
        """Return at the next signal (or at once for one not yet waited for)."""
        await self._received.wait()
        self._received.clear()
