"""The front's relays for a session's long-lived routes: its audio WebSocket and its events.

A request/response is forwarded whole (``web/cluster/app.py``); these two flow for as
long as the session lives, so they are relayed as they go, message by message and chunk
by chunk, with no total timeout. The worker applies its own checks: a stream it refuses
before the upgrade is refused here with its status and JSON error body (asked again over
plain HTTP, since a failed WebSocket handshake carries no body), and the close code and
reason of either side reach the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from aiohttp import WSMsgType, web

from web.cluster.placement import WorkerState
from web.errors import RequestError

logger = logging.getLogger(__name__)

#: Request headers the relay sets itself (hop-by-hop, or the WebSocket handshake's own).
_NOT_RELAYED = {
    "host",
    "connection",
    "upgrade",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
}
#: Seconds the second half of a relay may take to close once the first has.
CLOSE_S = 5.0
#: No total deadline: the stream lasts as long as the session; a dead worker ends it.
_LONG_LIVED = aiohttp.ClientTimeout(total=None, connect=10.0, sock_connect=10.0)


def _headers(request: web.Request) -> dict[str, str]:
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_RELAYED}
    headers["X-Forwarded-For"] = request.remote or "unknown"
    return headers


def _worker_url(worker: WorkerState, request: web.Request) -> str:
    assert worker.report is not None
    return worker.report.url + request.path_qs


async def relay_websocket(
    request: web.Request, worker: WorkerState, http: aiohttp.ClientSession
) -> web.StreamResponse:
    """Relay a session's audio WebSocket to its worker, both ways, until either closes."""
    url = _worker_url(worker, request)
    try:
        upstream = await http.ws_connect(
            url, headers=_headers(request), max_msg_size=0, timeout=aiohttp.ClientWSTimeout()
        )
    except aiohttp.WSServerHandshakeError:
        return await _refusal(request, url, http)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise RequestError(
            503, "worker_unavailable", f"worker {worker.name} did not answer", retry_after=1
        ) from exc
    downstream = web.WebSocketResponse(max_msg_size=0, heartbeat=30.0)
    try:
        await downstream.prepare(request)
        pumps = [
            asyncio.create_task(_pump(downstream, upstream), name="relay-to-worker"),
            asyncio.create_task(_pump(upstream, downstream), name="relay-to-client"),
        ]
        try:
            _, running = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            # One side closed and the pump passed the close on: let the other finish its
            # closing handshake (cancelled mid-close, aiohttp drops the socket: 1006).
            await asyncio.wait(running, timeout=CLOSE_S)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
    finally:
        code = upstream.close_code or downstream.close_code or 1000
        with contextlib.suppress(Exception):
            await asyncio.wait_for(upstream.close(code=code), CLOSE_S)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(downstream.close(code=code), CLOSE_S)
    return downstream


async def _pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> None:
    """Copy messages from ``source`` to ``sink`` until ``source`` closes; pass its close on."""
    async for message in source:
        if message.type == WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        elif message.type == WSMsgType.ERROR:
            break
    code = source.close_code or 1000
    reason = b"" if code == 1000 else str(code).encode()
    await sink.close(code=code, message=reason)


async def _refusal(request: web.Request, url: str, http: aiohttp.ClientSession) -> web.Response:
    """The worker refused the handshake: ask it why over plain HTTP, and answer that."""
    async with http.get(url, headers=_headers(request)) as answer:
        body = await answer.read()
        kept = {
            k: answer.headers[k] for k in ("Content-Type", "Retry-After") if k in answer.headers
        }
        return web.Response(status=answer.status, body=body, headers=kept)


async def relay_event_stream(
    request: web.Request, worker: WorkerState, http: aiohttp.ClientSession
) -> web.StreamResponse:
    """Relay a session's server-sent events from its worker, chunk by chunk."""
    url = _worker_url(worker, request)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    try:
        async with http.get(url, headers=_headers(request), timeout=_LONG_LIVED) as answer:
            if answer.status != 200:  # a refusal: its JSON body as is
                kept = {"Content-Type": answer.headers.get("Content-Type", "application/json")}
                return web.Response(status=answer.status, body=await answer.read(), headers=kept)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
    except (aiohttp.ClientError, TimeoutError) as exc:
        if response.prepared:  # mid-stream: the client sees the stream end
            logger.info("cluster: event stream from %s ended: %r", worker.name, exc)
            return response
        raise RequestError(
            503, "worker_unavailable", f"worker {worker.name} did not answer", retry_after=1
        ) from exc
    return response
