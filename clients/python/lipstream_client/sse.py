"""Server-sent events of one session (``GET /sessions/{id}/events``), as event dicts."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType

from aiohttp import ClientResponse

from lipstream_client.errors import error_from_message
from lipstream_client.models import Event

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SseMessage:
    """One dispatched server-sent event."""

    event: str
    data: str
    id: str | None


class SseParser:
    """The ``text/event-stream`` format, fed one line at a time (WHATWG HTML §9.2.6)."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> SseMessage | None:
        """Take one line (its line ending may be included); a message when it completes."""
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):  # a comment: the server's keepalive
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def _dispatch(self) -> SseMessage | None:
        if not self._data:
            self._event = ""
            return None
        message = SseMessage(self._event or "message", "\n".join(self._data), self._id)
        self._event, self._data = "", []
        return message


class EventStream:
    """A session's events: an async iterator of event dicts and an async context manager.

    The request is made by ``async with`` (events from then on are not missed) or else by
    the first iteration. The iteration ends after the server's
    ``session_ended`` (the server then ends the stream); an ``error`` event (the listener
    fell behind: ``events_overflow``) is raised as its typed :class:`LipstreamError`.
    ``last_seq`` is the ``seq`` of the last event, so a gap shows missed events.
    """

    def __init__(self, open_response: Callable[[], Awaitable[ClientResponse]]) -> None:
        self._open_response = open_response
        self._response: ClientResponse | None = None
        self._parser = SseParser()
        self._done = False
        self.last_seq: int | None = None

    async def __aenter__(self) -> EventStream:
        await self.open()
        return self

    async def open(self) -> None:
        """Make the request; once it returns, the server is listening for this client."""
        if self._response is None and not self._done:
            self._response = await self._open_response()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        if self._done:
            raise StopAsyncIteration
        await self.open()
        assert self._response is not None
        while True:
            line = await self._response.content.readline()
            if not line:  # the server ended the stream
                await self.aclose()
                raise StopAsyncIteration
            message = self._parser.feed(line.decode("utf-8", errors="replace"))
            if message is None:
                continue
            event = json.loads(message.data)
            if not isinstance(event, dict):
                logger.warning("ignoring a server-sent event that is not an object: %.200s", event)
                continue
            event.setdefault("type", message.event)
            if event["type"] == "error":
                await self.aclose()
                raise error_from_message(event)
            self._note_seq(event)
            if event["type"] == "session_ended":
                await self.aclose()
            return event

    def _note_seq(self, event: Event) -> None:
        seq = event.get("seq")
        if not isinstance(seq, int):
            return
        if self.last_seq is not None and seq != self.last_seq + 1:
            logger.warning("missed %d session events before seq %d", seq - self.last_seq - 1, seq)
        self.last_seq = seq

    async def aclose(self) -> None:
        """Stop listening (closes the HTTP response); the iteration ends."""
        self._done = True
        if self._response is not None:
            self._response.close()
