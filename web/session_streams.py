"""A session's long-lived routes: audio streamed in over a WebSocket, events out over SSE.

GET /sessions/{id}/audio/stream   WebSocket: PCM messages in, the session's events out
GET /sessions/{id}/events         server-sent events: the session's events

The protocol is ``docs/apps.md``. Everything that can be refused is refused before the
upgrade or the first byte, with the usual JSON error (unknown session, token, declared
format, a second stream). After that, a message the server cannot use gets an ``error``
message and the connection stays open: one bad message loses nothing else.

Both routes read the session's events through a bounded listener
(:mod:`streaming.live.events`). A write that cannot go out for :data:`SEND_TIMEOUT_S`
means the client stopped reading; like a listener that overflows, it ends the
connection, so neither a slow reader's memory nor its socket grows without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiohttp import WSMsgType, web

from streaming.audio_in.exceptions import AudioFrameError, AudioQueueFullError
from streaming.audio_in.stream import MAX_MESSAGE_S, STREAM_RATES, StreamFormat
from streaming.live.events import EventListener, error_event, message_type
from streaming.live.session import Session
from streaming.live.stream_in import AudioStreamIn
from web.app_keys import SESSIONS, SETTINGS
from web.errors import RequestError
from web.session_controls import CHANGES, change
from web.session_tokens import require_token

logger = logging.getLogger(__name__)

#: Seconds one event may take to go out before the client counts as not reading.
SEND_TIMEOUT_S = 10.0
#: Seconds between keep-alive comments on an idle event stream (proxies close silent ones).
KEEPALIVE_S = 15.0
#: Close code and reason for a client that fell too far behind (RFC 6455: policy).
OVERFLOW_CLOSE = (1008, b"events_overflow")
#: The largest binary message: a second of f32le at the highest rate, with room to spare.
MAX_MESSAGE_BYTES = int(max(STREAM_RATES) * 4 * MAX_MESSAGE_S) + 1024


def _session(request: web.Request) -> Session:
    """The session in the path; its token may come as ``?token=`` (browsers' WebSocket
    and EventSource cannot set headers)."""
    session = request.app[SESSIONS].get(request.match_info["session_id"])
    require_token(request, request.app[SETTINGS].auth, session.avatar_id, query=True)
    return session


async def audio_stream(request: web.Request) -> web.WebSocketResponse:
    """Stream PCM into a session as it is made; the session's events come back."""
    session = _session(request)
    stream_format = StreamFormat.parse(request.query)
    # Before the upgrade check: a browser learns why its handshake failed by asking the
    # same URL over plain HTTP, and should hear "busy" then, not "not a WebSocket".
    session.app_audio.check_stream_free()
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, heartbeat=30.0)
    if not ws.can_prepare(request).ok:
        raise RequestError(
            400,
            "websocket_required",
            "this route is a WebSocket: connect with ws:// or wss:// (docs/apps.md)",
        )
    stream = session.app_audio.open_stream(stream_format)  # 409 while another stream is open
    listener = session.events.listen()
    lagging: list[asyncio.Task[None]] = []
    listener.on_overflow = lambda: lagging.append(
        asyncio.create_task(_close_lagging(ws, request), name="ws-close-lagging")
    )
    try:
        await ws.prepare(request)
        await ws.send_json(
            {
                "type": "ready",
                "session_id": session.session_id,
                "format": stream_format.format,
                "rate": stream_format.rate,
                "max_buffer_ms": round(stream.max_buffer_s * 1000),
            }
        )
        sender = asyncio.create_task(
            _send_events(ws, listener, request), name=f"ws-events-{session.session_id[:8]}"
        )
        try:
            await _receive(ws, stream, session, request.app)
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    finally:
        stream.close()
        listener.close()
        await asyncio.gather(*lagging, return_exceptions=True)
    return ws


async def _close_lagging(ws: web.WebSocketResponse, request: web.Request) -> None:
    """Close a stream whose client stopped reading events: 1008 ``events_overflow`` if
    the close can still go out, else drop the connection."""
    logger.info("event reader too slow: %s; closing", request.path)
    try:
        await asyncio.wait_for(ws.close(code=OVERFLOW_CLOSE[0], message=OVERFLOW_CLOSE[1]), 2.0)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()


async def _receive(
    ws: web.WebSocketResponse, stream: AudioStreamIn, session: Session, app: web.Application
) -> None:
    """Take the client's messages until it closes (or the sender closes the socket)."""
    async for message in ws:
        if message.type == WSMsgType.BINARY:
            try:
                stream.write(message.data)
            except AudioFrameError as exc:
                await _send_error(ws, "bad_frame", str(exc))
            except AudioQueueFullError as exc:
                seconds = stream.decoder.samples_in(message.data) / stream.decoder.format.rate
                await _send_error(
                    ws,
                    "audio_queue_full",
                    str(exc),
                    refused_ms=round(seconds * 1000, 1),
                    queued_ms=round(session.queued_audio_s * 1000, 1),
                )
        elif message.type == WSMsgType.TEXT:
            await _control(ws, stream, session, message.data, app)
        elif message.type == WSMsgType.ERROR:
            logger.info(
                "audio stream failed: session=%s error=%r", session.session_id, ws.exception()
            )
            return


async def _control(
    ws: web.WebSocketResponse,
    stream: AudioStreamIn,
    session: Session,
    text: str,
    app: web.Application,
) -> None:
    kind = message_type(text)
    if kind == "end":
        stream.end()
    elif kind == "interrupt":
        session.interrupt()
    elif kind in CHANGES:

        async def send(event: dict[str, Any]) -> None:
            if not ws.closed:
                await asyncio.wait_for(ws.send_json(event), SEND_TIMEOUT_S)

        session.run_control(change(app, session, text, send))
    else:
        await _send_error(
            ws,
            "bad_message",
            'text messages are JSON objects: {"type": "end"}, {"type": "interrupt"}, '
            '{"type": "switch_avatar", "avatar": "..."} or {"type": "set_idle_clip", '
            '"clip": "..."}; audio goes in binary messages',
        )


async def _send_error(ws: web.WebSocketResponse, code: str, message: str, **extra: float) -> None:
    if not ws.closed:
        await asyncio.wait_for(ws.send_json(error_event(code, message, **extra)), SEND_TIMEOUT_S)


async def _send_events(
    ws: web.WebSocketResponse, listener: EventListener, request: web.Request
) -> None:
    """Forward the session's events; close when the session ends or the client lags."""
    try:
        async for event in listener:
            await asyncio.wait_for(ws.send_json(event), SEND_TIMEOUT_S)
    except TimeoutError:  # one event could not go out in time: the client is not reading
        await _close_lagging(ws, request)
        return
    except ConnectionError:
        return
    if listener.overflowed:
        return  # on_overflow closes it
    # The session ended (its session_ended went out) or the client left.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ws.close(code=1000, message=b"session ended"), SEND_TIMEOUT_S)


async def session_events(request: web.Request) -> web.StreamResponse:
    """The session's events as server-sent events, until it ends."""
    session = _session(request)
    listener = session.events.listen()
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # nginx: pass each event on at once
        }
    )
    try:
        await response.prepare(request)
        await response.write(b": lipstream events\n\n")
        while True:
            try:
                event = await asyncio.wait_for(listener.get(), KEEPALIVE_S)
            except TimeoutError:
                await asyncio.wait_for(response.write(b": keepalive\n\n"), SEND_TIMEOUT_S)
                continue
            if event is None:
                break
            block = f"id: {event['seq']}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n"
            await asyncio.wait_for(response.write(block.encode()), SEND_TIMEOUT_S)
        if listener.overflowed:
            error = error_event("events_overflow", "this reader fell too far behind the events")
            with contextlib.suppress(TimeoutError):
                data = f"event: error\ndata: {json.dumps(error)}\n\n".encode()
                await asyncio.wait_for(response.write(data), SEND_TIMEOUT_S)
    except TimeoutError:
        logger.info("event reader too slow: session=%s; closing", session.session_id)
        if request.transport is not None:
            request.transport.abort()
    except ConnectionError:
        pass
    finally:
        listener.close()
    return response


def add_stream_routes(app: web.Application) -> None:
    app.router.add_get("/sessions/{session_id}/audio/stream", audio_stream)
    app.router.add_get("/sessions/{session_id}/events", session_events)
