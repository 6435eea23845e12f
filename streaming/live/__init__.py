"""Live calls: a :class:`Session` per caller (audio timeline, features, batched inference,
compositing, paced sending) and the :class:`SessionManager` that creates them from
offers, admits or refuses them, and reports on them (``docs/architecture.md`` §2, §7-§9).
"""

from __future__ import annotations

from streaming.live.admission import AdmissionControl
from streaming.live.manager import SessionManager
from streaming.live.mixer import AudioMixer
from streaming.live.session import Session

__all__ = [
    "AdmissionControl",
    "AudioMixer",
    "Session",
    "SessionManager",
]
