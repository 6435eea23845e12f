"""Typed keys for what the aiohttp application holds."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry

from config.settings import Settings
from inference_core.serving.core import InferenceCore
from streaming.audio_in.tts import TtsEngine
from streaming.live.manager import SessionManager
from web.rate_limit import RateLimiter

SETTINGS = web.AppKey("settings", Settings)
CORE = web.AppKey("core", InferenceCore)
SESSIONS = web.AppKey("sessions", SessionManager)
TTS = web.AppKey("tts", TtsEngine)
# Display names by avatar id; at most one entry per registered avatar.
AVATAR_NAMES = web.AppKey("avatar_names", dict[str, str])
# The Prometheus registry GET /metrics serves (web.metrics.add_metrics_routes).
METRICS = web.AppKey("metrics", CollectorRegistry)


@dataclass
class DrainState:
    """Whether the server is draining: set once shutdown begins, never cleared.

    ``GET /ready`` answers 503 while it is set, so load balancers stop sending new
    sessions; the shutdown path sets it with :meth:`start` (``app[DRAINING].start()``).
    """

    draining: bool = False

    def start(self) -> None:
        self.draining = True


# Installed by web.admin.add_admin_routes: the drain flag /ready reports, when the app
# started (time.monotonic(), for uptime) and the probe that reads device memory totals.
DRAINING = web.AppKey("draining", DrainState)
STARTED_AT = web.AppKey("started_at", float)
OFFER_LIMITER = web.AppKey("offer_limiter", RateLimiter)
