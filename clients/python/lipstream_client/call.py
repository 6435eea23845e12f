"""A WebRTC call to an avatar with aiortc: :func:`connect` opens it, :class:`Call` holds it.

The offer follows ``docs/guides/calling.md`` ("A call over WebRTC and JSON"): a recvonly
video transceiver, audio sendrecv with the app's microphone track (or recvonly), a data
channel labelled ``lipstream`` for session events, ICE gathered completely before
``POST /offer`` (the server does not trickle). Received tracks are always drained into
bounded queues, since aiortc's own are unbounded: an app that does not read them loses
the oldest frames, not memory.

What a call receives (tracks drained, events from the data channel, the wait for ICE)
is :class:`Receiver`, which a session's viewer (:mod:`lipstream_client.viewer`) shares.

Why one module of about 480 lines: :func:`connect` and :func:`open_call` build exactly
the peer connection :class:`Call` drains and hangs up; split, the offer's shape and the
tracks it promises would live apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, ClassVar

import av
import numpy as np
from aiohttp import ClientSession
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

from lipstream_client.audio_stream import AudioStream
from lipstream_client.errors import ConnectionFailed, LipstreamError, SessionNotFound
from lipstream_client.http import Client
from lipstream_client.models import (
    AudioFrame,
    AvatarSwitched,
    CallStats,
    DelayBudget,
    Event,
    IceServer,
    IdleClipSet,
    Queued,
    QueueSizes,
    VideoFrame,
)
from lipstream_client.pcm import PcmFormat
from lipstream_client.queues import DropOldestQueue

logger = logging.getLogger(__name__)

#: The data channel the server sends session events on.
EVENTS_CHANNEL = "lipstream"
#: Video RTP timestamps count at 90 kHz (RFC 3551).
VIDEO_CLOCK_HZ = 90_000
#: What a hang-up waits for the receive tasks.
STOP_TIMEOUT_S = 5.0


class Receiver:
    """What a call and a viewer receive: the peer connection's tracks drained into
    bounded queues, and the session's events from its ``lipstream`` data channel.

    ``video_frames()``, ``audio_frames()`` and ``events()`` are bounded queues, each read
    by one consumer. :attr:`kind` names it in logs and errors.
    """

    kind: ClassVar[str] = "receiver"

    def __init__(
        self,
        client: Client,
        pc: RTCPeerConnection,
        *,
        fps: int,
        queues: QueueSizes,
        owns_client: bool,
    ) -> None:
        self.client = client
        self.pc = pc
        self.session_id = ""
        self._fps = fps
        self._owns_client = owns_client
        self._video: DropOldestQueue[VideoFrame] = DropOldestQueue(queues.video)
        self._audio: DropOldestQueue[AudioFrame] = DropOldestQueue(queues.audio)
        self._events: DropOldestQueue[Event] | None = None
        self._channel: RTCDataChannel | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._state_changed = asyncio.Event()
        self._closed = False
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._state_changed.set)

    # -- set-up -----------------------------------------------------------------------

    def _open_events_channel(self, size: int) -> None:
        channel = self.pc.createDataChannel(EVENTS_CHANNEL)
        events: DropOldestQueue[Event] = DropOldestQueue(size)
        self._events = events

        def on_message(message: str | bytes) -> None:
            try:
                event = json.loads(message)
            except ValueError:
                event = None
            if not isinstance(event, dict):
                logger.warning("%s: ignoring a data channel message %.200r", self._label(), message)
                return
            events.put(event)

        channel.on("message", on_message)
        channel.on("open", self._state_changed.set)
        channel.on("close", events.close)
        channel.on("close", self._state_changed.set)
        self._channel = channel

    # -- state ------------------------------------------------------------------------

    def _label(self) -> str:
        """What logs and errors call it."""
        return f"{self.kind} {self.session_id}"

    @property
    def connection_state(self) -> str:
        """The peer connection's state: ``new``, ``connecting``, ``connected``, ``failed``,
        ``closed``."""
        state: str = self.pc.connectionState
        return state

    async def wait_connected(self, timeout_s: float | None = None) -> None:
        """Wait until media can flow and the events data channel (if any) is open, so no
        event of the session is missed; :class:`ConnectionFailed` if ICE or DTLS fails,
        the call or its channel closes, or ``timeout_s`` passes."""
        try:
            async with asyncio.timeout(timeout_s):
                while not self._ready():
                    if self.connection_state in ("failed", "closed"):
                        raise ConnectionFailed(
                            f"{self._label()}: the connection is {self.connection_state}",
                            code="connection_failed",
                        )
                    if self._channel is not None and self._channel.readyState == "closed":
                        raise ConnectionFailed(
                            f"{self._label()}: the server closed the events data channel",
                            code="connection_failed",
                        )
                    self._state_changed.clear()
                    await self._state_changed.wait()
        except TimeoutError:
            raise ConnectionFailed(
                f"{self._label()}: not connected within {timeout_s:g} s "
                f"(state {self.connection_state})",
                code="connection_failed",
            ) from None

    def _ready(self) -> bool:
        channel = self._channel
        return self.connection_state == "connected" and (
            channel is None or channel.readyState == "open"
        )

    @property
    def stats(self) -> CallStats:
        """Frames and events received, and those dropped unread."""
        events = self._events
        return CallStats(
            video_frames=self._video.put_count,
            audio_frames=self._audio.put_count,
            events=events.put_count if events is not None else 0,
            video_dropped=self._video.dropped,
            audio_dropped=self._audio.dropped,
            events_dropped=events.dropped if events is not None else 0,
        )

    # -- what is received -------------------------------------------------------------

    def video_frames(self) -> DropOldestQueue[VideoFrame]:
        """The received video, decoded: ``async for frame in call.video_frames()``; ends
        when the call (or viewer) does."""
        return self._video

    def audio_frames(self) -> DropOldestQueue[AudioFrame]:
        """The received audio (the avatar's speech and the caller's own, delayed)."""
        return self._audio

    def events(self) -> DropOldestQueue[Event]:
        """Session events from the data channel (docs/apps.md, Events); ends when the
        channel closes. Without one (``data_channel=False``), use
        ``client.events(session_id)``."""
        if self._events is None:
            raise RuntimeError(
                f"this {self.kind} has no data channel (data_channel=False): use "
                f"{self.kind}.client.events({self.kind}.session_id) for server-sent events"
            )
        return self._events

    def _on_track(self, track: MediaStreamTrack) -> None:
        task = asyncio.create_task(
            self._drain(track), name=f"lipstream-{track.kind}-{self.session_id}"
        )
        self._tasks.append(task)

    async def _drain(self, track: MediaStreamTrack) -> None:
        first_pts: int | None = None
        try:
            while True:
                frame = await track.recv()
                received_at = time.monotonic()
                if frame.pts is None:  # aiortc stamps every decoded frame; never seen
                    continue
                if first_pts is None:
                    first_pts = frame.pts
                elapsed = frame.pts - first_pts
                if isinstance(frame, av.VideoFrame):
                    self._video.put(
                        VideoFrame(
                            index=round(elapsed * self._fps / VIDEO_CLOCK_HZ),
                            media_ms=elapsed * 1000.0 / VIDEO_CLOCK_HZ,
                            frame=frame,
                            received_at=received_at,
                        )
                    )
                elif isinstance(frame, av.AudioFrame):
                    media_ms = elapsed * 1000.0 / frame.sample_rate
                    self._audio.put(AudioFrame(media_ms, frame, received_at))
        except (MediaStreamError, ConnectionError, asyncio.CancelledError):
            pass
        except Exception:
            logger.exception("%s: receiving %s failed", self._label(), track.kind)
        finally:
            (self._video if track.kind == "video" else self._audio).close()

    # -- the end ----------------------------------------------------------------------

    async def close(self) -> None:
        """Close the peer connection and stop the receive tasks without telling the
        server (it notices the connection vanished); :meth:`Call.hang_up` and
        :meth:`Viewer.leave <lipstream_client.viewer.Viewer.leave>` are the polite ends."""
        if self._closed:
            return
        self._closed = True
        await self._close()

    async def _end(self, tell_server: Callable[[], Awaitable[object]] | None) -> None:
        """End once: ``tell_server`` (if any; a session or viewer already gone is fine),
        then :meth:`_close` whatever it answered."""
        if self._closed:
            return
        self._closed = True
        try:
            if tell_server is not None:
                with contextlib.suppress(SessionNotFound):
                    await tell_server()
        except (LipstreamError, OSError) as exc:  # it still ends here
            logger.warning("%s: the request ending it failed: %s", self._label(), exc)
        finally:
            await self._close()

    async def _close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await asyncio.gather(*self._tasks, return_exceptions=True)
        self._video.close()
        self._audio.close()
        if self._events is not None:
            self._events.close()
        if self._owns_client:
            await self.client.close()
        logger.info("%s: ended (%s)", self._label(), self.stats)


class Call(Receiver):
    """One call: its session, its received media and events (:class:`Receiver`), and
    session control.

    Made by :func:`connect`; ``async with`` hangs up on exit.
    """

    kind: ClassVar[str] = "call"

    def __init__(
        self,
        client: Client,
        pc: RTCPeerConnection,
        *,
        fps: int,
        queues: QueueSizes,
        owns_client: bool,
    ) -> None:
        super().__init__(client, pc, fps=fps, queues=queues, owns_client=owns_client)
        self.avatar = ""
        self.delay: DelayBudget | None = None

    # -- set-up -----------------------------------------------------------------------

    async def _offer(self, avatar: str) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())  # gathers all of ICE
        answer = await self.client.offer(self.pc.localDescription.sdp, avatar)
        self.session_id = answer.session_id
        self.avatar = avatar
        self.delay = answer.delay
        logger.info("call %s: offer answered for avatar %s", self.session_id, avatar)
        await self.pc.setRemoteDescription(RTCSessionDescription(answer.sdp, answer.type))

    # -- session control, bound to this call's session --------------------------------

    async def say(self, text: str, voice: str | None = None) -> Queued:
        """:meth:`Client.say` for this call."""
        return await self.client.say(self.session_id, text, voice)

    async def push_audio(self, data: bytes, content_type: str) -> Queued:
        """:meth:`Client.push_audio` for this call."""
        return await self.client.push_audio(self.session_id, data, content_type)

    async def push_pcm(self, samples: np.ndarray, rate: int) -> Queued:
        """:meth:`Client.push_pcm` for this call."""
        return await self.client.push_pcm(self.session_id, samples, rate)

    async def interrupt(self) -> float:
        """:meth:`Client.interrupt` for this call: the milliseconds dropped."""
        return await self.client.interrupt(self.session_id)

    async def switch_avatar(self, avatar: str) -> AvatarSwitched:
        """:meth:`Client.switch_avatar` for this call; :attr:`avatar` follows.

        The received frames change size with the avatar's (the decoder follows the
        keyframe the server sends); :attr:`VideoFrame.index` goes on counting, since a
        switch keeps the frame rate.
        """
        switched = await self.client.switch_avatar(self.session_id, avatar)
        self.avatar = switched.avatar
        return switched

    async def set_idle_clip(self, clip: str) -> IdleClipSet:
        """:meth:`Client.set_idle_clip` for this call."""
        return await self.client.set_idle_clip(self.session_id, clip)

    async def state(self) -> dict[str, Any]:
        """:meth:`Client.state` for this call."""
        return await self.client.state(self.session_id)

    def stream_audio(
        self, *, format: PcmFormat = "s16le", rate: int = 16000, max_ahead_ms: float = 2000.0
    ) -> AudioStream:
        """:meth:`Client.stream_audio` for this call."""
        return self.client.stream_audio(
            self.session_id, format=format, rate=rate, max_ahead_ms=max_ahead_ms
        )

    # -- the end ----------------------------------------------------------------------

    async def __aenter__(self) -> Call:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.hang_up()

    async def hang_up(self) -> None:
        """End the call: ``DELETE`` the session (one already gone is fine), close the peer
        connection, stop the receive tasks. The app's microphone track is left running."""
        session_id = self.session_id
        await self._end((lambda: self.client.hang_up(session_id)) if session_id else None)


async def connect(
    base_url: str,
    avatar: str,
    *,
    token: str | None = None,
    microphone: MediaStreamTrack | None = None,
    receive_audio: bool = True,
    data_channel: bool = True,
    ice_servers: Sequence[IceServer] | None = None,
    timeout_s: float = 30.0,
    session: ClientSession | None = None,
    queues: QueueSizes | None = None,
    fps: int = 25,
) -> Call:
    """Call ``avatar`` on the server at ``base_url`` and wait until media flows.

    ``microphone`` is sent to the server (audio sendrecv), else audio is receive-only
    (``receive_audio``) or left out. ``ice_servers`` default to the server's
    ``GET /webrtc-config`` list (never aiortc's default public STUN server). ``fps`` is
    the avatar's frame rate, for :attr:`VideoFrame.index`; ``queues`` bounds the receive
    queues (:class:`QueueSizes`). Raises :class:`ConnectionFailed` when the call is not
    connected within ``timeout_s``, and the server's refusals as their
    :class:`LipstreamError`; nothing is left open then.
    """
    client = Client(base_url, token=token, session=session)
    call: Call | None = None
    try:
        async with asyncio.timeout(timeout_s):
            call = await open_call(
                client,
                avatar,
                microphone=microphone,
                receive_audio=receive_audio,
                data_channel=data_channel,
                ice_servers=ice_servers,
                queues=queues,
                fps=fps,
            )
            call._owns_client = True
            await call.wait_connected()
        return call
    except BaseException as exc:
        if call is not None:
            await call.hang_up()
        await client.close()
        if isinstance(exc, TimeoutError):
            raise ConnectionFailed(
                f"the call to {avatar!r} did not connect within {timeout_s:g} s",
                code="connection_failed",
            ) from None
        raise


async def open_call(
    client: Client,
    avatar: str,
    *,
    pc: RTCPeerConnection | None = None,
    microphone: MediaStreamTrack | None = None,
    receive_audio: bool = True,
    data_channel: bool = True,
    ice_servers: Sequence[IceServer] | None = None,
    queues: QueueSizes | None = None,
    fps: int = 25,
) -> Call:
    """The offer and answer of :func:`connect`, on ``client``, without waiting for ICE.

    ``pc`` is a peer connection of your own, with its own ICE configuration (then
    ``ice_servers`` is not used); the call adds its transceivers and data channel to it,
    and closes it on hang-up. ``client`` stays open after the call. A refused offer
    closes what was opened and raises.
    """
    queues = queues or QueueSizes()
    if pc is None:
        if ice_servers is None:
            ice_servers = (await client.webrtc_config()).ice_servers
        pc = RTCPeerConnection(RTCConfiguration(iceServers=rtc_ice_servers(ice_servers)))
    call = Call(client, pc, fps=fps, queues=queues, owns_client=False)
    try:
        if microphone is not None:
            pc.addTransceiver(microphone, direction="sendrecv" if receive_audio else "sendonly")
        elif receive_audio:
            pc.addTransceiver("audio", direction="recvonly")
        pc.addTransceiver("video", direction="recvonly")
        if data_channel:
            call._open_events_channel(queues.events)
        await call._offer(avatar)
    except BaseException:
        await call.hang_up()
        raise
    return call


def rtc_ice_servers(servers: Sequence[IceServer]) -> list[RTCIceServer]:
    """``servers`` as aiortc's configuration takes them."""
    return [
        RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
        for s in servers
    ]
