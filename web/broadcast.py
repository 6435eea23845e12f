"""Sessions without a caller, and their viewers over WHEP (``docs/design/broadcast.md`` §21).

POST   /sessions                              {"avatar", "outputs"?} → a session no
                                              caller owns (201)
POST   /sessions/{id}/whep                    application/sdp offer → 201, the SDP answer,
                                              Location of the viewer, ICE servers as Link
DELETE /sessions/{id}/whep/{viewer_id}        the viewer leaves
POST   /whip/{avatar}                         a WHIP publisher's application/sdp offer →
                                              201, a session that speaks its audio
                                              (Location: /sessions/{id}, DELETE ends it)
GET    /sessions/{id}/outputs                 the session's outputs and their state
POST   /sessions/{id}/outputs                 {"rtmp": url} or {"whip": url, "token"} →
                                              pushed from now on (201)
DELETE /sessions/{id}/outputs/{output_id}     stopped

A callerless session speaks what ``/audio``, ``/say`` and the audio stream give it, its
events are on ``/events`` and the audio stream, and ``DELETE /sessions/{id}`` ends it;
any session, a call too, can be watched. The WHEP answer follows RFC 9725's shape (the
WHIP protocol, which WHEP mirrors for playback): the offer is the body, the answer comes
back with ``201 Created`` and a ``Location`` to ``DELETE``. Candidates are all in the
answer: trickle ICE (``PATCH``) is not taken (405).
"""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDict

from streaming.broadcast.rtmp import OutputStatus
from streaming.broadcast.targets import RTMP, WHIP, check_target
from streaming.exceptions import OfferError, OutputError, OutputLimitError, SessionLimitError
from streaming.live.session import Session
from streaming.webrtc.offer_check import OfferInfo, OfferLimits, check_offer
from streaming.webrtc.public_address import with_public_address
from web.app_keys import CORE, DRAINING, SESSIONS, SETTINGS
from web.errors import RequestError
from web.offer_gate import refuse_if_rate_limited
from web.request_body import parse_body, read_json, read_limited
from web.schemas import (
    DelayBudget,
    NewSession,
    OutputList,
    OutputState,
    OutputTarget,
    SessionCreated,
    ViewerLeft,
)
from web.session_tokens import require_token
from web.signalling import client_ice_servers

SDP = "application/sdp"


async def create_session(request: web.Request) -> web.Response:
    """Open a session no caller owns (201); its media runs from now on, for viewers."""
    settings = request.app[SETTINGS]
    _refuse_if_draining(request)
    refuse_if_rate_limited(request)
    raw = await read_limited(request, settings.server.max_offer_bytes, "the JSON body")
    body = parse_body(NewSession, raw, example='{"avatar": "demo"}')
    require_token(request, settings.auth, body.avatar_id)
    request.app[CORE].check_registered(body.avatar_id)
    outputs = settings.outputs
    if len(body.outputs) > outputs.max_per_session:
        raise OutputLimitError(
            f"{len(body.outputs)} outputs asked for; outputs.max_per_session is "
            f"{outputs.max_per_session}"
        )
    for target in body.outputs:  # refused before any session is made
        url, schemes = _target(target)
        await check_target(url, allow_private=outputs.allow_private, schemes=schemes)
    session = await request.app[SESSIONS].create_callerless(body.avatar_id, request.remote)
    try:
        for target in body.outputs:
            await _add_output(session, target)
    except BaseException:
        await session.close("offer failed")
        raise
    created = SessionCreated(
        session_id=session.session_id,
        avatar=session.avatar_id,
        whep=f"/sessions/{session.session_id}/whep",
        delay=DelayBudget.of(session.delay_budget),
    )
    location = f"/sessions/{session.session_id}"
    return web.json_response(created.dump(), status=201, headers={"Location": location})


def _watched(request: web.Request) -> Session:
    """The session in the path, if the request carries a token for it (Bearer, as WHEP
    clients send it)."""
    session = request.app[SESSIONS].get(request.match_info["session_id"])
    require_token(request, request.app[SETTINGS].auth, session.avatar_id)
    return session


async def whep(request: web.Request) -> web.Response:
    """A viewer's SDP offer: answered, the viewer's media flows once ICE connects."""
    _refuse_if_draining(request)
    session = _watched(request)
    refuse_if_rate_limited(request)
    sdp, info = await _sdp_offer(request, "WHEP")
    if (session.peer.video_codec or "").lower() != "video/h264":
        raise OfferError(
            f"session {session.session_id[:16]} sends {session.peer.video_codec or 'no video'}"
            " (its caller could not take H.264); viewers are sent the session's H.264"
        )
    viewer = await session.audience.add(sdp, info)
    location = f"/sessions/{session.session_id}/whep/{viewer.viewer_id}"
    return _answered(request, viewer.answer_sdp, location)


async def whip(request: web.Request) -> web.Response:
    """A WHIP publisher's SDP offer: a session on the avatar in the path that speaks the
    publisher's audio, for viewers and outputs; ``Location`` is the session."""
    settings = request.app[SETTINGS]
    _refuse_if_draining(request)
    refuse_if_rate_limited(request)
    avatar = request.match_info["avatar"]
    require_token(request, settings.auth, avatar)
    request.app[CORE].check_registered(avatar)
    sdp, info = await _sdp_offer(request, "WHIP", video=False)
    session = await request.app[SESSIONS].create_published(sdp, info, avatar, request.remote)
    return _answered(request, session.answer_sdp, f"/sessions/{session.session_id}")


async def _sdp_offer(
    request: web.Request, protocol: str, *, video: bool = True
) -> tuple[str, OfferInfo]:
    """The body as a checked SDP offer (415 for another content type, 413, 400)."""
    limit = request.app[SETTINGS].server.max_offer_bytes
    if request.content_type != SDP:
        raise RequestError(
            415,
            "unsupported_media_type",
            f"a {protocol} offer is the SDP itself, sent as Content-Type: {SDP} "
            f"(got {request.content_type or 'none'})",
        )
    raw = await read_limited(request, limit, "the SDP offer")
    try:
        sdp = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise OfferError("the SDP offer is not UTF-8 text") from None
    return sdp, check_offer(sdp, OfferLimits(max_bytes=limit, video=video))


def _answered(request: web.Request, answer: str, location: str) -> web.Response:
    """201 with the SDP answer, its ``Location`` and the ICE servers as ``Link``s."""
    public = request.app[SETTINGS].server.ice_public_address
    if public is not None:  # behind a 1:1 NAT
        answer = with_public_address(answer, str(public))
    headers = CIMultiDict({"Location": location})
    for link in ice_server_links(request):
        headers.add("Link", link)
    return web.Response(status=201, body=answer.encode(), content_type=SDP, headers=headers)


async def leave(request: web.Request) -> web.Response:
    """A viewer leaves (its ``Location``, ``DELETE``)."""
    session = _watched(request)
    viewer_id = request.match_info["viewer_id"]
    await session.audience.remove(viewer_id)
    return web.json_response(ViewerLeft(viewer_id=viewer_id, state="closed").dump())


async def list_outputs(request: web.Request) -> web.Response:
    """The session's outputs, with their state and counters."""
    session = _watched(request)
    listed = OutputList(outputs=[_state(s) for s in session.outputs.statuses()])
    return web.json_response(listed.dump())


async def add_output(request: web.Request) -> web.Response:
    """Push the session to one more target, from its next keyframe (201)."""
    session = _watched(request)
    body = await read_json(request, OutputTarget, 8192)
    _target(body)
    status = await _add_output(session, body)
    return web.json_response(_state(status).dump(), status=201)


def _target(target: OutputTarget) -> tuple[str, tuple[str, ...]]:
    """The output's URL and the schemes it may have (400 unless exactly one is named)."""
    if (target.rtmp is None) == (target.whip is None):
        raise OutputError('an output is {"rtmp": url} or {"whip": url, "token": ...}')
    if target.rtmp is not None:
        return target.rtmp, RTMP
    assert target.whip is not None
    return target.whip, WHIP


async def _add_output(session: Session, target: OutputTarget) -> OutputStatus:
    if target.rtmp is not None:
        return await session.outputs.add_rtmp(target.rtmp)
    assert target.whip is not None
    return await session.outputs.add_whip(target.whip, target.token)


async def remove_output(request: web.Request) -> web.Response:
    """Stop one output (it closes its stream first, within a few seconds)."""
    session = _watched(request)
    status = await session.outputs.remove(request.match_info["output_id"])
    return web.json_response(_state(status).dump())


def _state(status: OutputStatus) -> OutputState:
    return OutputState.model_validate(status, from_attributes=True)


def ice_server_links(request: web.Request) -> list[str]:
    """The ICE servers a viewer may use, as RFC 9725 ``Link`` header values (TURN with
    fresh credentials for this viewer)."""
    return [
        _link(url, server.username, server.credential)
        for server in client_ice_servers(request.app[SETTINGS])
        for url in server.urls
    ]


def _link(url: str, username: str | None, credential: str | None) -> str:
    link = f'<{url}>; rel="ice-server"'
    if username is not None and credential is not None:
        link += f'; username="{username}"; credential="{credential}"; credential-type="password"'
    return link


def _refuse_if_draining(request: web.Request) -> None:
    if request.app[DRAINING].draining:  # 503 + Retry-After (web.errors)
        raise SessionLimitError("the server is shutting down; try again shortly")


def add_broadcast_routes(app: web.Application) -> None:
    app.router.add_post("/sessions", create_session)
    app.router.add_post("/sessions/{session_id}/whep", whep)
    app.router.add_post("/whip/{avatar}", whip)
    app.router.add_delete("/sessions/{session_id}/whep/{viewer_id}", leave)
    app.router.add_get("/sessions/{session_id}/outputs", list_outputs)
    app.router.add_post("/sessions/{session_id}/outputs", add_output)
    app.router.add_delete("/sessions/{session_id}/outputs/{output_id}", remove_output)
