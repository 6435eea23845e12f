"""Changing what a live call shows, by HTTP, WebSocket or data-channel message.

``POST /sessions/{id}/avatar`` and ``POST /sessions/{id}/idle``, and the same as
``{"type": "switch_avatar", ...}`` / ``{"type": "set_idle_clip", ...}`` messages on the
session's WebSocket and the caller's data channel (``docs/apps.md``). One function acts
for all three (:func:`switch_avatar`, :func:`set_idle_clip`); a message's failure goes
back to the client that sent it as an ``error`` message, with the code an HTTP request
would get (``web.errors.classify``). A message's action runs as a task of the call
(stage ``switch``), so it never holds up the reader of the WebSocket or channel, and ends
with the call.

With session tokens on, showing another avatar needs a token for that avatar: the
request's ``Authorization`` header or the message's ``token`` field.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from streaming.live.events import error_event, message_type
from streaming.live.pipeline import Control, Reply
from streaming.live.session import Session
from web.app_keys import DRAINING, SESSIONS, SETTINGS
from web.errors import RequestError, classify
from web.request_body import read_json
from web.schemas import AvatarSwitched, IdleClipSet, SetIdleClip, SwitchAvatar
from web.session_tokens import require_token, verify_token

logger = logging.getLogger(__name__)

#: Bytes of a switch or clip request body.
MAX_BODY = 8192

#: Message types a client sends to change what the call shows.
CHANGES = ("switch_avatar", "set_idle_clip")

Send = Callable[[dict[str, Any]], Awaitable[None]]


def add_routes(app: web.Application) -> None:
    app.router.add_post("/sessions/{session_id}/avatar", switch_avatar_route)
    app.router.add_post("/sessions/{session_id}/idle", set_idle_clip_route)


async def switch_avatar_route(request: web.Request) -> web.Response:
    """Switch a live call's avatar (200 once scheduled; the call keeps its avatar on error)."""
    session = request.app[SESSIONS].get(request.match_info["session_id"])
    body = await read_json(request, SwitchAvatar, MAX_BODY)
    settings = request.app[SETTINGS].auth
    if body.token is not None and settings.jwt_secret is not None:
        _check_token(request.app, body.avatar, body.token)
    else:
        require_token(request, settings, body.avatar)
    return web.json_response(await switch_avatar(request.app, session, body.avatar))


async def set_idle_clip_route(request: web.Request) -> web.Response:
    """Choose the clip a live call's avatar plays while silent."""
    session = request.app[SESSIONS].get(request.match_info["session_id"])
    require_token(request, request.app[SETTINGS].auth, session.avatar_id)
    body = await read_json(request, SetIdleClip, MAX_BODY)
    return web.json_response(set_idle_clip(session, body.clip))


async def switch_avatar(app: web.Application, session: Session, avatar: str) -> dict[str, Any]:
    """Switch ``session`` to ``avatar``; the response body (raises the library's errors)."""
    if app[DRAINING].draining:
        raise RequestError(
            503,
            "shutting_down",
            "the server is draining; the call keeps its avatar",
            retry_after=5,
        )
    previous = session.avatar_id
    switched = await app[SESSIONS].switch_avatar(session, avatar)
    if switched is None:
        body = AvatarSwitched(
            session_id=session.session_id,
            avatar=avatar,
            previous=previous,
            changed=False,
            frame=None,
            media_ms=None,
        )
    else:
        body = AvatarSwitched(
            session_id=session.session_id,
            avatar=switched.avatar,
            previous=switched.previous,
            changed=True,
            frame=switched.frame,
            media_ms=round(switched.media_ms, 1),
        )
    return body.dump()


def set_idle_clip(session: Session, clip: str) -> dict[str, Any]:
    """Choose ``session``'s idle clip; the response body (``ClipNotFoundError`` if unknown)."""
    previous = session.set_idle_clip(clip)
    body = IdleClipSet(
        session_id=session.session_id, clip=clip, previous=previous, clips=session.clips
    )
    return body.dump()


def message_control(app: web.Application) -> Control:
    """What a caller's data channel message does (the manager's ``control``): interrupt
    at once, a change as a task of the call, anything else an error back."""

    def control(session: Session, message: object, reply: Reply) -> None:
        kind = message_type(message)
        if kind == "interrupt":
            session.interrupt()
        elif kind in CHANGES:

            async def send(event: dict[str, Any]) -> None:
                reply(event)

            session.run_control(change(app, session, str(message), send))
        else:
            reply(
                error_event(
                    "bad_message",
                    'the data channel takes {"type": "interrupt"}, {"type": "switch_avatar", '
                    '"avatar": "..."} and {"type": "set_idle_clip", "clip": "..."}',
                )
            )

    return control


async def change(app: web.Application, session: Session, text: str, send: Send) -> None:
    """Act on a ``switch_avatar`` or ``set_idle_clip`` message; its error goes to ``send``
    (the client that sent it). Never raises: a client's bad request must not end the call."""
    kind = message_type(text) or "?"
    try:
        fields = json.loads(text)
        if kind == "switch_avatar":
            request = SwitchAvatar.model_validate(_without_type(fields))
            if app[SETTINGS].auth.jwt_secret is not None:
                _check_token(app, request.avatar, request.token or "")
            await switch_avatar(app, session, request.avatar)
        else:
            clip = SetIdleClip.model_validate(_without_type(fields))
            set_idle_clip(session, clip.clip)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(message)"
        await send(error_event("bad_message", f"{kind}: {where}: {first['msg']}", request=kind))
    except Exception as exc:  # the request's error, told to its sender
        error = classify(exc)
        if error.status >= 500:
            logger.warning("%s failed: session=%s error=%s", kind, session.session_id, exc)
        await send(error_event(error.code, str(error), request=kind))


def _without_type(fields: object) -> dict[str, Any]:
    if not isinstance(fields, dict):
        return {}
    return {k: v for k, v in fields.items() if k != "type"}


def _check_token(app: web.Application, avatar: str, token: str) -> None:
    settings = app[SETTINGS].auth
    if settings.jwt_secret is None:
        return
    if not token:
        raise RequestError(401, "unauthorized", f"a session token for avatar {avatar!r} is needed")
    if verify_token(settings, token).avatar != avatar:
        raise RequestError(401, "unauthorized", "the session token is for another avatar")
