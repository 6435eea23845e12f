"""Per-client rate limit (a token bucket per address), bounded in memory.

A client may make ``per_minute`` requests in a burst and then one every ``60/per_minute``
seconds. Buckets live in an LRU of at most ``max_clients`` addresses, so a flood from
many addresses costs bounded memory (the oldest buckets are forgotten first).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    """Token buckets by client key; ``per_minute == 0`` disables the limit."""

    def __init__(
        self,
        per_minute: int,
        *,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_minute = per_minute
        self._rate = per_minute / 60.0
        self._max_clients = max_clients
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at
        self.limited = 0

    def retry_after(self, key: str) -> float | None:
        """Take a token for ``key``: None if allowed, else seconds until one is available."""
        if self.per_minute <= 0:
            return None
        now = self._clock()
        tokens, at = self._buckets.pop(key, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - at) * self._rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            wait = None
        else:
            self._buckets[key] = (tokens, now)
            wait = (1.0 - tokens) / self._rate
            self.limited += 1
        while len(self._buckets) > self._max_clients:
            self._buckets.popitem(last=False)
        return wait
