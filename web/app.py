"""The aiohttp application: routes, middlewares and the lifetimes of what they use.

Resources live in ``cleanup_ctx`` generators (started before ``yield``, stopped after),
so teardown runs in reverse order of start-up.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web

from config.settings import Settings
from inference_core.avatar import AvatarLocator
from inference_core.core import InferenceCore
from web.app_keys import CORE, SETTINGS
from web.errors import error_middleware
from web.infer_api import infer

logger = logging.getLogger(__name__)


def build_app(settings: Settings, *, core: InferenceCore | None = None) -> web.Application:
    """Build the application; ``core`` lets tests pass a pre-built inference core."""
    app = web.Application(middlewares=[error_middleware])
    app[SETTINGS] = settings

    async def inference_core(app: web.Application) -> AsyncIterator[None]:
        a = settings.avatars
        app[CORE] = core or InferenceCore(settings, AvatarLocator(a.root, a.data_dir, demo=a.demo))
        await app[CORE].start()
        yield
        await app[CORE].stop(timeout_s=settings.server.drain_timeout_s)

    app.cleanup_ctx.append(inference_core)
    app.router.add_post("/v1/infer/{model_id}", infer)
    return app


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
