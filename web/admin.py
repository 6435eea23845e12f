"""Operator endpoints: models, devices, sessions, and a page that shows them.

    GET    /admin                         the admin page (web/static/admin.html)
    GET    /admin/models                  {"models": [Model...]}
    POST   /admin/models/{id}/load        {"device"?: index} → Model (waits for the load)
    POST   /admin/models/{id}/unload      → Model
    POST   /admin/avatars/import          AvatarImportRequest → 201 ImportedAvatar
                                          (200 RegisteredAvatar: see import_avatar)
    GET    /admin/stats                   {"models", "devices", "cache", "global"}
    GET    /admin/sessions                {"sessions": [SessionInfo...]}
    GET    /admin/history                 History: the charts' series (web/history.py)
    DELETE /admin/sessions/{id}           {"session_id", "state": "closed"}

Every route goes through :func:`web.admin_auth.admin_only`. Library errors map to
statuses in ``web/errors.py`` (unknown model 404, malformed id 400, in use 409, no
capacity 503 + Retry-After); a load still running after ``registry.load_timeout_s``
answers 504 and keeps loading in the background. :func:`add_admin_routes` also adds
``/health`` and ``/ready`` (no access rule); the drain flag they read is made with the
app (``web.edge.edge_app``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from aiohttp import web

from inference_core.avatars.package import is_inside, package_fingerprint
from inference_core.exceptions import LoadTimeoutError, ModelInUseError
from inference_core.importers import (
    ImportFailedError,
    ImportReport,
    livetalking,
    synctalk2d,
    write_package,
)
from inference_core.serving.snapshot import CoreSnapshot, DeviceSnapshot, ModelSnapshot
from streaming.live.snapshot import SessionsSnapshot
from web.admin_auth import admin_only
from web.app_keys import CORE, SESSIONS, SETTINGS, STARTED_AT
from web.errors import RequestError
from web.health import health, ready
from web.history import History, HistorySampler
from web.request_body import parse_body, read_limited
from web.schemas import (
    AvatarImportRequest,
    Cache,
    Device,
    DeviceKind,
    Global,
    HistorySeries,
    HungUp,
    IdleLoops,
    ImportedAvatar,
    LoadRequest,
    Model,
    Models,
    RegisteredAvatar,
    SessionInfo,
    Sessions,
    Stats,
    Worker,
)
from web.schemas import History as HistoryBody

STATIC_DIR = Path(__file__).parent / "static"
MAX_LOAD_BODY = 1024
MAX_IMPORT_BODY = 4096
IMPORT_LOCK = web.AppKey("import_lock", asyncio.Lock)
#: An import's package fingerprints (``,``-separated) as a cluster front sends them to
#: the workers after the first, and the one a 201 answers with (web/cluster/avatar_import.py).
PACKAGE_HEADER = "X-Lipstream-Package"
HISTORY = web.AppKey("admin_history", History)


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")


def _model(m: ModelSnapshot) -> Model:
    return Model(
        id=m.model_id,
        state=m.state,
        device=m.device,
        memory_bytes=m.memory_bytes,
        usage_count=m.usage_count,
        frames=m.frames,
        total_inference_ms=round(m.inference_ms_total, 3),
        mean_inference_ms=round(m.mean_ms_per_frame, 3),
        last_used=_iso(m.last_used),
        loaded_at=_iso(m.loaded_at),
        load_seconds=None if m.load_seconds is None else round(m.load_seconds, 3),
        last_error=m.last_error,
        refcount=m.refcount,
    )


async def _model_entry(request: web.Request, model_id: str) -> web.Response:
    model = (await request.app[CORE].snapshot()).model(model_id)
    if model is None:
        raise RequestError(404, "model_not_found", f"no model {model_id!r} is registered")
    return web.json_response(_model(model).dump())


async def list_models(request: web.Request) -> web.Response:
    """Every registered model, loaded or not."""
    snapshot = await request.app[CORE].snapshot()
    return web.json_response(Models(models=[_model(m) for m in snapshot.models]).dump())


async def _device_index(request: web.Request) -> int | None:
    """The optional ``{"device": index}`` of a load request (400 ``bad_device`` if none)."""
    body = await read_limited(request, MAX_LOAD_BODY)
    if not body.strip():
        return None
    devices = request.app[CORE].devices
    names = "devices: " + ", ".join(f"{d.index}={d.name}" for d in devices)
    device = parse_body(LoadRequest, body, example='{"device": 0}', hint=names).device
    if device is not None and device >= len(devices):
        raise RequestError(400, "bad_device", f"device {device} does not exist ({names})")
    return device


async def load_model(request: web.Request) -> web.Response:
    """Load a model now (on ``device`` if given) and wait for it; a loaded model stays put."""
    core = request.app[CORE]
    model_id = request.match_info["model_id"]
    core.check_registered(model_id)  # 400 for a malformed id, 404 for an unknown one
    device = await _device_index(request)
    try:
        await core.load(model_id, device)
    except LoadTimeoutError as exc:  # the load goes on in the background
        raise RequestError(504, "load_timeout", str(exc)) from None
    return await _model_entry(request, model_id)


async def unload_model(request: web.Request) -> web.Response:
    """Unload a model that nobody holds (409 while sessions use it)."""
    model_id = request.match_info["model_id"]
    await request.app[CORE].unload(model_id)
    return await _model_entry(request, model_id)


async def import_avatar(request: web.Request) -> web.Response:
    """Import a folder from ``avatars.import_root`` as a new avatar and register it.

    The import runs in a thread (it copies frames and validates models) and one at a
    time; a replaced avatar must not be loaded (409 until it is unloaded). The answer
    names the package written (:data:`PACKAGE_HEADER`); a request that names packages
    so is answered 200 with no import when the avatar root holds one of them already: a
    cluster's workers that share a root register the package the first one wrote.
    """
    settings = request.app[SETTINGS]
    root = settings.avatars.import_root
    if root is None:
        raise RequestError(
            403,
            "import_disabled",
            "avatars.import_root is not set: set it to the directory imports may read from, "
            "or use `lipstream avatar import` on the server",
        )
    body = await read_limited(request, MAX_IMPORT_BODY, "an import request")
    wanted = parse_body(AvatarImportRequest, body)
    core = request.app[CORE]
    avatars = settings.avatars.root
    written = request.headers.get(PACKAGE_HEADER, "").split(",")
    if package_fingerprint(avatars / wanted.id) in written:
        core.register(wanted.id)
        return web.json_response(RegisteredAvatar(id=wanted.id).dump())
    if (avatars / wanted.id).exists() and not wanted.replace:
        raise RequestError(
            409, "avatar_exists", f"avatar {wanted.id!r} exists; send replace: true to overwrite"
        )
    if wanted.replace and core.is_loaded(wanted.id):
        raise ModelInUseError(f"avatar {wanted.id!r} is loaded; unload it before replacing it")
    directory = _under(root, wanted.directory, "directory")
    lipsync = _under(root, wanted.lipsync, "lipsync")
    encoder = (
        None
        if wanted.audio_encoder is None
        else _under(root, wanted.audio_encoder, "audio_encoder")
    )

    def run() -> ImportReport:
        if wanted.source == "synctalk2d":
            if encoder is None:
                raise ImportFailedError("a SyncTalk_2D import needs audio_encoder")
            source = synctalk2d(directory, lipsync, encoder)
        else:
            source = livetalking(directory, wanted.kind, lipsync, encoder)
        clips = {name: (span[0], span[1]) for name, span in (wanted.clips or {}).items()}
        source = dataclasses.replace(source, clips=clips)
        return write_package(source, avatars, wanted.id, link=wanted.link, replace=wanted.replace)

    async with request.app[IMPORT_LOCK]:
        report = await asyncio.to_thread(run)
    core.register(report.avatar_id)
    imported = ImportedAvatar(
        id=report.avatar_id,
        source=wanted.source,
        frames=report.frames,
        frame_size=report.frame_size,
        model_io=report.model_io,
        dynamic_batch=report.dynamic_batch,
        notes=report.notes,
    )
    headers = {PACKAGE_HEADER: package_fingerprint(report.path) or ""}
    return web.json_response(imported.dump(), status=201, headers=headers)


def _under(root: Path, relative: str, field: str) -> Path:
    path = root / relative
    if Path(relative).is_absolute() or not is_inside(path, root):
        raise RequestError(400, "bad_path", f"{field} {relative!r} leaves avatars.import_root")
    return path


def _merge(counts: dict[str, int], reason: str, count: int) -> None:
    if count:
        counts[reason] = counts.get(reason, 0) + count


def _device(d: DeviceSnapshot) -> Device:
    s = d.scheduler
    return Device(
        name=d.name,
        kind=cast(DeviceKind, d.kind),  # the model checks it
        models_loaded=d.models_loaded,
        memory_used_bytes=d.model_memory_bytes,
        memory_total_bytes=d.memory_total_bytes,
        queue_depth=s.queue_depth,
        batches=s.batches,
        frames=sum(w.frames for w in s.workers),
        busy_fraction=round(s.busy_fraction, 4),
        mean_batch_size=round(s.mean_batch_size, 3),
        expired=s.expired,
        rejected=s.rejected,
        workers_restarted=s.workers_restarted,
        workers=[
            Worker(
                name=w.name,
                batches=w.batches,
                frames=w.frames,
                busy_seconds=round(w.busy_seconds, 3),
            )
            for w in s.workers
        ],
    )


async def stats(request: web.Request) -> web.Response:
    """Models, devices, the background cache and server-wide totals in one snapshot."""
    app = request.app
    core = await app[CORE].snapshot()
    live = app[SESSIONS].snapshot()
    models = [_model(m) for m in core.models]
    devices = [_device(d) for d in core.devices]
    totals = live.totals
    # A session's DeadlineExceededError / QueueFullError drops are the same frames the
    # schedulers count as expired / rejected (which also cover the raw API): count once.
    dropped = {
        reason: count
        for reason, count in totals.frames_dropped.items()
        if reason not in ("DeadlineExceededError", "QueueFullError")
    }
    _merge(dropped, "expired", sum(d.expired for d in devices))
    _merge(dropped, "rejected", sum(d.rejected for d in devices))
    c = live.cache
    payload = Stats(
        models=models,
        devices=devices,
        cache=Cache(
            hits=c.hits,
            misses=c.misses,
            hit_rate=round(c.hit_rate, 4),
            evictions=c.evictions,
            bytes=c.bytes,
            max_bytes=c.max_bytes,
            entries=c.entries,
        ),
        idle_loops=IdleLoops(
            bytes=live.idle_loops.bytes,
            max_bytes=live.idle_loops.max_bytes,
            loops=live.idle_loops.loops,
            building=live.idle_loops.building,
            built=live.idle_loops.built,
            evicted=live.idle_loops.evicted,
            failed=live.idle_loops.failed,
            frames_shared=totals.frames_shared,
            frames_encoded=totals.frames_encoded,
        ),
        totals=Global(
            models_registered=len(models),
            models_loaded=sum(1 for m in models if m.state == "loaded"),
            live_sessions=totals.live,
            sessions_started=totals.started,
            sessions_ended=totals.ended,
            sessions_rejected=totals.rejected,
            frames_served=totals.frames_sent,
            frames_dropped=dropped,
            cpu_ms_per_frame=(
                None if totals.cpu_ms_per_frame is None else round(totals.cpu_ms_per_frame, 2)
            ),
            evictions={str(k): v for k, v in core.evictions.items()},
            uptime_s=round(time.monotonic() - app[STARTED_AT], 1),
            version=_version(),
        ),
    )
    return web.json_response(payload.dump())


def _version() -> str:
    try:
        return importlib.metadata.version("lipstream")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown"


async def list_sessions(request: web.Request) -> web.Response:
    """Every live session with its output rate, added delay and A/V offset."""
    infos = [
        SessionInfo.model_validate(s, from_attributes=True)
        for s in request.app[SESSIONS].snapshot().sessions
    ]
    return web.json_response(Sessions(sessions=infos).dump())


async def history(request: web.Request) -> web.Response:
    """The sampled series the admin page charts."""
    kept = request.app[HISTORY]
    body = HistoryBody(
        interval_s=kept.interval_s,
        points=kept.points,
        max_series=kept.max_series,
        series=[
            HistorySeries(scope=scope, subject=subject, name=name, t=list(s.t), v=list(s.v))
            for (scope, subject, name), s in kept.items()
        ],
    )
    return web.json_response(body.dump())


async def hang_up(request: web.Request) -> web.Response:
    """End a live session (404 if there is none with that id)."""
    session_id = request.match_info["session_id"]
    await request.app[SESSIONS].close(session_id, "hung up by admin")
    return web.json_response(HungUp(session_id=session_id, state="closed").dump())


async def page(request: web.Request) -> web.FileResponse:
    """The admin page; it reads everything else from the JSON routes."""
    return web.FileResponse(STATIC_DIR / "admin.html", headers={"Cache-Control": "no-store"})


def add_admin_routes(app: web.Application) -> None:
    """Add the admin routes, /health and /ready, and what they keep in ``app``."""

    async def admin_state(app: web.Application) -> AsyncIterator[None]:
        app[STARTED_AT] = time.monotonic()
        app[IMPORT_LOCK] = asyncio.Lock()  # one import at a time
        server = app[SETTINGS].server
        app[HISTORY] = History(points=server.history_points, interval_s=server.history_interval_s)

        async def read() -> tuple[CoreSnapshot, SessionsSnapshot]:
            return await app[CORE].snapshot(), app[SESSIONS].snapshot()

        sampler = HistorySampler(app[HISTORY], read)
        sampler.start()
        yield
        await sampler.stop()

    app.cleanup_ctx.append(admin_state)
    router = app.router
    router.add_get("/health", health)
    router.add_get("/ready", ready)
    router.add_get("/admin", admin_only(page, page=True))
    router.add_get("/admin/models", admin_only(list_models))
    router.add_post("/admin/models/{model_id}/load", admin_only(load_model))
    router.add_post("/admin/models/{model_id}/unload", admin_only(unload_model))
    router.add_post("/admin/avatars/import", admin_only(import_avatar))
    router.add_get("/admin/stats", admin_only(stats))
    router.add_get("/admin/sessions", admin_only(list_sessions))
    router.add_get("/admin/history", admin_only(history))
    router.add_delete("/admin/sessions/{session_id}", admin_only(hang_up))
