"""The aiohttp application: routes, middlewares and the lifetimes of what they use.

Resources live in ``cleanup_ctx`` generators (started before ``yield``, stopped after),
so teardown runs in reverse order of start-up.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from config.settings import Settings
from inference_core.avatar import AvatarLocator
from inference_core.core import InferenceCore
from streaming.session_manager import SessionManager
from streaming.tts import build_tts_engine
from web.admin import add_admin_routes
from web.app_keys import AVATAR_NAMES, CORE, OFFER_LIMITER, SESSIONS, SETTINGS, TTS
from web.cors import cors_middleware
from web.errors import error_middleware
from web.infer_api import infer
from web.metrics import add_metrics_routes
from web.openapi import add_openapi_routes
from web.rate_limit import RateLimiter
from web.signalling import add_routes

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"


def build_app(settings: Settings, *, core: InferenceCore | None = None) -> web.Application:
    """Build the application; ``core`` lets tests pass a pre-built inference core."""
    app = web.Application(
        middlewares=[cors_middleware(settings.server.cors_origins), error_middleware]
    )
    app[SETTINGS] = settings
    app[OFFER_LIMITER] = RateLimiter(settings.server.offer_rate_limit_per_minute)
    app[AVATAR_NAMES] = {}

    async def inference_core(app: web.Application) -> AsyncIterator[None]:
        a = settings.avatars
        app[CORE] = core or InferenceCore(settings, AvatarLocator(a.root, a.data_dir, demo=a.demo))
        await app[CORE].start()
        yield
        await app[CORE].stop(timeout_s=settings.server.drain_timeout_s)

    async def sessions(app: web.Application) -> AsyncIterator[None]:
        app[SESSIONS] = SessionManager(settings, app[CORE])
        yield
        await app[SESSIONS].close_all()

    async def text_to_speech(app: web.Application) -> AsyncIterator[None]:
        app[TTS] = build_tts_engine(settings.tts)
        yield
        await app[TTS].close()

    app.cleanup_ctx.extend([inference_core, sessions, text_to_speech])
    app.router.add_post("/v1/infer/{model_id}", infer)
    add_routes(app)
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
    """Run the server until SIGINT/SIGTERM."""
    server = settings.server
    logger.info("serving on http://%s:%d", server.host, server.port)
    web.run_app(
        build_app(settings),
        host=server.host,
        port=server.port,
        print=None,
        access_log=None,
        shutdown_timeout=server.drain_timeout_s,
    )
