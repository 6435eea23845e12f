"""A caller's ``lipstream`` data channel: the session's events out, ``interrupt`` in.

A browser that is already in the call gets the same events an app gets over a WebSocket
or server-sent events (``docs/apps.md``) without a second connection, and can barge in
over the path its audio already takes. aiortc's channel buffers whatever it is given, so
a caller that stops reading (its SCTP window closed) is cut off once
:data:`MAX_BUFFERED_BYTES` wait, rather than growing the server's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from aiortc import RTCDataChannel

from streaming.live.events import EventListener, error_event, message_type

logger = logging.getLogger(__name__)

#: The channel's label a caller opens for events.
LABEL = "lipstream"
#: Bytes aiortc may hold for a channel that is not being read before it is closed.
MAX_BUFFERED_BYTES = 1 << 20


async def serve_data_channel(
    channel: RTCDataChannel, listener: EventListener, interrupt: Callable[[], Any]
) -> None:
    """Forward ``listener``'s events to ``channel`` until either ends; answer its
    ``{"type": "interrupt"}`` messages with ``interrupt()``."""

    @channel.on("message")
    def on_message(message: object) -> None:
        if message_type(message) == "interrupt":
            interrupt()
        elif channel.readyState == "open":
            what = 'the data channel takes {"type": "interrupt"} messages only'
            channel.send(json.dumps(error_event("bad_message", what)))

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
