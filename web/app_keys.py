"""Typed keys for what the aiohttp application holds."""

from __future__ import annotations

from aiohttp import web

from config.settings import Settings
from inference_core.core import InferenceCore

SETTINGS = web.AppKey("settings", Settings)
CORE = web.AppKey("core", InferenceCore)
