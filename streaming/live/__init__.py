"""Live calls: a :class:`Session` per caller, the thin owner of its peer connection
(:mod:`streaming.webrtc`), its :class:`LivePipeline` (mixer → timeline → renderer → send
buffers) and the :class:`StageTasks` whose rule ends it; and the :class:`SessionManager`
that creates sessions from offers, admits or refuses them, and reports on them
(``docs/design/map.md`` §1, ``docs/design/audio-in.md`` §2, ``docs/design/threads.md``
§7, ``docs/design/delay.md`` §8-§9). Imports no aiortc: the peer is ``webrtc``'s.
"""

from __future__ import annotations

from streaming.live.admission import AdmissionControl
from streaming.live.manager import SessionManager
from streaming.live.mixer import AudioMixer
from streaming.live.pipeline import LivePipeline
from streaming.live.session import Session
from streaming.live.tasks import StageTasks

__all__ = [
    "AdmissionControl",
    "AudioMixer",
    "LivePipeline",
    "Session",
    "SessionManager",
    "StageTasks",
]
