"""When the sessions of a model will send their next frame: how long a batch should wait.

A live session sends its model one frame per output frame period (40 ms at 25 fps), at
its own phase. Waiting ``batching.max_wait_ms`` for a batch partner helps only if some
other session's next frame is due inside that window; otherwise the wait is pure
delay (with one call per model, every frame would wait the whole window for nobody).
:class:`Arrivals` remembers, per model, when each session last sent a frame and at
what interval, and answers whether a partner is expected before a given time.

Not thread-safe: the scheduler calls it under its own lock.
"""

from __future__ import annotations

import math
from collections.abc import Collection

#: A session that sent nothing for this long is not expected to send again soon.
STALE_S = 0.5
#: Frames arrive up to this much later than their period predicts (event-loop jitter).
JITTER_S = 0.002


class Arrivals:
    """Per model: each session's last frame time and the interval before it."""

    def __init__(self) -> None:
        # model id -> session id -> (last submit time, interval before it)
        self._seen: dict[str, dict[str, tuple[float, float]]] = {}

    def note(self, model_id: str, session_id: str, now: float) -> None:
        """Record that ``session_id`` sent ``model_id`` a frame at ``now``."""
        sessions = self._seen.setdefault(model_id, {})
        previous = sessions.get(session_id)
        interval = now - previous[0] if previous is not None else math.inf
        sessions[session_id] = (now, interval)

    def partner_expected(
        self, model_id: str, queued: Collection[str], until: float, now: float
    ) -> bool:
        """Whether a session not in ``queued`` should send ``model_id`` a frame by ``until``.

        Sessions silent for :data:`STALE_S` are forgotten here (so the table stays as
        small as the set of live sessions).
        """
        sessions = self._seen.get(model_id)
        if sessions is None:
            return False
        expected = False
        for session_id, (last, interval) in list(sessions.items()):
            if now - last > STALE_S:
                del sessions[session_id]
            elif session_id not in queued and last + interval <= until + JITTER_S:
                expected = True
        if not sessions:
            del self._seen[model_id]
        return expected

    def forget_stale(self, now: float) -> None:
        """Drop sessions silent for :data:`STALE_S` from every model."""
        for model_id in list(self._seen):
            sessions = self._seen[model_id]
            for session_id in [s for s, (last, _) in sessions.items() if now - last > STALE_S]:
                del sessions[session_id]
            if not sessions:
                del self._seen[model_id]

    def __len__(self) -> int:
        """Sessions remembered, over all models."""
        return sum(len(sessions) for sessions in self._seen.values())
