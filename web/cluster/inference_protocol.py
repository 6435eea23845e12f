"""The front's Open Inference Protocol v2 over REST: one process's ``/v2``, over the workers.

- ``/v2/health/live`` and ``/v2`` are the front's own; ``/v2/health/ready`` follows the
  front's ``/ready`` (at least one worker answering, the Ray runtime there, not draining;
  ``web/cluster/app.py``).
- ``/v2/models/{m}[/versions/{v}]`` (metadata), ``…/ready``, ``…/config`` and ``…/infer``
  go to a worker that holds the model, else the one with most room (placement as for
  ``/v1/infer``, ``web/cluster/placement.py``). Both bodies stream through: the request's
  as it arrives, the answer's as the worker writes it, so the front holds neither.
- ``/v2/models/stats`` and ``/v2/models/{m}[/versions/{v}]/stats``: every worker's
  figures, summed per model (a model loaded on two workers ran on both).
- ``/v2/repository/index``: one entry per model over the workers: ``READY`` where any
  worker has it loaded, else ``LOADING`` where one loads it, else ``UNAVAILABLE``.
- ``/v2/repository/models/{m}/load``: the operator's admin rule here, then on the worker
  placement picks (or the one whose device the ``device`` parameter names: an index into
  the front's ``/admin/stats`` device list); ``…/unload`` on every worker holding it.

Errors leave in the protocol's shape (``{"error": "message"}``), the workers' as they sent
them. The workers' repository calls carry the workers' admin token
(``web/cluster/aggregate.py``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from inference_core.avatars.package import check_avatar_id
from web.cluster.aggregate import device_index, gather
from web.cluster.front import ClusterFront
from web.cluster.placement import WorkerState, candidates
from web.errors import RequestError
from web.inference.binary_tensors import parse_json
from web.inference.contract import parse_version
from web.inference.rest import MAX_REPOSITORY_BODY, check_admin
from web.request_body import read_limited, validate
from web.schemas.inference_protocol import OipIndexRequest, OipModelStats, OipRepositoryModel

logger = logging.getLogger(__name__)

#: A front route of the protocol: the request, the front, the HTTP client to the workers.
ProtocolView = Callable[
    [web.Request, ClusterFront, aiohttp.ClientSession], Awaitable[web.StreamResponse]
]
#: Request headers not relayed: hop-by-hop, or the worker's own (Host).
_NOT_RELAYED = {"host", "transfer-encoding", "connection", "keep-alive"}
#: Response headers relayed back (the binary extension's among them).
_RELAYED = ("Content-Type", "Retry-After", "Inference-Header-Content-Length")
_RELAY_CHUNK = 1 << 20
_RANK = {"READY": 0, "LOADING": 1, "UNAVAILABLE": 2}
RETRY_AFTER_S = 5


def _no_worker() -> RequestError:
    return RequestError(
        503, "worker_unavailable", "no worker is answering", retry_after=RETRY_AFTER_S
    )


async def to_model(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.StreamResponse:
    """A model's request, relayed to a worker holding the model (module doc)."""
    workers = candidates(request.match_info["model_id"], list(front.workers.values()))
    if not workers:
        raise _no_worker()
    worker = workers[0]
    assert worker.report is not None
    url = worker.report.url + request.path_qs
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_RELAYED}
    headers["X-Forwarded-For"] = request.remote or "unknown"
    response = web.StreamResponse()
    try:
        async with http.request(
            request.method,
            url,
            headers=headers,
            data=request.content if request.body_exists else None,
            allow_redirects=False,
        ) as answer:
            response.set_status(answer.status)
            for name in _RELAYED:
                if name in answer.headers:
                    response.headers[name] = answer.headers[name]
            response.content_length = answer.content_length
            await response.prepare(request)
            async for chunk in answer.content.iter_chunked(_RELAY_CHUNK):
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientError, TimeoutError) as exc:
        worker.last_error = f"{type(exc).__name__}: {exc}"[:300]
        front.report_soon(worker.name)
        if response.prepared:  # mid-answer: the client must see it cut, not wait for more
            logger.warning("cluster: worker %s stopped answering %s: %r", worker.name, url, exc)
            if request.transport is not None:
                request.transport.close()
            return response
        worker.answering = False  # until its next report says otherwise
        logger.warning("cluster: worker %s did not answer %s: %r", worker.name, url, exc)
        raise RequestError(
            503, "worker_unavailable", f"worker {worker.name} did not answer", retry_after=1
        ) from None


async def statistics(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.Response:
    """Every worker's statistics summed per model; of one model when the path names one."""
    model_id = request.match_info.get("model_id")
    if model_id is not None:
        check_avatar_id(model_id)
        parse_version(model_id, request.match_info.get("version", ""))
    answers, unavailable = await gather(front, http, "GET", "/v2/models/stats")
    if not answers:
        raise RequestError(
            503, "worker_unavailable", "no worker answered: " + "; ".join(unavailable.values())
        )
    merged: dict[str, OipModelStats] = {}
    for body in answers.values():
        for entry in body["model_stats"]:
            stats = OipModelStats.model_validate(entry)
            seen = merged.get(stats.name)
            merged[stats.name] = stats if seen is None else _summed(seen, stats)
    if model_id is not None:
        if model_id not in merged:
            raise RequestError(404, "model_not_found", f"no model {model_id!r}")
        merged = {model_id: merged[model_id]}
    listed = [merged[name].model_dump(mode="json") for name in sorted(merged)]
    return web.json_response({"model_stats": listed})


def _summed(a: OipModelStats, b: OipModelStats) -> OipModelStats:
    """One model's figures from two workers: counts and times added, the latest inference."""

    def add(x: Any, y: Any) -> Any:
        if isinstance(x, dict):
            return {key: add(x[key], y[key]) for key in x}
        return x + y if isinstance(x, int) else x

    left, right = a.model_dump(), b.model_dump()
    merged = {key: add(left[key], right[key]) for key in left}
    merged["last_inference"] = max(a.last_inference, b.last_inference)
    return OipModelStats.model_validate(merged)


async def repository_index(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.Response:
    """Every model once, in its best state on any worker (module doc)."""
    raw = await read_limited(request, MAX_REPOSITORY_BODY)
    wanted = validate(OipIndexRequest, parse_json(raw, "the body") if raw.strip() else {})
    answers, unavailable = await gather(
        front, http, "POST", "/v2/repository/index", body={"ready": False}
    )
    if not answers:
        raise RequestError(
            503, "worker_unavailable", "no worker answered: " + "; ".join(unavailable.values())
        )
    best: dict[str, OipRepositoryModel] = {}
    for body in answers.values():
        for entry in body:
            model = OipRepositoryModel.model_validate(entry)
            seen = best.get(model.name)
            if seen is None or _RANK[model.state] < _RANK[seen.state]:
                best[model.name] = model
    listed = [
        best[name].model_dump(mode="json")
        for name in sorted(best)
        if not wanted.ready or best[name].state == "READY"
    ]
    return web.json_response(listed)


async def repository_action(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.Response:
    """Load where placement (or the named device) says, or unload everywhere it is held."""
    check_admin(request)
    model_id = check_avatar_id(request.match_info["model_id"])
    action = request.match_info["action"]
    raw = await read_limited(request, MAX_REPOSITORY_BODY)
    body = parse_json(raw, "the body") if raw.strip() else {}  # the worker checks the rest
    answering = [w for w in front.workers.values() if w.answering and w.report is not None]
    if action == "load":
        targets = candidates(model_id, list(front.workers.values()))[:1]
        parameters = body.get("parameters")
        device = parameters.get("device") if isinstance(parameters, dict) else None
        if device is not None:  # an index into /admin/stats' devices: that worker's device
            name, local = await device_index(front, http, device)
            targets = [front.workers[name]]
            body = {**body, "parameters": {**(parameters or {}), "device": local}}
    else:
        held = [w for w in answering if w.report is not None and model_id in w.report.models]
        targets = held or answering[:1]  # held nowhere: one worker says 200 or 404
    if not targets:
        raise _no_worker()
    path = f"/v2/repository/models/{model_id}/{action}"
    for worker in targets:
        await _repository_call(front, http, worker, path, body)
        front.report_soon(worker.name)
    return web.Response(status=200)


async def _repository_call(
    front: ClusterFront,
    http: aiohttp.ClientSession,
    worker: WorkerState,
    path: str,
    body: dict[str, Any],
) -> None:
    """``POST path`` on ``worker`` with the workers' admin token; its error, if it sent one,
    raised as it came (status and message)."""
    assert worker.report is not None
    token = front.worker_admin_token.get_secret_value()
    # A load may take as long as any request may (a model's load and warm-up).
    timeout = aiohttp.ClientTimeout(total=front.settings.server.request_timeout_s)
    try:
        async with http.post(
            worker.report.url + path,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        ) as answer:
            if answer.status == 200:
                return
            text = await answer.text()
            retry_after = answer.headers.get("Retry-After")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise RequestError(
            503, "worker_unavailable", f"worker {worker.name} did not answer: {exc!r}"[:300]
        ) from None
    try:
        message = str(json.loads(text)["error"])
    except (ValueError, KeyError, TypeError):
        message = text[:300]
    raise RequestError(
        answer.status,
        "worker_error",
        f"worker {worker.name}: {message}",
        retry_after=int(retry_after) if retry_after and retry_after.isdigit() else None,
    )
