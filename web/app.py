"""The aiohttp application: routes, middlewares and the lifetimes of what they use.

Resources live in ``cleanup_ctx`` generators (started before ``yield``, stopped after),
so teardown runs in reverse order of start-up.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import nullcontext
from pathlib import Path

from aiohttp import web

from config.settings import Settings
from inference_core.assets.builtin import avatar_locator
from inference_core.serving.core import InferenceCore
from streaming.audio_in.tts import build_tts_engine
from streaming.live.manager import SessionManager
from streaming.live.reporting import delay_budget
from streaming.webrtc.compat import loopback_only_ice, report_missing_internals
from web.admin import add_admin_routes
from web.app_keys import AVATAR_NAMES, CORE, DRAINING, OFFER_LIMITER, SESSIONS, SETTINGS, TTS
from web.client_address import client_address_middleware
from web.connection_guard import GUARD, ConnectionGuard
from web.cors import cors_middleware
from web.errors import error_middleware
from web.infer_api import infer
from web.metrics import add_metrics_routes
from web.open_files import raise_open_file_limit
from web.openapi import add_openapi_routes
from web.rate_limit import RateLimiter
from web.session_streams import add_stream_routes
from web.signalling import add_routes

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"


def build_app(
    settings: Settings, *, core: InferenceCore | None = None, session_id_prefix: str = ""
) -> web.Application:
    """Build the application; ``core`` lets tests pass a pre-built inference core, and a
    cluster worker gives its identity as the prefix of its session ids."""
    server = settings.server
    guard = ConnectionGuard.for_server(server)
    app = web.Application(
        middlewares=[
            guard.middleware,
            client_address_middleware(server.trusted_proxies, server.forwarded_header),
            cors_middleware(server.cors_origins),
            error_middleware,
        ]
    )
    app[GUARD] = guard
    app[SETTINGS] = settings
    app[OFFER_LIMITER] = RateLimiter(settings.server.offer_rate_limit_per_minute)
    app[AVATAR_NAMES] = {}

    async def inference_core(app: web.Application) -> AsyncIterator[None]:
        a = settings.avatars
        app[CORE] = core or InferenceCore(settings, avatar_locator(a))
        await app[CORE].start()
        yield
        await app[CORE].stop(timeout_s=settings.server.drain_timeout_s)

    async def sessions(app: web.Application) -> AsyncIterator[None]:
        await report_missing_internals()
        app[SESSIONS] = SessionManager(settings, app[CORE], session_id_prefix=session_id_prefix)
        yield
        await app[SESSIONS].close_all()

    async def text_to_speech(app: web.Application) -> AsyncIterator[None]:
        app[TTS] = build_tts_engine(settings.tts)
        yield
        await app[TTS].close()

    app.cleanup_ctx.extend([inference_core, sessions, text_to_speech])
    app.router.add_post("/v1/infer/{model_id}", infer)
    add_routes(app)
    add_stream_routes(app)
    add_admin_routes(app)
    add_metrics_routes(app)
    add_openapi_routes(app)
    app.router.add_get("/", index)
    app.router.add_static("/static", STATIC_DIR, follow_symlinks=False)
    return app


async def index(request: web.Request) -> web.FileResponse:
    """The browser demo page."""
    return web.FileResponse(STATIC_DIR / "index.html")


def serve(settings: Settings) -> None:
    """Run the server until SIGTERM or SIGINT, then drain and exit (``docs/architecture.md`` §12).

    The first signal turns ``/ready`` to 503 and new offers away (503 + Retry-After);
    live sessions run on until they end or ``server.drain_timeout_s`` passes (a second
    signal cuts that short). Then the listener closes and ``cleanup_ctx`` closes the
    remaining sessions and stops the inference core.
    """
    raise_open_file_limit()
    if settings.cluster.workers:
        from web.cluster.app import serve_front  # imports Ray only when asked for

        serve_front(settings)
        return
    loopback = loopback_only_ice() if settings.server.ice_loopback_only else nullcontext()
    with loopback:
        asyncio.run(_serve(settings))


async def _serve(settings: Settings) -> None:
    server = settings.server
    app = build_app(settings)
    # Requests still running once the drain is over may take their own limit to finish.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=server.request_timeout_s)
    # Handlers go in before start-up, so a signal during it still ends in a clean exit.
    with ShutdownSignals(asyncio.get_running_loop()) as signals:
        await runner.setup()
        try:
            # aiohttp's protocols, wrapped by the connection guard (head timeout, cap).
            listener = await app[GUARD].listen(runner, server.host, server.port)
            logger.info("serving on http://%s:%d", server.host, server.port)
            _log_delay(settings)
            await signals.wait()
            await _drain(app, server.drain_timeout_s, signals)
            listener.close()  # no new connections; the open ones are closed next
        finally:
            await runner.cleanup()
    logger.info("server stopped")


def _log_delay(settings: Settings) -> None:
    """State the delay a caller hears: what the server adds, and what a browser adds on top.

    The configured figure alone reads as mic → heard, which it is not: it starts once the
    audio is on the session's timeline (``docs/architecture.md`` §8).
    """
    budget = delay_budget(settings)
    low, high = budget.browser_extra_ms
    logger.info(
        "delay: the server adds server_ms=%.1f (lookahead_ms=%.1f + tick_ms=%.0f + "
        "pipeline_margin_ms=%.1f, for a 25 fps avatar with unet_328's audio features; each "
        "session logs its own); a browser caller typically measures mic to heard %.0f-%.0f ms: "
        "its capture, jitter buffer and decoder and the server's inbound slack add %.0f-%.0f ms "
        "(headless Chromium on loopback, docs/benchmarks.md §7)",
        budget.server_ms,
        budget.lookahead_ms,
        budget.tick_ms,
        budget.margin_ms,
        budget.server_ms + low,
        budget.server_ms + high,
        low,
        high,
    )


async def _drain(app: web.Application, timeout_s: float, signals: ShutdownSignals) -> None:
    """Refuse new sessions and wait for the live ones to end (or the timeout, or a signal)."""
    app[DRAINING].start()
    sessions = app[SESSIONS]
    loop = asyncio.get_running_loop()
    started = loop.time()
    logger.info(
        "draining: %d live sessions; new offers get 503; waiting up to %.0f s for them to end",
        sessions.live_count,
        timeout_s,
    )
    ended = asyncio.create_task(sessions.wait_until_empty(), name="drain-sessions-ended")
    again = asyncio.create_task(signals.wait(), name="drain-second-signal")
    try:
        await asyncio.wait({ended, again}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (ended, again):
            task.cancel()
        await asyncio.gather(ended, again, return_exceptions=True)
    if ended.done() and not ended.cancelled():
        why = "every session ended"
    elif again.done() and not again.cancelled():
        why = "a second signal"
    else:
        why = "server.drain_timeout_s passed"
    logger.info(
        "drain over after %.1f s (%s): closing %d sessions and stopping",
        loop.time() - started,
        why,
        sessions.live_count,
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
