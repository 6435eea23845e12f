"""A caller's ``lipstream`` data channel: the session's events out, its messages in.

A browser that is already in the call gets the same events an app gets over a WebSocket
or server-sent events (``docs/apps.md``) without a second connection, and can barge in
over the path its audio already takes. aiortc's channel buffers whatever it is given, so
a caller that stops reading (its SCTP window closed) is cut off once
:data:`MAX_BUFFERED_BYTES` wait, rather than growing the server's memory.

What the events are and what a message means are the session's
(:class:`EventChannel`); this module only moves them over aiortc's channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiortc import RTCDataChannel

logger = logging.getLogger(__name__)

#: The channel's label a caller opens for events.
LABEL = "lipstream"
#: Bytes aiortc may hold for a channel that is not being read before it is closed.
MAX_BUFFERED_BYTES = 1 << 20
#: ``lipstream`` channels one call serves at a time; a caller's further ones are closed.
MAX_EVENT_CHANNELS = 4


class EventFeed(Protocol):
    """One reader's events (a session's :class:`~streaming.live.events.EventListener`)."""

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EventChannel:
    """What a session puts on its callers' data channels: ``listen()`` gives a new
    reader of its events; ``answer(message, reply)`` acts on a message the caller sent,
    and calls ``reply(message)`` (now or once an action finished) to send that caller
    an answer, such as an error."""

    listen: Callable[[], EventFeed]
    answer: Callable[[object, Callable[[dict[str, Any]], None]], None]


async def serve_data_channel(channel: RTCDataChannel, events: EventChannel) -> None:
    """Forward the session's events to ``channel`` until either ends; hand its messages
    to ``events.answer``."""
    listener = events.listen()

    def reply(answer: dict[str, Any]) -> None:
        if channel.readyState == "open":
            channel.send(json.dumps(answer))

    @channel.on("message")
    def on_message(message: object) -> None:
        events.answer(message, reply)

    try:
        if channel.readyState == "connecting":
            opened = asyncio.Event()
            channel.once("open", opened.set)
            await opened.wait()
        async for event in listener:
            if channel.readyState != "open":
                return
            if channel.bufferedAmount > MAX_BUFFERED_BYTES:
                logger.info(
                    "data channel not read: session=%s buffered=%d; events stop",
                    event.get("session_id"),
                    channel.bufferedAmount,
                )
                return
            channel.send(json.dumps(event))
        await _flushed(channel)
    except ConnectionError:  # the connection closed under a send: the channel's normal end
        return
    finally:
        listener.close()


async def _flushed(channel: RTCDataChannel) -> None:
    """Return once aiortc has handed everything sent to SCTP (so that ``session_ended``
    is on the wire before the session closes the connection), or after a second."""
    if channel.readyState != "open" or channel.bufferedAmount == 0:
        return
    drained = asyncio.Event()
    channel.bufferedAmountLowThreshold = 0
    channel.once("bufferedamountlow", drained.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drained.wait(), 1.0)
