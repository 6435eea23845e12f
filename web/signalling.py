"""WebRTC signalling and session control.

POST   /offer                       {"sdp", "type": "offer", "avatar"} → answer + session_id
DELETE /sessions/{id}               hang up
GET    /sessions/{id}               the session's state
POST   /sessions/{id}/audio         WAV / any container / raw PCM → spoken by the avatar
POST   /sessions/{id}/say           {"text", "voice"?} → text-to-speech → spoken
POST   /sessions/{id}/interrupt     drop queued audio; the avatar goes idle
GET    /avatars                     the avatars a client can pick
GET    /webrtc-config               ICE servers for the browser
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

from aiohttp import web

from inference_core.avatars.package import check_avatar_id
from streaming.audio_in.push import AudioLimits, decode_pushed_audio
from streaming.audio_in.tts import check_text, check_voice
from streaming.exceptions import SessionLimitError
from streaming.live.session import Session
from streaming.webrtc.offer_check import OfferLimits, check_offer
from web.app_keys import AVATAR_NAMES, CORE, DRAINING, OFFER_LIMITER, SESSIONS, SETTINGS, TTS
from web.errors import RequestError
from web.request_body import parse_json_object, read_limited
from web.session_tokens import require_token


async def _json_body(request: web.Request, limit: int) -> dict[str, Any]:
    return parse_json_object(await read_limited(request, limit, "the JSON body"))


def _string(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise RequestError(400, "bad_field", f"field {key!r} must be a string")
    return value


def _optional_string(data: dict[str, Any], key: str) -> str | None:
    return None if data.get(key) is None else _string(data, key)


async def offer(request: web.Request) -> web.Response:
    """Answer a WebRTC offer for an avatar; the call starts once ICE connects."""
    if request.app[DRAINING].draining:  # 503 + Retry-After (web.errors)
        raise SessionLimitError("the server is shutting down; try again shortly")
    settings = request.app[SETTINGS]
    wait = request.app[OFFER_LIMITER].retry_after(request.remote or "unknown")
    if wait is not None:
        raise RequestError(
            429,
            "rate_limited",
            f"too many offers from this address; at most "
            f"{settings.server.offer_rate_limit_per_minute} per minute",
            retry_after=max(1, math.ceil(wait)),
        )
    data = await _json_body(request, settings.server.max_offer_bytes)
    sdp = _string(data, "sdp")
    sdp_type = _string(data, "type")
    avatar = check_avatar_id(_optional_string(data, "avatar") or "demo")
    require_token(request, settings.auth, avatar)
    request.app[CORE].check_registered(avatar)  # 404 for an unknown avatar, whatever the SDP
    if sdp_type != "offer":
        raise RequestError(400, "bad_offer", f"type must be 'offer', got {sdp_type[:20]!r}")
    info = check_offer(sdp, OfferLimits(max_bytes=settings.server.max_offer_bytes))
    session = await request.app[SESSIONS].create(sdp, info, avatar, request.remote)
    local = session.pc.localDescription
    return web.json_response(
        {"sdp": local.sdp, "type": local.type, "session_id": session.session_id}
    )


def _session(request: web.Request) -> Session:
    """The session named in the path, if the request may control it."""
    session = request.app[SESSIONS].get(request.match_info["session_id"])
    require_token(request, request.app[SETTINGS].auth, session.avatar_id)
    return session


async def hang_up(request: web.Request) -> web.Response:
    """End a session."""
    session = _session(request)
    await session.close("hung up by API")
    return web.json_response({"session_id": session.session_id, "state": "closed"})


async def session_state(request: web.Request) -> web.Response:
    """One session's state and counters."""
    session = _session(request)
    return web.json_response(dataclasses.asdict(session.snapshot()))


async def push_audio(request: web.Request) -> web.Response:
    """Queue pushed audio in a session (202); the avatar speaks it in real time."""
    settings = request.app[SETTINGS]
    session = _session(request)
    limits = AudioLimits.from_settings(settings.session)
    body = await read_limited(request, limits.max_bytes, "the audio body")
    content_type = request.headers.get("Content-Type", "")
    samples = await asyncio.to_thread(
        decode_pushed_audio, body, content_type, dict(request.query), limits=limits
    )
    queued = session.push_audio(samples)
    return web.json_response(
        {"duration_ms": round(len(samples) / 16, 1), "queued_ms": round(queued * 1000, 1)},
        status=202,
    )


async def say(request: web.Request) -> web.Response:
    """Speak text through the configured text-to-speech engine (202)."""
    settings = request.app[SETTINGS]
    session = _session(request)
    data = await _json_body(request, 4 * settings.session.max_say_chars + 1024)
    text = check_text(_string(data, "text"), settings.session.max_say_chars)
    voice = _optional_string(data, "voice")
    samples = await request.app[TTS].synthesize(
        text, voice=check_voice(voice) if voice is not None else None
    )
    queued = session.push_audio(samples)
    return web.json_response(
        {"duration_ms": round(len(samples) / 16, 1), "queued_ms": round(queued * 1000, 1)},
        status=202,
    )


async def interrupt(request: web.Request) -> web.Response:
    """Drop a session's queued audio and frames."""
    session = _session(request)
    dropped = session.interrupt()
    return web.json_response({"dropped_ms": round(dropped * 1000, 1)})


async def avatars(request: web.Request) -> web.Response:
    """Avatars a client may ask for, with their display names (read once, then cached)."""
    names = request.app[AVATAR_NAMES]
    core = request.app[CORE]
    ids = core.model_ids()
    missing = [avatar_id for avatar_id in ids if avatar_id not in names]
    if missing:
        found = await asyncio.to_thread(lambda: {i: core.display_name(i) for i in missing})
        names.update(found)
    return web.json_response({"avatars": [{"id": i, "name": names[i]} for i in ids]})


async def webrtc_config(request: web.Request) -> web.Response:
    """The ICE servers browsers should use (credentials included: they are for clients)."""
    servers = []
    for server in request.app[SETTINGS].server.ice_servers:
        entry: dict[str, Any] = {"urls": list(server.urls)}
        if server.username is not None:
            entry["username"] = server.username
        if server.credential is not None:
            entry["credential"] = server.credential.get_secret_value()
        servers.append(entry)
    return web.json_response({"iceServers": servers})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/offer", offer)
    app.router.add_get("/sessions/{session_id}", session_state)
    app.router.add_delete("/sessions/{session_id}", hang_up)
    app.router.add_post("/sessions/{session_id}/audio", push_audio)
    app.router.add_post("/sessions/{session_id}/say", say)
    app.router.add_post("/sessions/{session_id}/interrupt", interrupt)
    app.router.add_get("/avatars", avatars)
    app.router.add_get("/webrtc-config", webrtc_config)
