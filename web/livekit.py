"""LiveKit Agents avatars (``docs/design/livekit.md``, ``docs/guides/livekit.md``).

POST /livekit/sessions   {"livekit_url", "livekit_token", "avatar"?, "idle_clip"?} →
                         201 once the avatar joined the room and published its tracks

An avatar plugin (``lipstream_client.livekit.AvatarSession``) mints the token and posts
it here, as hosted avatar providers' plugins do. The session is admitted as a call is,
appears in ``GET /sessions`` with ``kind: livekit``, tells its room's state on its events
(``livekit``) and ends with ``DELETE /sessions/{id}`` or when the agent leaves.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from streaming.exceptions import SessionLimitError
from streaming.live.avatar import CallAvatar
from streaming.live.pipeline import CallResources
from streaming.live.session import Session
from streaming.livekit.join import RoomJoin, checked_join, require_sdk
from web.app_keys import CORE, DRAINING, SESSIONS, SETTINGS
from web.offer_gate import refuse_if_rate_limited
from web.request_body import parse_body, read_limited
from web.schemas.livekit import LiveKitSessionCreated, NewLiveKitSession
from web.schemas.signalling import DelayBudget
from web.session_tokens import require_token

#: How the cluster front forwards a new session's request: (request, avatar, body).
Placer = Callable[[web.Request, str, bytes], Awaitable[web.Response]]
EXAMPLE = '{"livekit_url": "ws://livekit:7880", "livekit_token": "<JWT>", "avatar": "demo"}'


async def checked_request(
    request: web.Request, check_avatar: Callable[[str], object] | None = None
) -> tuple[NewLiveKitSession, RoomJoin, bytes]:
    """The body, the join it asks for and the raw body, once everything a server can
    check without the SDK holds (draining, rate, size, session token, the avatar with
    ``check_avatar``, URL, token claims); the cluster front checks the same (but the
    avatar: its workers do) before it places the request."""
    settings = request.app[SETTINGS]
    if request.app[DRAINING].draining:  # 503 + Retry-After (web.errors)
        raise SessionLimitError("the server is shutting down; try again shortly")
    refuse_if_rate_limited(request)
    raw = await read_limited(request, settings.server.max_offer_bytes, "the JSON body")
    body = parse_body(NewLiveKitSession, raw, example=EXAMPLE)
    require_token(request, settings.auth, body.avatar_id)
    if check_avatar is not None:
        check_avatar(body.avatar_id)
    join = await checked_join(
        body.livekit_url, body.livekit_token, allow_private=settings.livekit.allow_private
    )
    return body, join, raw


def placed_by(place: Placer) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The cluster front's ``POST /livekit/sessions`` handler: checked as here but for the
    SDK, then ``place``d as a call on its avatar is (``web/cluster/app.py``); the worker
    the front chose joins the room."""

    async def handler(request: web.Request) -> web.Response:
        body, _, raw = await checked_request(request)
        return await place(request, body.avatar_id, raw)

    return handler


async def create_livekit_session(request: web.Request) -> web.Response:
    """Join a LiveKit room as an agent's avatar (201 once joined; module doc)."""
    started = time.perf_counter()
    body, join, _ = await checked_request(request, request.app[CORE].check_registered)
    require_sdk()
    from streaming.livekit.session import open_livekit  # the optional SDK, once needed

    async def open_one(
        avatar: CallAvatar,
        shared: CallResources,
        session_id: str,
        on_closed: Callable[[Session], None],
    ) -> Session:
        return await open_livekit(
            session_id, join, avatar, shared, remote=request.remote, on_closed=on_closed
        )

    session = await request.app[SESSIONS].create_opened(body.avatar_id, open_one)
    if body.idle_clip is not None:
        try:
            session.set_idle_clip(body.idle_clip)
        except BaseException:
            await session.close("offer failed")
            raise
    claims = join.claims
    created = LiveKitSessionCreated(
        session_id=session.session_id,
        avatar=session.avatar_id,
        room=claims.room,
        identity=claims.identity,
        agent=claims.agent,
        join_ms=round((time.perf_counter() - started) * 1000, 1),
        whep=f"/sessions/{session.session_id}/whep",
        delay=DelayBudget.of(session.delay_budget),
    )
    location = f"/sessions/{session.session_id}"
    return web.json_response(created.dump(), status=201, headers={"Location": location})


def add_livekit_routes(app: web.Application) -> None:
    app.router.add_post("/livekit/sessions", create_livekit_session)
