"""The audio stream into a session: ``GET /sessions/{id}/audio/stream`` (a WebSocket).

An app sends PCM as its text-to-speech engine makes it (:meth:`AudioStream.send`), ends
each utterance (:meth:`AudioStream.end`) and reads every server message
(:meth:`AudioStream.events`). ``send`` paces itself (:mod:`lipstream_client.flow`) so a
faster-than-real-time source never fills the server's queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType

import numpy as np
from aiohttp import ClientWebSocketResponse, WSMsgType

from lipstream_client.errors import (
    EventsOverflow,
    LipstreamError,
    StreamClosed,
    error_from_message,
)
from lipstream_client.flow import SendWindow
from lipstream_client.models import Event
from lipstream_client.pcm import SAMPLE_BYTES, PcmFormat, split_pcm, to_pcm_bytes
from lipstream_client.queues import DropOldestQueue

logger = logging.getLogger(__name__)

#: How long :meth:`AudioStream.open` waits for the server's ``ready``.
READY_TIMEOUT_S = 10.0
#: What a close waits for the reader task.
STOP_TIMEOUT_S = 5.0


class AudioStream:
    """One session's audio stream; use ``async with client.stream_audio(id) as stream``.

    **Errors.** A server ``error`` message (``bad_frame``, ``bad_message``,
    ``audio_queue_full``) refers to a message already sent, so it is delivered twice:
    as a dict in :meth:`events`, and raised as its typed :class:`LipstreamError` from the
    next :meth:`send`, :meth:`end` or :meth:`interrupt` (once). After the stream closed
    (the session ended, the server or the app closed it) those raise
    :class:`StreamClosed`, or :class:`EventsOverflow` when the server dropped a listener
    that fell behind.

    **Flow control.** :meth:`send` waits while the server's queue, as last reported and
    estimated since, would exceed ``max_ahead_ms`` (at most half the server's
    ``max_buffer_ms``): it wakes on the server's messages, and once the avatar speaks,
    when the queue has played down far enough.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[ClientWebSocketResponse]],
        *,
        format: PcmFormat = "s16le",
        rate: int = 16000,
        max_ahead_ms: float = 2000.0,
        event_queue_size: int = 256,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._connect = connect
        self.format: PcmFormat = format
        self.rate = rate
        self._clock = clock
        self._max_ahead_ms = max_ahead_ms
        self._window: SendWindow | None = None
        self._ws: ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._events: DropOldestQueue[Event] = DropOldestQueue(event_queue_size)
        self._changed = asyncio.Event()
        self._pending: LipstreamError | None = None
        self._closed_error: LipstreamError | None = None
        self.ready: Event = {}
        self.queued_ms = 0.0

    # -- lifetime ---------------------------------------------------------------------

    async def open(self) -> AudioStream:
        """Connect and wait for the server's ``ready``; refusals raise their typed error."""
        ws = await self._connect()
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                message = await ws.receive()
        except TimeoutError:
            await ws.close()
            raise StreamClosed(
                f"the server sent no 'ready' within {READY_TIMEOUT_S:g} s", code="stream_closed"
            ) from None
        except BaseException:  # cancelled mid-handshake: free the session's one stream
            await asyncio.shield(ws.close())
            raise
        ready = _json_message(message.type, message.data)
        if ready is None or ready.get("type") != "ready":
            await ws.close()
            if ready is not None and ready.get("type") == "error":
                raise error_from_message(ready)
            raise StreamClosed(
                f"expected the server's 'ready', got {message.type.name} {message.data!r:.200}",
                code="stream_closed",
            )
        self._ws = ws
        self.ready = ready
        self._events.put(ready)
        max_ahead = self._max_ahead_ms
        max_buffer = ready.get("max_buffer_ms")
        if isinstance(max_buffer, int | float) and max_ahead > max_buffer / 2:
            logger.info(
                "audio stream: max_ahead_ms %.0f lowered to %.0f, half the server's max_buffer_ms",
                max_ahead,
                max_buffer / 2,
            )
            max_ahead = max_buffer / 2
        clock = self._clock or asyncio.get_running_loop().time
        self._window = SendWindow(max_ahead, clock)
        self._reader = asyncio.create_task(
            self._read(ws), name=f"lipstream-stream-{ready.get('session_id', '?')}"
        )
        logger.debug("audio stream open: %s", ready)
        return self

    async def __aenter__(self) -> AudioStream:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the socket (the open utterance still plays out) and stop reading."""
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await self._reader
        self._set_closed(StreamClosed("the audio stream is closed", code="stream_closed"))

    @property
    def closed(self) -> bool:
        return self._closed_error is not None

    @property
    def max_ahead_ms(self) -> float:
        """The flow-control window in use (after the server's ``ready``)."""
        return self._window.max_ahead_ms if self._window is not None else self._max_ahead_ms

    # -- sending ----------------------------------------------------------------------

    async def send(self, pcm: bytes | np.ndarray) -> None:
        """Send audio: bytes in the stream's format, or samples (float in [-1, 1] or
        int16, converted to it). Split into messages of at most 1 s, each sent once the
        flow-control window has room for it."""
        data = pcm if isinstance(pcm, bytes) else to_pcm_bytes(pcm, self.format)
        sample_bytes = SAMPLE_BYTES[self.format]
        window = self._open_window()
        max_samples = max(1, int(self.rate * min(1000.0, window.max_ahead_ms / 2) / 1000))
        for piece in split_pcm(data, sample_bytes, max_samples):
            duration_ms = len(piece) / sample_bytes / self.rate * 1000.0
            await self._wait_for_room(window, duration_ms)
            await self._socket().send_bytes(piece)
            window.on_sent(duration_ms)

    async def end(self) -> None:
        """End the open utterance; its ``speech_ended`` follows once it has played."""
        self._raise_pending()
        await self._socket().send_str(json.dumps({"type": "end"}))

    async def interrupt(self) -> None:
        """Drop all audio queued in the session, as ``POST /sessions/{id}/interrupt``.

        Always sent while the stream is open: an error about an earlier message is
        dropped, not raised (the interrupt drops that audio anyway), so a barge-in is
        never lost to it."""
        self._pending = None
        await self._socket().send_str(json.dumps({"type": "interrupt"}))

    async def switch_avatar(self, avatar: str) -> None:
        """Ask for ``avatar`` in the call, as :meth:`Client.switch_avatar` does, without
        waiting: ``avatar_changed`` arrives in :meth:`events` when its first frame is
        sent; a refusal (``model_not_found``, ``avatar_incompatible``, …) arrives as an
        ``error`` message to this stream alone, raised as usual."""
        self._raise_pending()
        await self._socket().send_str(json.dumps({"type": "switch_avatar", "avatar": avatar}))

    async def set_idle_clip(self, clip: str) -> None:
        """Play ``clip`` while the avatar is silent, as :meth:`Client.set_idle_clip`
        does; ``idle_clip_changed`` follows, or an ``error`` (``clip_not_found``)."""
        self._raise_pending()
        await self._socket().send_str(json.dumps({"type": "set_idle_clip", "clip": clip}))

    def events(self) -> DropOldestQueue[Event]:
        """Every server message (``ready``, ``queued_ms``, ``speech_*``, ``interrupted``,
        ``avatar_changed``, ``idle_clip_changed``, ``error``, ``session_ended``) as a
        dict, in order; the iteration ends when the stream closes. Holds
        ``event_queue_size`` messages, dropping the oldest."""
        return self._events

    async def _wait_for_room(self, window: SendWindow, duration_ms: float) -> None:
        while True:
            self._raise_pending()
            wait_s = window.wait_s(duration_ms)
            if wait_s == 0.0:
                return
            self._changed.clear()
            # Woken by any server message; else when the queue should have played down.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._changed.wait()

    def _open_window(self) -> SendWindow:
        self._raise_pending()
        if self._window is None:
            raise StreamClosed(
                "the audio stream is not open: use 'async with'", code="stream_closed"
            )
        return self._window

    def _socket(self) -> ClientWebSocketResponse:
        self._raise_pending()
        assert self._ws is not None  # open() set it, and _raise_pending saw it open
        return self._ws

    def _raise_pending(self) -> None:
        error, self._pending = self._pending, None
        if error is not None:
            raise error
        if self._closed_error is not None:
            raise self._closed_error

    # -- receiving --------------------------------------------------------------------

    async def _read(self, ws: ClientWebSocketResponse) -> None:
        closed: LipstreamError = StreamClosed("the audio stream closed", code="stream_closed")
        try:
            while True:
                message = await ws.receive()
                if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                    closed = _close_error(ws.close_code, message.extra)
                    break
                if message.type == WSMsgType.ERROR:
                    closed = _close_error(ws.close_code, str(message.data))
                    break
                event = _json_message(message.type, message.data)
                if event is None:
                    logger.warning("audio stream: ignoring a %s message", message.type.name)
                    continue
                self._on_event(event)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:
            logger.exception("audio stream: reading the server's messages failed")
        finally:
            self._set_closed(closed)

    def _on_event(self, event: Event) -> None:
        kind = event.get("type")
        window = self._window
        assert window is not None
        if kind == "queued_ms":
            self.queued_ms = float(event.get("queued_ms", 0.0))
            window.on_report(self.queued_ms)
        elif kind == "speech_started":
            window.on_playing()
        elif kind == "interrupted":
            self.queued_ms = 0.0
            window.on_report(0.0)
        elif kind == "error":
            self._pending = error_from_message(event)
            logger.warning("audio stream: the server refused a message: %s", self._pending)
        self._events.put(event)
        self._changed.set()

    def _set_closed(self, error: LipstreamError) -> None:
        if self._closed_error is None:
            self._closed_error = error
            logger.debug("audio stream closed: %s", error)
        self._events.close()
        self._changed.set()


def _json_message(kind: WSMsgType, data: object) -> Event | None:
    if kind != WSMsgType.TEXT or not isinstance(data, str):
        return None
    try:
        parsed = json.loads(data)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _close_error(code: int | None, reason: object) -> LipstreamError:
    """What sending on a stream the server closed raises: the close code and reason."""
    text = reason if isinstance(reason, str) else ""
    if text == "events_overflow":
        return EventsOverflow(
            "the server closed the stream: this client fell behind on its events",
            code="events_overflow",
        )
    detail = f"code {code}" + (f", {text}" if text else "") if code is not None else text
    return StreamClosed(
        f"the server closed the audio stream ({detail or 'no reason given'})",
        code="stream_closed",
    )
