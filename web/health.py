"""Liveness and readiness for load balancers and orchestrators.

    GET /health   200 {"status": "ok"}                 the process answers HTTP and can serve
                  503 {"error": {"code": "server_failed", "message": why}}
                                                       it cannot, and is exiting
    GET /ready    200 {"ready": true, "avatar_root", "devices", "draining": false}
                  503 {"ready": false, "reasons": [...]}

Ready means: the avatar root is a readable directory (or absent while the demo avatar
is enabled), every device has running inference workers, and the server is not
draining (``app[DRAINING]``, set by the shutdown path). Healthy means the process has
not given up (``app[LIVENESS]``): one that cannot recover says so here while it exits,
so a supervisor restarts it. Neither route needs admin access; a cluster front answers
``/health`` with this same handler.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from config.settings import AvatarsSettings
from web.app_keys import CORE, DRAINING, LIVENESS, SETTINGS
from web.errors import json_error
from web.schemas import Health, NotReady, Ready


async def health(request: web.Request) -> web.Response:
    """Alive: the event loop answers and the process has not given up (module doc)."""
    failure = request.app[LIVENESS].failure
    if failure is not None:
        return json_error(503, "server_failed", failure)
    return web.json_response(Health(status="ok").dump())


def check_avatar_root(avatars: AvatarsSettings) -> tuple[str | None, str | None]:
    """``(state, None)`` when usable, ``(None, reason)`` when not. Touches the disk."""
    root = Path(avatars.root)
    if not root.exists():
        if avatars.demo:
            return "absent (demo avatar only)", None
        return None, f"avatar root {root} does not exist and avatars.demo is off"
    if not root.is_dir():
        return None, f"avatar root {root} is not a directory"
    if not os.access(root, os.R_OK | os.X_OK):
        return None, f"avatar root {root} is not readable by this process"
    return "readable", None


@dataclass(frozen=True)
class Readiness:
    """Why the server is not ready (empty when it is), and what ``GET /ready`` shows."""

    reasons: list[str]
    avatar_root: str | None
    devices: list[str]


async def readiness(app: web.Application) -> Readiness:
    """What ``GET /ready`` (and the protocols' readiness, ``/v2/health/ready``) decide on."""
    reasons: list[str] = []
    root_state, root_problem = await asyncio.to_thread(check_avatar_root, app[SETTINGS].avatars)
    if root_problem is not None:
        reasons.append(root_problem)
    devices: list[str] = []
    core = app.get(CORE)
    if core is None:
        reasons.append("the inference core is not started")
    else:
        snapshot = await core.snapshot()
        if not snapshot.running:
            reasons.append("the inference core is not running")
        for device in snapshot.devices:
            if device.workers_alive > 0:
                devices.append(device.name)
            else:
                reasons.append(f"device {device.name} has no running inference workers")
    if app[DRAINING].draining:
        reasons.append("the server is draining: it takes no new sessions")
    return Readiness(reasons, root_state, devices)


async def ready(request: web.Request) -> web.Response:
    """Ready for new sessions, or 503 with every reason it is not."""
    state = await readiness(request.app)
    if state.reasons:
        return web.json_response(NotReady(ready=False, reasons=state.reasons).dump(), status=503)
    assert state.avatar_root is not None
    body = Ready(ready=True, avatar_root=state.avatar_root, devices=state.devices, draining=False)
    return web.json_response(body.dump())
