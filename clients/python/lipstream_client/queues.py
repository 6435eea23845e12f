"""A bounded queue that drops its oldest item when full: for real-time frames and events.

aiortc's receive queues are unbounded, so a call drains them at once into these; an app
that reads late gets the newest items, and the count of those it missed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class DropOldestQueue(Generic[T]):
    """Holds at most ``maxsize`` items; :meth:`put` never waits. An async iterator that
    ends once :meth:`close` was called and every item before it was taken."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._changed = asyncio.Event()
        self._closed = False
        self.put_count = 0
        self.dropped = 0

    def put(self, item: T) -> None:
        """Append ``item``, dropping the oldest one when full; ignored once closed."""
        if self._closed:
            return
        if len(self._items) >= self._maxsize:
            self._items.popleft()
            self.dropped += 1
        self._items.append(item)
        self.put_count += 1
        self._changed.set()

    def close(self) -> None:
        """No more items: readers get what is left, then the iteration ends."""
        self._closed = True
        self._changed.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    def __aiter__(self) -> DropOldestQueue[T]:
        return self

    async def __anext__(self) -> T:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._changed.clear()
            await self._changed.wait()
        return self._items.popleft()
