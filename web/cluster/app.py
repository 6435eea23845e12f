"""The front's HTTP app: the same API as one process, served by workers behind it.

``lipstream serve`` with ``cluster.workers: N`` runs this app instead of the single-process
one (``docs/design/cluster.md`` §14):

- ``POST /offer`` is checked here by the same gate as in one process
  (``web/offer_gate.py``: draining, the per-address rate limit, the body cap, the JSON,
  the session token, the SDP) before any worker is asked; then it goes to the first
  worker :func:`~web.cluster.placement.candidates` names that accepts it. A worker that
  refuses for capacity (503) is skipped for the next; when all refuse, the caller gets
  503 + Retry-After with their reasons.
- ``POST /sessions``, ``POST /whip/{avatar}`` and ``POST /livekit/sessions`` (no SDK
  here: ``web/livekit.py``) are checked the same way and placed as an offer is.
- ``/sessions/{id}`` and everything under it go to the worker named in the id (404 when no
  worker has that name, ``410 session_lost`` when the worker restarted since); the audio
  stream's WebSocket and the event stream are relayed as they flow (``web/cluster/relay.py``).
- ``/v1/infer/{model_id}`` goes where that model is loaded (placement as for a call), and
  so do the Open Inference Protocol's model routes; its health, metadata, repository and
  statistics are the front's own or cover every worker (``web/cluster/inference_protocol.py``).
- ``/health`` (200 unless the front gave up on its Ray runtime, ``web/cluster/front.py``),
  ``/ready`` (200 while at least one worker answers, the runtime is there and the front is
  not draining) and ``/admin/workers`` (each worker's last report) are the front's own;
  ``/admin/sessions``, ``/admin/models``, ``/admin/stats``, ``/admin/history``, model loads
  and unloads, and ``/metrics`` cover every worker (``web/cluster/aggregate.py``); an
  avatar import goes to every worker in turn (``web/cluster/avatar_import.py``).
- Anything else (the demo page, the admin page, ``/avatars``, ``/webrtc-config``) goes to
  a worker that answers.

Requests are forwarded with their method, path, query, headers and body; responses come
back with their status, JSON error body and ``Retry-After``. Media never passes here. The
app starts from the same edge as one process's (``web/edge.py``: guard, middlewares, drain
flag, liveness); ``web/serve.py`` serves it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from config.settings import Settings
from streaming.exceptions import SessionLimitError
from web import livekit
from web.admin_auth import Handler, admin_denial, admin_only
from web.app_keys import DRAINING, LIVENESS, SETTINGS
from web.cluster import aggregate, avatar_import
from web.cluster import inference_protocol as v2
from web.cluster.front import ClusterFront
from web.cluster.placement import WorkerState, candidates, parse_session_id
from web.cluster.relay import relay_event_stream, relay_websocket
from web.edge import edge_app
from web.errors import RequestError
from web.health import health
from web.inference import rest
from web.offer_gate import check_offer_request, refuse_if_rate_limited
from web.request_body import parse_body, read_limited
from web.schemas import NewSession
from web.session_tokens import require_token

logger = logging.getLogger(__name__)

FRONT = web.AppKey("cluster_front", ClusterFront)
HTTP = web.AppKey("cluster_http", aiohttp.ClientSession)

#: Request headers not passed on: hop-by-hop, or the worker's own (Host). Content-Length
#: is kept: the body goes on unchanged (streamed, or the offer's bytes as read).
_DROPPED_REQUEST = {"host", "transfer-encoding", "connection", "keep-alive"}
#: Response headers passed back.
_KEPT_RESPONSE = (
    "Content-Type",
    "Retry-After",
    "Cache-Control",
    "Last-Modified",
    "ETag",
    "Location",  # a created session's, a WHEP viewer's: paths, the same at the front
    "Link",  # a WHEP answer's ICE servers, one header each
)
#: Seconds a refused caller is told to wait when no worker has room.
RETRY_AFTER_S = 5


def build_front_app(settings: Settings, *, front: ClusterFront | None = None) -> web.Application:
    """The front app; ``front`` is a :class:`ClusterFront` made beforehand (started here
    with the app, closed with it), else one is made here."""
    app = edge_app(settings)

    async def workers(app: web.Application) -> AsyncIterator[None]:
        app[FRONT] = front or ClusterFront(settings)
        # A front that cannot bring its Ray runtime back fails /health and exits non-zero.
        await app[FRONT].start(give_up=app[LIVENESS].fail)
        timeout = aiohttp.ClientTimeout(total=settings.server.request_timeout_s)
        app[HTTP] = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        yield
        await app[HTTP].close()
        await app[FRONT].close()

    app.cleanup_ctx.append(workers)
    router = app.router
    router.add_post("/offer", offer)
    router.add_post("/sessions", new_session)
    router.add_post("/whip/{avatar}", whip)
    router.add_post("/livekit/sessions", livekit.placed_by(_place))
    router.add_route("*", "/sessions/{session_id}", to_session)
    router.add_route("*", "/sessions/{session_id}/{tail:.*}", to_session)
    router.add_route("*", "/v1/infer/{model_id}", to_model)
    router.add_get("/health", health)
    router.add_get("/ready", ready)
    router.add_get("/admin/workers", admin_only(list_workers))
    router.add_get("/admin/sessions", admin_only(_view(aggregate.session_list)))
    router.add_get("/admin/models", admin_only(_view(aggregate.models)))
    router.add_get("/admin/stats", admin_only(_view(aggregate.stats)))
    router.add_get("/admin/history", admin_only(_view(aggregate.history)))
    router.add_post(
        "/admin/models/{model_id}/{action:load|unload}", admin_only(_view(aggregate.model_action))
    )
    router.add_delete("/admin/sessions/{session_id}", admin_only(to_session))
    router.add_post("/admin/avatars/import", admin_only(_view(avatar_import.import_everywhere)))
    router.add_get("/metrics", _view(aggregate.metrics))
    _add_inference_protocol_routes(router)
    router.add_route("*", "/{tail:.*}", to_any)
    return app


def _add_inference_protocol_routes(router: web.UrlDispatcher) -> None:
    """``/v2`` as one process serves it (``web/inference/rest.py``), over the workers."""

    def route(method: str, path: str, handler: Handler) -> None:
        router.add_route(method, path, rest.protocol_errors(handler))

    route("GET", "/v2/health/live", rest.live)
    route("GET", "/v2/health/ready", protocol_ready)
    route("GET", "/v2", rest.server_metadata)
    # Before the model routes: "stats" is not a model.
    route("GET", "/v2/models/stats", _protocol(v2.statistics))
    for model in ("/v2/models/{model_id}", "/v2/models/{model_id}/versions/{version}"):
        route("GET", f"{model}/stats", _protocol(v2.statistics))
        for method, tail in (
            ("GET", ""),
            ("GET", "/ready"),
            ("GET", "/config"),
            ("POST", "/infer"),
        ):
            route(method, model + tail, _protocol(v2.to_model))
    route("POST", "/v2/repository/index", _protocol(v2.repository_index))
    route(
        "POST",
        "/v2/repository/models/{model_id}/{action:load|unload}",
        _protocol(v2.repository_action),
    )


def _view(view: aggregate.View) -> Handler:
    """An aggregate view as a route handler."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await view(request, request.app[FRONT], request.app[HTTP])

    return handler


def _protocol(view: v2.ProtocolView) -> Handler:
    """A protocol view of the front as a route handler."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await view(request, request.app[FRONT], request.app[HTTP])

    return handler


async def offer(request: web.Request) -> web.Response:
    """Check the offer here, then ask the best workers in turn (module doc)."""
    checked = await check_offer_request(request)
    return await _place(request, checked.body.avatar_id, checked.raw)


async def new_session(request: web.Request) -> web.Response:
    """A session no caller owns: checked as in one process, placed as a call is."""
    settings = request.app[SETTINGS]
    if request.app[DRAINING].draining:
        raise SessionLimitError("the server is shutting down; try again shortly")
    refuse_if_rate_limited(request)
    raw = await read_limited(request, settings.server.max_offer_bytes, "the JSON body")
    body = parse_body(NewSession, raw, example='{"avatar": "demo"}')
    require_token(request, settings.auth, body.avatar_id)
    return await _place(request, body.avatar_id, raw)


async def whip(request: web.Request) -> web.Response:
    """A WHIP publisher's offer (``POST /whip/{avatar}``): checked as in one process as far
    as a front can (draining, rate, size, token), then placed as an offer is."""
    settings = request.app[SETTINGS]
    if request.app[DRAINING].draining:
        raise SessionLimitError("the server is shutting down; try again shortly")
    refuse_if_rate_limited(request)
    avatar = request.match_info["avatar"]
    require_token(request, settings.auth, avatar)
    raw = await read_limited(request, settings.server.max_offer_bytes, "the SDP offer")
    return await _place(request, avatar, raw)


async def _place(request: web.Request, avatar_id: str, raw: bytes) -> web.Response:
    """Forward a new session's request to the best workers in turn (module doc)."""
    front = request.app[FRONT]
    tried = candidates(avatar_id, list(front.workers.values()))
    if not tried:
        up = sum(w.usable for w in front.workers.values())
        raise RequestError(
            503,
            "too_many_sessions",
            f"no worker has room for another session ({up} of {len(front.workers)} "
            "workers answering); try again later",
            retry_after=RETRY_AFTER_S,
        )
    refusals = []
    for worker in tried:
        try:
            response = await _forward(request, worker, raw)
        except RequestError as exc:  # it did not answer: the next one may
            refusals.append(f"{worker.name}: {exc}")
            continue
        if response.status != 503:
            front.report_soon(worker.name)  # its load changed: placement sees it at once
            return response
        refusals.append(f"{worker.name}: {_message(response)}")
    raise RequestError(
        503, "too_many_sessions", "; ".join(refusals)[:1000], retry_after=RETRY_AFTER_S
    )


async def to_session(request: web.Request) -> web.StreamResponse:
    """A session's request, to the worker that holds the session."""
    session_id = request.match_info["session_id"]
    address = parse_session_id(session_id)
    worker = request.app[FRONT].workers.get(address.worker) if address is not None else None
    if address is None or worker is None:
        raise RequestError(404, "session_not_found", f"no live session {session_id[:64]!r}")
    report = worker.report
    if report is not None and report.incarnation != address.incarnation:
        raise RequestError(
            410,
            "session_lost",
            f"session {session_id[:64]!r} was lost: its worker {worker.name} restarted",
        )
    if not worker.answering or report is None:
        raise RequestError(
            503,
            "worker_unavailable",
            f"the worker of session {session_id[:64]!r} ({worker.name}) is not answering",
            retry_after=1,
        )
    admin = request.path.startswith("/admin/")  # a hang-up by an admin, let in at the front
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await relay_websocket(request, worker, request.app[HTTP])
    if request.match_info.get("tail") == "events":
        return await relay_event_stream(request, worker, request.app[HTTP])
    return await _forward(request, worker, request.content, admin=admin)


async def to_model(request: web.Request) -> web.StreamResponse:
    """A raw inference request, to a worker holding the model (else the one with most room)."""
    model_id = request.match_info["model_id"]
    workers = candidates(model_id, list(request.app[FRONT].workers.values()))
    if not workers:
        raise RequestError(
            503, "worker_unavailable", "no worker is answering", retry_after=RETRY_AFTER_S
        )
    return await _forward(request, workers[0], request.content)


async def to_any(request: web.Request) -> web.StreamResponse:
    """Anything else, to a worker that answers (they all serve the same pages)."""
    admin = request.path == "/admin" or request.path.startswith("/admin/")
    if admin:  # the operator's rule, here; the worker then takes the front's token
        token = request.app[SETTINGS].server.admin_token
        denial = admin_denial(request, token, page=request.path == "/admin")
        if denial is not None:
            return denial
    answering = [w for w in request.app[FRONT].workers.values() if w.answering]
    if not answering:
        raise RequestError(
            503, "worker_unavailable", "no worker is answering", retry_after=RETRY_AFTER_S
        )
    return await _forward(request, answering[0], request.content, admin=admin)


def unready_reasons(app: web.Application) -> list[str]:
    """Why the front is not ready: no worker answering, no Ray runtime, or draining."""
    front = app[FRONT]
    workers = front.workers.values()
    reasons = []
    if front.problem is not None:  # the runtime died: being restarted, reconnected to, or lost
        reasons.append(front.problem)
    if not any(w.usable for w in workers):
        reasons.append(f"none of the {len(workers)} workers is answering")
    if app[DRAINING].draining:
        reasons.append("the server is draining: it takes no new sessions")
    return reasons


async def ready(request: web.Request) -> web.Response:
    """200 while at least one worker answers, the Ray runtime is there and the front is not
    draining; else 503 with every reason."""
    workers = request.app[FRONT].workers.values()
    up = sum(w.usable for w in workers)
    reasons = unready_reasons(request.app)
    body: dict[str, Any] = {"ready": not reasons, "workers": {"up": up, "total": len(workers)}}
    if reasons:
        body["reasons"] = reasons
    return web.json_response(body, status=503 if reasons else 200)


async def protocol_ready(request: web.Request) -> web.Response:
    """``/v2/health/ready``: ``/ready``'s rule, in the protocol's shape."""
    reasons = unready_reasons(request.app)
    if reasons:
        raise RequestError(503, "not_ready", "; ".join(reasons))
    return web.json_response({"ready": True})


async def list_workers(request: web.Request) -> web.Response:
    """Every worker's state and last report."""
    return web.json_response(
        {"workers": [_worker_json(w) for w in request.app[FRONT].workers.values()]}
    )


def _worker_json(worker: WorkerState) -> dict[str, Any]:
    r = worker.report
    return {
        "name": worker.name,
        "answering": worker.answering,
        "failures": worker.failures,
        "restarts": worker.restarts,
        "last_error": worker.last_error,
        "report": None
        if r is None
        else {
            "incarnation": r.incarnation,
            "url": r.url,
            "node": r.node,
            "node_id": r.node_id,
            "pid": r.pid,
            "models": sorted(r.models),
            "live_sessions": r.live_sessions,
            "room_places": r.room_places,
            "room_share": round(r.room_share, 4),
            "draining": r.draining,
            "gpus": r.gpus,
        },
    }


async def _forward(
    request: web.Request,
    worker: WorkerState,
    body: bytes | aiohttp.StreamReader,
    *,
    admin: bool = False,
) -> web.Response:
    """``request`` as sent to ``worker`` (its body read already, or streamed through as it
    arrives: the worker applies its own size limits); its answer, or 503 when it does not
    answer."""
    assert worker.report is not None
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED_REQUEST}
    headers["X-Forwarded-For"] = request.remote or "unknown"
    if admin:
        token = request.app[FRONT].worker_admin_token.get_secret_value()
        headers["Authorization"] = f"Bearer {token}"
    url = worker.report.url + request.path_qs
    try:
        async with request.app[HTTP].request(
            request.method,
            url,
            headers=headers,
            data=body if request.body_exists else None,
            allow_redirects=False,
        ) as answer:
            payload = await answer.read()
            kept = CIMultiDict((k, v) for k in _KEPT_RESPONSE for v in answer.headers.getall(k, ()))
            return web.Response(status=answer.status, body=payload, headers=kept)
    except (aiohttp.ClientError, TimeoutError) as exc:
        worker.answering = False  # until its next report says otherwise
        worker.last_error = f"{type(exc).__name__}: {exc}"[:300]
        request.app[FRONT].report_soon(worker.name)  # restarted? its new incarnation tells
        logger.warning("cluster: worker %s did not answer %s: %r", worker.name, url, exc)
        raise RequestError(
            503, "worker_unavailable", f"worker {worker.name} did not answer", retry_after=1
        ) from None


def _message(response: web.Response) -> str:
    try:
        return str(json.loads(response.body)["error"]["message"])  # type: ignore[arg-type]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status}"
