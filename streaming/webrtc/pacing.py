"""The session clock, and how a track keeps to its slots on it.

Video frame ``n`` (the face for audio time ``n/fps``) and audio chunk ``m`` (audio time
``m·20 ms``) are both handed to aiortc at ``start + delay + their audio time``
(``docs/design/delay.md`` §8). The clock starts when the first track asks for its first
slot; the session's timeline waits for that moment (:meth:`SessionClock.wait_started`)
rather than being called from it.

A track that falls behind catches up or skips (:func:`next_slot`): a slot up to
:data:`CATCH_UP_S` late is sent at once (the following ones are early again, since due
times are absolute, so small stalls do not accumulate); later than that, the missed
slots are skipped, so lateness never turns into growing latency. A track's first slot
(0) is never skipped, however late: a receiver counts the session's frames and chunks
from the first one it gets (the RTP timestamps start at a random origin), so the first
one sent must be slot 0 for its ``index`` and ``media_ms`` (``docs/apps.md``) to match
the events'; a late first slot is sent late, and the slots after it skip as usual. Both
the clock and the sleep are passed in, so tests step time by hand.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

#: Lateness a track makes up by sending at once; beyond it, missed slots are skipped.
CATCH_UP_S = 0.1


class SessionClock:
    """The wall-clock schedule of a session's media: starts when the first track asks.

    ``clock`` is the monotonic clock every due time is read on; ``sleep`` is how a track
    waits for its slot.
    """

    def __init__(
        self, delay_s: float, *, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep
    ) -> None:
        self.delay_s = delay_s
        self.now = clock
        self.sleep = sleep
        self.start: float | None = None
        self._started = asyncio.Event()

    def started(self) -> float:
        """The start time, starting the clock if needed."""
        if self.start is None:
            self.start = self.now()
            self._started.set()
        return self.start

    async def wait_started(self) -> float:
        """Return the start time once the clock has started."""
        await self._started.wait()
        assert self.start is not None
        return self.start

    def due(self, audio_time_s: float) -> float:
        """When media for ``audio_time_s`` on the session timeline is handed to aiortc."""
        return self.started() + self.delay_s + audio_time_s

    def slots_due(self, period_s: float) -> int:
        """How many slots of ``period_s`` are due by now (0 before the first)."""
        return max(0, math.floor((self.now() - self.due(0.0)) / period_s) + 1)


@dataclass(frozen=True, slots=True)
class Slot:
    """What a track does for the slot it asked for: wait ``wait_s`` (0: send now), then
    send slot ``index``, having skipped ``skipped`` slots to get there."""

    index: int
    skipped: int
    wait_s: float


def next_slot(now: float, due: float, index: int, period_s: float) -> Slot:
    """The decision for slot ``index``, due at ``due``, at time ``now`` (module doc)."""
    if now < due:
        return Slot(index, 0, due - now)
    late_s = now - due
    if late_s <= CATCH_UP_S or index == 0:
        return Slot(index, 0, 0.0)
    skipped = math.floor(late_s / period_s)
    return Slot(index + skipped, skipped, 0.0)


async def wait_for_slot(clock: SessionClock, index: int, period_s: float) -> Slot:
    """Sleep until slot ``index`` is due (or skip to the current one: :func:`next_slot`)."""
    slot = next_slot(clock.now(), clock.due(index * period_s), index, period_s)
    if slot.wait_s > 0:
        await clock.sleep(slot.wait_s)
    elif slot.skipped and logger.isEnabledFor(logging.DEBUG):
        logger.debug("late at slot %d: skipping %d", index, slot.skipped)
    return slot
