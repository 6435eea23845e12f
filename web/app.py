"""The aiohttp application of one lipstream process: routes and the lifetimes of what they use.

It only builds the app; serving it (the listener, signals, the drain) is
``web/serve.py``'s, so the cluster workers that run this same app (``web/cluster/worker.py``)
import nothing of the process entry. The app starts from the edge every listener shares
(``web/edge.py``: the guard, middlewares, drain flag and liveness). Resources live in
``cleanup_ctx`` generators (started before ``yield``, stopped after), so teardown runs in
reverse order of start-up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from config.settings import Settings
from inference_core.assets.builtin import avatar_locator
from inference_core.serving.core import InferenceCore
from streaming.audio_in.tts import build_tts_engine
from streaming.live.manager import SessionManager
from streaming.webrtc.compat import report_missing_internals
from web.admin import add_admin_routes
from web.app_keys import AVATAR_NAMES, CORE, DOOR, SESSIONS, TTS
from web.broadcast import add_broadcast_routes
from web.edge import edge_app
from web.infer_api import infer
from web.inference.door import InferenceDoor
from web.inference.rest import add_inference_protocol_routes
from web.livekit import add_livekit_routes
from web.metrics import add_metrics_routes
from web.openapi import add_openapi_routes
from web.session_controls import add_routes as add_control_routes
from web.session_controls import message_control
from web.session_streams import add_stream_routes
from web.signalling import add_routes

STATIC_DIR = Path(__file__).parent / "static"


def build_app(
    settings: Settings, *, core: InferenceCore | None = None, session_id_prefix: str = ""
) -> web.Application:
    """Build the application; ``core`` lets tests pass a pre-built inference core, and a
    cluster worker gives its identity as the prefix of its session ids."""
    app = edge_app(settings)
    app[AVATAR_NAMES] = {}

    async def inference_core(app: web.Application) -> AsyncIterator[None]:
        a = settings.avatars
        app[CORE] = core or InferenceCore(settings, avatar_locator(a))
        await app[CORE].start()
        app[DOOR] = InferenceDoor(app[CORE], settings)
        yield
        await app[CORE].stop(timeout_s=settings.server.drain_timeout_s)

    async def sessions(app: web.Application) -> AsyncIterator[None]:
        await report_missing_internals()
        app[SESSIONS] = SessionManager(settings, app[CORE], session_id_prefix=session_id_prefix)
        app[SESSIONS].control = message_control(app)
        yield
        await app[SESSIONS].close_all()

    async def text_to_speech(app: web.Application) -> AsyncIterator[None]:
        app[TTS] = build_tts_engine(settings.tts)
        yield
        await app[TTS].close()

    app.cleanup_ctx.extend([inference_core, sessions, text_to_speech])
    app.router.add_post("/v1/infer/{model_id}", infer)
    add_inference_protocol_routes(app)
    add_routes(app)
    add_broadcast_routes(app)
    add_livekit_routes(app)
    add_stream_routes(app)
    add_control_routes(app)
    add_admin_routes(app)
    add_metrics_routes(app)
    add_openapi_routes(app)
    app.router.add_get("/", index)
    app.router.add_static("/static", STATIC_DIR, follow_symlinks=False)
    return app


async def index(request: web.Request) -> web.FileResponse:
    """The browser demo page."""
    return web.FileResponse(STATIC_DIR / "index.html")
