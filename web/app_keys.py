"""Typed keys for what the aiohttp application holds."""

from __future__ import annotations

from aiohttp import web

from config.settings import Settings
from inference_core.core import InferenceCore
from streaming.session_manager import SessionManager
from streaming.tts import TtsEngine

SETTINGS = web.AppKey("settings", Settings)
CORE = web.AppKey("core", InferenceCore)
SESSIONS = web.AppKey("sessions", SessionManager)
TTS = web.AppKey("tts", TtsEngine)
# Display names by avatar id; at most one entry per registered avatar.
AVATAR_NAMES = web.AppKey("avatar_names", dict[str, str])
