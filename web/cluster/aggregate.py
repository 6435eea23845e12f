"""The front's operator views: every worker's admin figures and metrics in one answer.

Each view asks every answering worker at once, each within ``cluster.report_timeout_s``
(a slow worker never holds the answer up: it is listed under ``unavailable``), and adds
who answered: ``worker`` and ``node`` fields in the admin JSON, ``worker`` and ``node``
labels on every Prometheus series (never per-model or per-session labels,
``docs/design/cluster.md`` §14).

- ``GET /admin/sessions``: every worker's sessions, each with its worker and node.
- ``GET /admin/models``: every worker's models, each with its worker and node; the same
  avatar appears once per worker.
- ``GET /admin/stats``: one process's shape over all workers, so the admin page works
  through the front: ``devices`` named ``<worker>/<device>``, ``models`` once per id
  (a loaded entry when there is one, ``loaded_on`` naming the workers, counts summed),
  the caches and the ``global`` counts summed; each worker's own under ``workers``.
- ``GET /admin/history``: every worker's chart series (:func:`merged_history`): devices
  named ``<worker>/<device>``, sessions as they are, each worker's server series under
  its name and, under ``server``, their sum per sample time (``cpu_ms_per_frame``: the
  mean).
- ``POST /admin/models/{id}/load?worker=w1`` and ``…/unload``: on the named worker; without
  ``worker``, a load goes where placement would put a call of that avatar and an unload
  goes to every worker that holds the model.
- ``GET /metrics``: the workers' series, labelled, then the front's own
  (``lipstream_cluster_workers{state}``, ``lipstream_cluster_worker_restarts_total``).

The front calls the workers' admin API with the workers' admin token: the operator's
``server.admin_token``, or, when none is set, one the front made at start (workers then
take admin calls only from the front or from their own machine). The operator's access
rule is applied at the front, to the front's own routes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from web.admin import MAX_LOAD_BODY
from web.cluster.front import ClusterFront
from web.cluster.placement import WorkerState, candidates
from web.errors import RequestError
from web.history import HISTORY_INTERVAL_S, HISTORY_POINTS, MAX_SERIES
from web.request_body import parse_json_object, read_limited

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: An aggregate view: the request, the front, and the HTTP client to reach the workers.
View = Callable[[web.Request, ClusterFront, aiohttp.ClientSession], Awaitable[web.Response]]
#: In ``/admin/stats``, summed over the workers: the caches' counts, each model's, and
#: the ``global`` counts.
_CACHE_SUMMED = ("hits", "misses", "evictions", "bytes", "max_bytes", "entries")
_MODEL_SUMMED = ("frames", "usage_count", "refcount")
_SUMMED = (
    "models_loaded",
    "live_sessions",
    "sessions_started",
    "sessions_ended",
    "sessions_rejected",
    "frames_served",
)


async def gather(
    front: ClusterFront,
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    workers: list[WorkerState] | None = None,
    *,
    text: bool = False,
    body: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """``method path`` on every answering worker (or ``workers``) at once, each within
    ``timeout_s`` (default ``cluster.report_timeout_s``): their answers by worker name,
    and why each one that did not answer did not."""
    answering = [w for w in front.workers.values() if w.answering]
    asked = workers if workers is not None else answering
    timeout = aiohttp.ClientTimeout(total=timeout_s or front.settings.cluster.report_timeout_s)
    headers = {"Authorization": f"Bearer {front.worker_admin_token.get_secret_value()}"}

    async def one(worker: WorkerState) -> Any:
        assert worker.report is not None
        url = worker.report.url + path
        async with http.request(
            method, url, headers=headers, timeout=timeout, json=body or None
        ) as answer:
            if answer.status >= 400:
                raise RequestError(answer.status, "worker_error", (await answer.text())[:300])
            return await (answer.text() if text else answer.json())

    results = await asyncio.gather(*(one(w) for w in asked), return_exceptions=True)
    answers: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    for worker, result in zip(asked, results, strict=True):
        if isinstance(result, BaseException):
            unavailable[worker.name] = f"{type(result).__name__}: {result}"[:300]
        else:
            answers[worker.name] = result
    for worker in front.workers.values():
        if worker not in asked and workers is None:
            unavailable[worker.name] = worker.last_error or "not answering"
    return answers, unavailable


def _where(front: ClusterFront, name: str) -> dict[str, str]:
    report = front.workers[name].report
    return {"worker": name, "node": report.node if report is not None else ""}


async def _listed(front: ClusterFront, http: aiohttp.ClientSession, key: str) -> web.Response:
    """``GET /admin/<key>`` of every worker: its ``key`` list, each item with its worker
    and node, and the workers that did not answer."""
    answers, unavailable = await gather(front, http, "GET", f"/admin/{key}")
    listed = [
        {**item, **_where(front, name)} for name, body in answers.items() for item in body[key]
    ]
    return web.json_response({key: listed, "unavailable": unavailable})


async def session_list(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.Response:
    return await _listed(front, http, "sessions")


async def models(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.Response:
    return await _listed(front, http, "models")


async def stats(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.Response:
    """One process's ``/admin/stats`` shape over every worker (so the admin page works
    through the front), plus each worker's own under ``workers``."""
    answers, unavailable = await gather(front, http, "GET", "/admin/stats")
    devices = [
        {**device, "name": f"{name}/{device['name']}", **_where(front, name)}
        for name, body in answers.items()
        for device in body["devices"]
    ]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for name, body in answers.items():
        for model in body["models"]:
            entry = {**model, **_where(front, name)}
            if model.get("device"):
                entry["device"] = f"{name}/{model['device']}"
            by_id.setdefault(model["id"], []).append(entry)
    summed: dict[str, Any] = dict.fromkeys(_SUMMED, 0)
    dropped: dict[str, int] = {}
    evictions: dict[str, int] = {}
    cache: dict[str, Any] = dict.fromkeys(_CACHE_SUMMED, 0)
    for body in answers.values():
        totals = body["global"]
        for key in _SUMMED:
            summed[key] += totals[key]
        for reason, count in totals["frames_dropped"].items():
            dropped[reason] = dropped.get(reason, 0) + count
        for reason, count in totals["evictions"].items():
            evictions[reason] = evictions.get(reason, 0) + count
        for key in _CACHE_SUMMED:
            cache[key] += body["cache"][key]
    looked_up = cache["hits"] + cache["misses"]
    cache["hit_rate"] = round(cache["hits"] / looked_up, 4) if looked_up else 0.0
    versions = {body["global"]["version"] for body in answers.values()}
    summed.update(
        frames_dropped=dropped,
        evictions=evictions,
        models_registered=len(by_id),
        uptime_s=round(time.monotonic() - front.started_at, 1),
        version=", ".join(sorted(versions)) or "unknown",
        workers_answering=len(answers),
        workers=len(front.workers),
    )
    return web.json_response(
        {
            "models": [_one_model(entries) for _, entries in sorted(by_id.items())],
            "devices": devices,
            "cache": cache,
            "global": summed,
            "workers": answers,
            "unavailable": unavailable,
        }
    )


async def history(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.Response:
    """Every worker's ``/admin/history`` as one (see :func:`merged_history`)."""
    answers, unavailable = await gather(front, http, "GET", "/admin/history")
    return web.json_response({**merged_history(answers), "unavailable": unavailable})


def merged_history(answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The workers' histories (by worker name) in one process's shape.

    The workers sample on their own clocks: a server point is placed at its time rounded
    to the interval, and the workers' points at one such time are summed (a mean for
    ``cpu_ms_per_frame``, a per-frame figure).
    """
    interval = max((a["interval_s"] for a in answers.values()), default=HISTORY_INTERVAL_S)
    series: list[dict[str, Any]] = []
    # name -> sample time -> one value per worker
    server: dict[str, dict[float, list[float]]] = {}
    for worker, body in answers.items():
        for s in body["series"]:
            if s["scope"] == "device":
                series.append({**s, "subject": f"{worker}/{s['subject']}"})
            elif s["scope"] == "session":
                series.append(s)
            else:
                series.append({**s, "subject": worker})
                own = {
                    round(t / interval) * interval: v for t, v in zip(s["t"], s["v"], strict=True)
                }
                times = server.setdefault(s["name"], {})
                for t, v in own.items():
                    times.setdefault(t, []).append(v)
    for name, times in server.items():
        mean = name == "cpu_ms_per_frame"
        values = [(sum(vs) / len(vs) if mean else sum(vs)) for _, vs in sorted(times.items())]
        series.append(
            {
                "scope": "server",
                "subject": "server",
                "name": name,
                "t": sorted(times),
                "v": [round(v, 4) for v in values],
            }
        )
    series.sort(key=lambda s: (s["scope"], s["subject"], s["name"]))
    return {
        "interval_s": interval,
        "points": max((a["points"] for a in answers.values()), default=HISTORY_POINTS),
        "max_series": sum(a["max_series"] for a in answers.values()) or MAX_SERIES,
        "series": series,
    }


def _one_model(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One model's entries from the workers as one: a loaded entry when there is one, the
    counts summed, and the workers it is loaded on."""
    loaded = [e for e in entries if e["state"] == "loaded"]
    shown = loaded[0] if loaded else entries[0]
    summed = {key: sum(e[key] for e in entries) for key in _MODEL_SUMMED}
    return {**shown, **summed, "loaded_on": [e["worker"] for e in loaded]}


async def model_action(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.Response:
    """Load or unload a model on a named worker, or where placement says (module doc)."""
    model_id, action = request.match_info["model_id"], request.match_info["action"]
    named = request.query.get("worker")
    body: dict[str, Any] = {}
    if action == "load":
        raw = await read_limited(request, MAX_LOAD_BODY)
        body = parse_json_object(raw) if raw.strip() else {}
        device = body.get("device")
        if device is not None:  # an index into /admin/stats' devices: that worker's device
            named, body["device"] = await device_index(front, http, device)
    if named is not None:
        worker = front.workers.get(named)
        if worker is None or not worker.answering:
            known = ", ".join(front.workers)
            raise RequestError(
                404 if worker is None else 503,
                "worker_not_found" if worker is None else "worker_unavailable",
                f"worker {named[:32]!r} is {'unknown' if worker is None else 'not answering'}"
                f" (workers: {known})",
            )
        targets = [worker]
    elif action == "load":
        targets = candidates(model_id, list(front.workers.values()))[:1]
    else:
        targets = [w for w in front.workers.values() if w.report and model_id in w.report.models]
    if not targets:
        raise RequestError(
            409 if action == "unload" else 503,
            "not_loaded" if action == "unload" else "worker_unavailable",
            f"no worker {'holds' if action == 'unload' else 'can load'} model {model_id[:64]!r}",
        )
    path = f"/admin/models/{model_id}/{action}"
    # A load may take as long as any request may (a model's load and warm-up).
    timeout_s = front.settings.server.request_timeout_s
    answers, unavailable = await gather(
        front, http, "POST", path, targets, body=body, timeout_s=timeout_s
    )
    if not answers:
        raise RequestError(502, "worker_error", "; ".join(unavailable.values())[:1000])
    for name in answers:
        front.report_soon(name)
    return web.json_response(
        {
            "models": [{**entry, **_where(front, name)} for name, entry in answers.items()],
            "unavailable": unavailable,
        }
    )


async def device_index(
    front: ClusterFront, http: aiohttp.ClientSession, index: object
) -> tuple[str, int]:
    """The worker and its own device index for ``index`` in the merged device list."""
    answers, _ = await gather(front, http, "GET", "/admin/stats")
    layout = [
        (name, local) for name, body in answers.items() for local in range(len(body["devices"]))
    ]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(layout):
        names = ", ".join(f"{i}={n}/{d}" for i, (n, d) in enumerate(layout))
        raise RequestError(400, "bad_device", f"device must be one of: {names}")
    return layout[index]


async def metrics(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.Response:
    """Every answering worker's series with ``worker`` and ``node`` labels, and the
    front's own."""
    answers, _ = await gather(front, http, "GET", "/metrics", text=True)
    registry = CollectorRegistry()
    registry.register(_Labelled(front, answers))
    return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE})


class _Labelled:
    """A collector over the workers' scraped text, each sample labelled by its worker."""

    def __init__(self, front: ClusterFront, texts: dict[str, str]) -> None:
        self._front = front
        self._texts = texts

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for name, text in self._texts.items():
            where = _where(self._front, name)
            for family in text_string_to_metric_families(text):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                merged.samples.extend(
                    Sample(s.name, {**s.labels, **where}, s.value, s.timestamp, s.exemplar)
                    for s in family.samples
                )
        yield from families.values()
        workers = self._front.workers.values()
        gauge = GaugeMetricFamily(
            "lipstream_cluster_workers",
            "Workers of this front by state: answering its reports or not.",
            labels=["state"],
        )
        gauge.add_metric(["answering"], sum(w.answering for w in workers))
        gauge.add_metric(["not_answering"], sum(not w.answering for w in workers))
        yield gauge
        yield CounterMetricFamily(
            "lipstream_cluster_worker_restarts",
            "Worker restarts the front has seen (a new incarnation: its calls were lost).",
            value=sum(w.restarts for w in workers),
        )
