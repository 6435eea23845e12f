"""WebRTC signalling and session control.

POST   /offer                       {"sdp", "type": "offer", "avatar"} → answer + session_id
DELETE /sessions/{id}               hang up
GET    /sessions/{id}               the session's state
POST   /sessions/{id}/audio         WAV / any container / raw PCM → spoken by the avatar
POST   /sessions/{id}/say           {"text", "voice"?} → text-to-speech → spoken
POST   /sessions/{id}/interrupt     drop queued audio; the avatar goes idle

The audio stream (WebSocket) and the events (server-sent) are in :mod:`web.session_streams`.
GET    /avatars                     the avatars a client can pick
GET    /webrtc-config               ICE servers for the browser, and the configured delay
"""

from __future__ import annotations

import asyncio

import numpy as np
from aiohttp import web

from config.settings import Settings
from streaming.audio_in.push import AudioLimits, decode_pushed_audio
from streaming.audio_in.tts import check_text
from streaming.live.reporting import delay_budget
from streaming.live.session import Session
from streaming.live.utterances import Source
from streaming.webrtc.public_address import with_public_address
from streaming.webrtc.turn import turn_server
from web.app_keys import AVATAR_NAMES, CORE, SESSIONS, SETTINGS, TTS
from web.offer_gate import check_offer_request
from web.request_body import read_json, read_limited
from web.schemas import (
    Answer,
    Avatar,
    Avatars,
    DelayBudget,
    HungUp,
    IceServer,
    Interrupted,
    PlayedUtterance,
    Queued,
    Say,
    SessionState,
    WebRtcConfig,
)
from web.session_tokens import require_token


async def offer(request: web.Request) -> web.Response:
    """Answer a WebRTC offer for an avatar; the call starts once ICE connects.

    The checks a front makes too come first (``web/offer_gate.py``), with this process's
    own: the avatar is registered (404 for an unknown one, whatever the SDP)."""
    settings = request.app[SETTINGS]
    checked = await check_offer_request(request, avatar_known=request.app[CORE].check_registered)
    body = checked.body
    session = await request.app[SESSIONS].create(
        body.sdp, checked.info, body.avatar_id, request.remote
    )
    sdp = session.answer_sdp
    if settings.server.ice_public_address is not None:  # behind a 1:1 NAT
        sdp = with_public_address(sdp, str(settings.server.ice_public_address))
    delay = DelayBudget.of(session.delay_budget)
    answer = Answer(sdp=sdp, type="answer", session_id=session.session_id, delay=delay)
    return web.json_response(answer.dump())


def _session(request: web.Request) -> Session:
    """The session named in the path, if the request may control it."""
    session = request.app[SESSIONS].get(request.match_info["session_id"])
    require_token(request, request.app[SETTINGS].auth, session.avatar_id)
    return session


async def hang_up(request: web.Request) -> web.Response:
    """End a session."""
    session = _session(request)
    await session.close("hung up by API")
    return web.json_response(HungUp(session_id=session.session_id, state="closed").dump())


async def session_state(request: web.Request) -> web.Response:
    """One session's state and counters."""
    session = _session(request)
    state = SessionState.model_validate(session.snapshot(), from_attributes=True)
    return web.json_response(state.dump())


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
    return web.json_response(_queue(session, samples, "push").dump(), status=202)


def _queue(session: Session, samples: np.ndarray, source: Source) -> Queued:
    """Queue audio decoded to the mixer's 48 kHz in ``session`` as one utterance: its
    number, how long it is, how much is queued now."""
    queued = session.app_audio.push(samples, source)
    return Queued(
        utterance=queued.utterance,
        duration_ms=round(queued.duration_s * 1000, 1),
        queued_ms=round(queued.queued_s * 1000, 1),
    )


async def say(request: web.Request) -> web.Response:
    """Speak text through the configured text-to-speech engine (202)."""
    settings = request.app[SETTINGS]
    session = _session(request)
    body = await read_json(request, Say, 4 * settings.session.max_say_chars + 1024)
    text = check_text(body.text, settings.session.max_say_chars)
    samples = await request.app[TTS].synthesize(text, voice=body.voice)
    return web.json_response(_queue(session, samples, "say").dump(), status=202)


async def interrupt(request: web.Request) -> web.Response:
    """Drop a session's queued audio and frames."""
    session = _session(request)
    dropped, played = session.interrupt()
    interrupted = Interrupted(
        dropped_ms=round(dropped * 1000, 1),
        utterances=[p["utterance"] for p in played],
        played=[PlayedUtterance(**p) for p in played],
    )
    return web.json_response(interrupted.dump())


async def avatars(request: web.Request) -> web.Response:
    """Avatars a client may ask for, with their display names and idle clips (read once,
    then cached)."""
    names = request.app[AVATAR_NAMES]
    core = request.app[CORE]
    ids = core.model_ids()
    missing = [avatar_id for avatar_id in ids if avatar_id not in names]
    if missing:
        found = await asyncio.to_thread(
            lambda: {i: (core.display_name(i), core.clip_names(i)) for i in missing}
        )
        names.update(found)
    listed = Avatars(avatars=[Avatar(id=i, name=names[i][0], clips=names[i][1]) for i in ids])
    return web.json_response(listed.dump())


async def webrtc_config(request: web.Request) -> web.Response:
    """The ICE servers browsers should use (credentials included: they are for clients),
    and the delay the server adds, stated before a caller picks an avatar
    (``docs/design/delay.md`` §8)."""
    settings = request.app[SETTINGS]
    servers = client_ice_servers(settings)
    config = WebRtcConfig(ice_servers=servers, delay=DelayBudget.of(delay_budget(settings)))
    return web.json_response(config.dump())


def client_ice_servers(settings: Settings) -> list[IceServer]:
    """The ICE servers a client may use: the configured ones, and the TURN server with
    fresh, short-lived credentials for this client (``/webrtc-config``, WHEP's ``Link``)."""
    servers = [
        IceServer(
            urls=list(server.urls),
            username=server.username,
            credential=None if server.credential is None else server.credential.get_secret_value(),
        )
        for server in settings.server.ice_servers
    ]
    turn = turn_server(settings.turn)
    if turn is not None:
        urls, username, credential = turn
        servers.append(IceServer(urls=urls, username=username, credential=credential))
    return servers


def add_routes(app: web.Application) -> None:
    app.router.add_post("/offer", offer)
    app.router.add_get("/sessions/{session_id}", session_state)
    app.router.add_delete("/sessions/{session_id}", hang_up)
    app.router.add_post("/sessions/{session_id}/audio", push_audio)
    app.router.add_post("/sessions/{session_id}/say", say)
    app.router.add_post("/sessions/{session_id}/interrupt", interrupt)
    app.router.add_get("/avatars", avatars)
    app.router.add_get("/webrtc-config", webrtc_config)
