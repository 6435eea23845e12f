"""Typed keys for what the aiohttp application holds."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from config.settings import Settings
from inference_core.serving.core import InferenceCore
from streaming.audio_in.tts import TtsEngine
from streaming.live.manager import SessionManager
from web.inference.door import InferenceDoor
from web.rate_limit import RateLimiter

SETTINGS = web.AppKey("settings", Settings)
CORE = web.AppKey("core", InferenceCore)
# The raw inference front doors' way into the core (/v1/infer, /v2, gRPC).
DOOR = web.AppKey("inference_door", InferenceDoor)
SESSIONS = web.AppKey("sessions", SessionManager)
TTS = web.AppKey("tts", TtsEngine)
# Display names by avatar id; at most one entry per registered avatar.
#: Each avatar's display name and idle clips, read once from its manifest (``GET /avatars``).
AVATAR_NAMES = web.AppKey("avatar_names", dict[str, tuple[str, list[str]]])
# The Prometheus registry GET /metrics serves (web.metrics.add_metrics_routes).
METRICS = web.AppKey("metrics", CollectorRegistry)


@dataclass
class DrainState:
    """Whether the server is draining: set once shutdown begins, never cleared.

    Made with the app (``web.edge.edge_app``), so every route can read it from the start.
    ``GET /ready`` answers 503 and offers are refused while it is set, so load balancers
    stop sending new sessions; the serve loop (``web/serve.py``) and a cluster worker's
    drain set it with :meth:`start`.
    """

    draining: bool = False

    def start(self) -> None:
        self.draining = True


@dataclass
class Liveness:
    """Whether this process can still serve at all: failed once, never healthy again.

    A process that cannot recover (a cluster front whose Ray runtime is gone for good,
    ``docs/design/cluster.md`` §14) says why with :meth:`fail`: ``GET /health`` then answers
    503 with that reason, and the serve loop stops and exits non-zero, so a supervisor
    (systemd, a container runtime, Kubernetes) starts a fresh one.
    """

    failure: str | None = None
    _failed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            self._failed.set()

    async def wait(self) -> str:
        """Return the reason once :meth:`fail` was called."""
        await self._failed.wait()
        assert self.failure is not None
        return self.failure


# Made with the app (web.edge.edge_app): the drain flag /ready reports and the process's
# liveness /health reports. Installed by web.admin.add_admin_routes: when the app started
# (time.monotonic(), for uptime).
DRAINING = web.AppKey("draining", DrainState)
LIVENESS = web.AppKey("liveness", Liveness)
STARTED_AT = web.AppKey("started_at", float)
OFFER_LIMITER = web.AppKey("offer_limiter", RateLimiter)
