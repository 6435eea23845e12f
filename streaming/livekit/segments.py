"""The agent's speech into the session, and what it is told back (``docs/design/livekit.md`` §22).

LiveKit Agents' ``DataStreamAudioOutput`` sends each speech segment as one byte stream
on topic ``lk.audio_stream`` to the avatar: raw interleaved 16-bit PCM, its
``sample_rate`` and ``num_channels`` in the stream's attributes, the stream's end the
segment's end. Each segment becomes one utterance of the session's audio stream
(:class:`~streaming.live.stream_in.AudioStreamIn`, resampled and mixed down exactly as a
WebSocket stream is), so everything lipstream tells apps about an utterance holds for a
segment too, and the agent is told from those same events:

- ``speech_started`` of a segment's utterance → RPC ``lk.playback_started`` (an agent
  that did not ask for it answers "unsupported method"; it is then not sent again);
- ``speech_ended`` → RPC ``lk.playback_finished`` with ``playback_position`` = its
  ``played_ms`` (the audio handed to the room's audio track, to the sample) and its
  ``interrupted``;
- RPC ``lk.clear_buffer`` from the agent → the session's interrupt: the rest of the
  open segment is dropped unread, the queue and the unsent frames go, and every cut
  segment's ``speech_ended`` (``interrupted: true``) becomes its ``lk.playback_finished``.
  A segment cut before any of it was queued is answered at once, at position 0.

Only the agent the token names (``lk.publish_on_behalf``) is listened to. A segment
faster than real time (TTS usually is) is read as the session's queue makes room
(``session.max_stream_buffer_s``): the rest waits in the byte stream, unread. A segment
whose agent left in the middle of it ends where it broke off (what came plays); the
session's watchdog then ends the session (``agent left``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from livekit import rtc

from streaming.audio_in.exceptions import AudioInputError, AudioQueueFullError
from streaming.audio_in.stream import MAX_CHANNELS, PcmStreamDecoder, StreamFormat
from streaming.live.app_audio import AppAudio
from streaming.live.events import EventListener
from streaming.live.stream_in import AudioStreamIn

logger = logging.getLogger(__name__)

AUDIO_STREAM_TOPIC = "lk.audio_stream"
RPC_CLEAR_BUFFER = "lk.clear_buffer"
RPC_PLAYBACK_STARTED = "lk.playback_started"
RPC_PLAYBACK_FINISHED = "lk.playback_finished"
#: Sample rates a segment may declare (what TTS engines and LiveKit resample to).
MIN_RATE, MAX_RATE = 8_000, 96_000
#: Segments received and not yet read (the agent sends one at a time; more means their
#: trailers were lost, and the oldest are dropped).
MAX_WAITING_SEGMENTS = 8
#: The most audio one write into the session carries.
WRITE_S = 0.1
#: A segment with no chunk nor end for this long lost its trailer, and ends (as
#: livekit-agents' own receiver does).
STREAM_IDLE_S = 10.0
#: How often a reader waiting for room in the session's queue looks again.
ROOM_POLL_S = 0.04
#: Tries of each RPC to the agent (LiveKit's own retries cover transport; this covers a
#: data channel that reconnects).
RPC_TRIES = 3


class SegmentError(AudioInputError):
    """A byte stream on ``lk.audio_stream`` that cannot be played."""


@dataclass
class Segment:
    """One byte stream of the agent's: its utterance once its first audio was queued."""

    reader: rtc.ByteStreamReader
    utterance: int | None = None
    cleared: bool = False
    answered: bool = False  # its lk.playback_finished went


def segment_format(attributes: dict[str, str]) -> StreamFormat:
    """The format a segment's attributes declare, or :class:`SegmentError`."""
    try:
        rate = int(attributes["sample_rate"])
        channels = int(attributes["num_channels"])
    except (KeyError, ValueError):
        raise SegmentError(
            f"an {AUDIO_STREAM_TOPIC} byte stream needs integer sample_rate and num_channels "
            f"attributes; got {sorted(attributes)}"
        ) from None
    if not MIN_RATE <= rate <= MAX_RATE or not 1 <= channels <= MAX_CHANNELS:
        raise SegmentError(
            f"sample_rate={rate}, num_channels={channels}: segments are {MIN_RATE}-{MAX_RATE} "
            f"Hz with 1-{MAX_CHANNELS} channels"
        )
    return StreamFormat("s16le", rate, channels)


class AgentAudio:
    """The agent's segments into ``app_audio``, and the playback RPCs back (module doc).
    :meth:`read`, :meth:`forward` and :meth:`tell` are the session's tasks."""

    def __init__(
        self,
        room: rtc.Room,
        agent: str,
        app_audio: AppAudio,
        *,
        interrupt: Callable[[], object],
    ) -> None:
        self._room = room
        self._agent = agent
        self._app_audio = app_audio
        self._interrupt = interrupt
        self._waiting: deque[Segment] = deque()
        self._arrived = asyncio.Event()
        self._current: Segment | None = None
        self._by_utterance: dict[int, Segment] = {}
        self._stream: AudioStreamIn | None = None
        # What the agent is to be told, in order: (method, payload). Bounded: each
        # segment adds two at most, and a segment is answered once.
        self._notices: asyncio.Queue[tuple[str, str]] = asyncio.Queue(
            maxsize=4 * MAX_WAITING_SEGMENTS
        )
        self._started_rpc = True  # False once the agent said it does not take it
        self.segments = 0
        self.interrupts = 0
        self.rpc_failures = 0

    def attach(self) -> None:
        """Take the agent's byte streams and its ``lk.clear_buffer`` from now on."""
        self._room.register_byte_stream_handler(AUDIO_STREAM_TOPIC, self._received)
        self._room.local_participant.register_rpc_method(RPC_CLEAR_BUFFER, self._clear_buffer)

    def _received(self, reader: rtc.ByteStreamReader, sender: str) -> None:
        if sender != self._agent:
            logger.info(
                "audio stream from %s ignored: the avatar speaks for %s", sender, self._agent
            )
            return
        if len(self._waiting) >= MAX_WAITING_SEGMENTS:
            logger.warning("segment dropped unread: %d waiting", MAX_WAITING_SEGMENTS)
            self._finish_unplayed(self._waiting.popleft())
        self._waiting.append(Segment(reader))
        self._arrived.set()

    def _clear_buffer(self, data: rtc.RpcInvocationData) -> str:
        if data.caller_identity != self._agent:
            return "reject"
        self.interrupts += 1
        current = self._current
        if current is not None:
            current.cleared = True
        while self._waiting:
            self._finish_unplayed(self._waiting.popleft())
        self._interrupt()  # speech_ended (interrupted) for each cut utterance follows
        if current is not None:
            self._finish_unplayed(current)  # cut before any of it was queued
        return "ok"

    # -- reading segments ------------------------------------------------------------

    async def read(self) -> None:
        """The task reading segments into the session, one after the other."""
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            while self._waiting:
                segment = self._waiting.popleft()
                self._current = segment
                try:
                    await self._play(segment)
                except (SegmentError, AudioInputError) as exc:
                    logger.warning("segment refused: %s", exc)
                    segment.cleared = True
                    self._finish_unplayed(segment)
                finally:
                    self._current = None

    async def _play(self, segment: Segment) -> None:
        stream_format = segment_format(dict(segment.reader.info.attributes or {}))
        self.segments += 1
        stream = self._stream_for(stream_format)
        frame_bytes = stream_format.sample_bytes
        step = frame_bytes * max(1, int(stream_format.rate * WRITE_S))
        pending = b""
        received = 0
        chunks = aiter(segment.reader)
        while not segment.cleared:
            try:
                chunk = await asyncio.wait_for(anext(chunks), STREAM_IDLE_S)
            except StopAsyncIteration:
                break
            except TimeoutError:  # its trailer was lost: the segment ends here
                logger.warning("segment idle for %g s: ended", STREAM_IDLE_S)
                break
            except rtc.StreamError as exc:  # the agent left mid-segment: what came plays
                logger.info("segment ended early: %s", exc)
                break
            pending += chunk
            received += len(chunk)
            usable = len(pending) - len(pending) % frame_bytes
            for start in range(0, usable, step):
                if not await self._write(
                    stream, pending[start : min(start + step, usable)], segment
                ):
                    break
            pending = pending[usable:]
        seconds = received / frame_bytes / stream_format.rate
        if segment.cleared:
            logger.info("segment cleared: %.3f s received", seconds)
            stream.decoder.restart()
            return
        logger.info("segment received: %.3f s", seconds)
        stream.end()
        if segment.utterance is None:  # an empty segment: nothing will be heard
            self._finish_unplayed(segment)

    async def _write(self, stream: AudioStreamIn, data: bytes, segment: Segment) -> bool:
        """Queue ``data`` once the session's queue has room for it (a segment comes faster
        than real time); False if the segment was cleared meanwhile."""
        while not segment.cleared:
            try:
                queued = stream.write(data)
            except AudioQueueFullError:
                await asyncio.sleep(ROOM_POLL_S)
                continue
            if segment.utterance is None:
                segment.utterance = queued.utterance
                self._by_utterance[queued.utterance] = segment
            return True
        return False

    def _stream_for(self, stream_format: StreamFormat) -> AudioStreamIn:
        stream = self._stream
        if stream is None or stream.closed:
            stream = self._app_audio.open_stream(stream_format)
            self._stream = stream
        elif stream.decoder.format != stream_format:
            stream.decoder = PcmStreamDecoder(stream_format)
        return stream

    def close(self) -> None:
        """The session ended: its stream too."""
        if self._stream is not None:
            self._stream.close()

    # -- telling the agent -----------------------------------------------------------

    async def forward(self, listener: EventListener) -> None:
        """The task turning the session's speech events into notices for the agent."""
        async for event in listener:
            kind = event["type"]
            if kind not in ("speech_started", "speech_ended"):
                continue
            segment = self._by_utterance.get(event["utterance"])
            if segment is None:
                continue  # audio an app pushed or said, not the agent's
            if kind == "speech_started":
                if self._started_rpc:
                    self._notice(RPC_PLAYBACK_STARTED, "")
                continue
            del self._by_utterance[event["utterance"]]
            if not segment.answered:
                segment.answered = True
                self._finished(event["played_ms"] / 1000, bool(event["interrupted"]))

    async def tell(self) -> None:
        """The task sending the notices, in order."""
        while True:
            method, payload = await self._notices.get()
            if method == RPC_PLAYBACK_STARTED and not self._started_rpc:
                continue
            await self._rpc(method, payload)

    def _finish_unplayed(self, segment: Segment) -> None:
        """Answer a segment none of which will be heard (dropped, refused, cut before
        its first audio): position 0, interrupted."""
        if segment.answered or segment.utterance is not None:
            return
        segment.answered = True
        self._finished(0.0, True)

    def _finished(self, position_s: float, interrupted: bool) -> None:
        payload = {
            "playback_position": round(position_s, 4),
            "interrupted": interrupted,
            "synchronized_transcript": None,
        }
        self._notice(RPC_PLAYBACK_FINISHED, json.dumps(payload))

    def _notice(self, method: str, payload: str) -> None:
        try:
            self._notices.put_nowait((method, payload))
        except asyncio.QueueFull:
            logger.warning("%s to %s dropped: the agent does not take RPCs", method, self._agent)

    async def _rpc(self, method: str, payload: str) -> None:
        for attempt in range(1, RPC_TRIES + 1):
            try:
                await self._room.local_participant.perform_rpc(
                    destination_identity=self._agent, method=method, payload=payload
                )
                return
            except rtc.RpcError as exc:
                if exc.code == rtc.RpcError.ErrorCode.UNSUPPORTED_METHOD:
                    if method == RPC_PLAYBACK_STARTED:
                        self._started_rpc = False
                    return
                if attempt == RPC_TRIES:
                    self.rpc_failures += 1
                    logger.warning("%s to %s failed: %s", method, self._agent, exc.message)
