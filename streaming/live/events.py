"""A session's events, fanned out to its listeners through bounded queues.

Events are JSON-ready dicts with ``type``, ``seq`` (from 1, per session) and
``session_id`` (``docs/apps.md`` lists the types). Each listener (a WebSocket stream,
a server-sent-events response, the caller's data channel) has its own queue of at most
``queue_size`` events, so one slow reader never holds up the session or another reader:

- a ``queued_ms`` event replaces one still waiting at the queue's end (only the latest
  level matters), so a stream of them cannot fill a queue;
- a listener whose queue is full anyway has stopped reading: it is closed and marked
  ``overflowed``, and its owner tells the client why where the channel allows.

When the session ends, ``session_ended`` goes to every listener, which then closes
after it has been read. Not thread-safe: the event loop alone uses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

Event = dict[str, Any]

#: Events one listener may have waiting (``session.event_queue_size`` by default).
DEFAULT_QUEUE_SIZE = 256


def message_type(text: object) -> str | None:
    """The ``type`` of a client's control message (a JSON object), else None."""
    if not isinstance(text, str):
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    kind = parsed.get("type") if isinstance(parsed, dict) else None
    return kind if isinstance(kind, str) else None


def error_event(code: str, message: str, **fields: Any) -> Event:
    """An ``error`` message for one client about what it sent (never published)."""
    return {"type": "error", "code": code, "message": message, **fields}


class EventListener:
    """One reader's queue of a session's events; iterate it, or :meth:`get` one at a time."""

    def __init__(self, hub: SessionEvents, queue_size: int) -> None:
        self._hub = hub
        self._queue: deque[Event] = deque()
        self._size = queue_size
        self._wake = asyncio.Event()
        self.closed = False
        self.overflowed = False  # closed because the reader fell queue_size events behind
        # Called once on overflow: a reader stuck in a blocked write never sees get() end.
        self.on_overflow: Callable[[], None] | None = None

    def offer(self, event: Event) -> None:
        """Queue ``event`` (the hub calls this for every event it publishes)."""
        if self.closed:
            return
        queue = self._queue
        if event["type"] == "queued_ms" and queue and queue[-1]["type"] == "queued_ms":
            queue[-1] = event
        elif len(queue) >= self._size:
            self.overflowed = True
            self._close()
            logger.info(
                "event listener overflowed: session=%s queued=%d", event["session_id"], len(queue)
            )
            if self.on_overflow is not None:
                self.on_overflow()
            return
        else:
            queue.append(event)
        self._wake.set()

    async def get(self) -> Event | None:
        """The next event; None once the listener is closed and drained (or overflowed)."""
        while True:
            if self.overflowed:
                return None
            if self._queue:
                return self._queue.popleft()
            if self.closed:
                return None
            self._wake.clear()
            await self._wake.wait()

    def __aiter__(self) -> EventListener:
        return self

    async def __anext__(self) -> Event:
        event = await self.get()
        if event is None:
            raise StopAsyncIteration
        return event

    @property
    def session_id(self) -> str:
        return self._hub.session_id

    @property
    def waiting(self) -> int:
        """Events queued and not yet read."""
        return len(self._queue)

    def close(self) -> None:
        """Stop listening; what is queued can still be read."""
        self._hub.remove(self)
        self._close()

    def _close(self) -> None:
        self.closed = True
        self._wake.set()


class SessionEvents:
    """The events of one session and the listeners that receive them."""

    def __init__(self, session_id: str, *, queue_size: int = DEFAULT_QUEUE_SIZE) -> None:
        self.session_id = session_id
        self._queue_size = queue_size
        self._listeners: list[EventListener] = []
        self._seq = 0
        self.ended = False
        self._end_event: Event | None = None

    def publish(self, type_: str, **fields: Any) -> Event:
        """Send an event to every listener; returns it."""
        self._seq += 1
        event: Event = {"type": type_, "seq": self._seq, "session_id": self.session_id, **fields}
        for listener in list(self._listeners):
            listener.offer(event)
            if listener.closed:
                self.remove(listener)
        return event

    def listen(self) -> EventListener:
        """A new listener (already closed, holding ``session_ended``, if the session ended)."""
        listener = EventListener(self, self._queue_size)
        if self._end_event is not None:
            listener.offer(self._end_event)
            listener.close()
        else:
            self._listeners.append(listener)
        return listener

    def remove(self, listener: EventListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    def end(self, reason: str) -> None:
        """Publish ``session_ended`` and close every listener once it has read it."""
        if self.ended:
            return
        self._end_event = self.publish("session_ended", reason=reason)
        self.ended = True
        for listener in list(self._listeners):
            listener.close()
