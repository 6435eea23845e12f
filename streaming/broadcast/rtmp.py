"""A session pushed to an RTMP ingest (YouTube, Twitch, nginx-rtmp, a CDN) as H.264 + AAC
in FLV (``docs/design/broadcast.md`` §21).

The video is the session's own encode, never encoded again: on each video slot of the
session's clock the output takes the frame the session sent from its feed, through the
same chain rule as a viewer (:class:`~streaming.broadcast.feed.ViewerVideo`: from an
IDR on), with the session's audio packets of that frame's time, and writes them to a
child process of its own (:mod:`~streaming.broadcast.rtmp_push`), which runs FFmpeg's
RTMP client: its network writes block, and PyAV holds the GIL through them, so in the
server's process an ingest that stopped answering would stop everything. All the event
loop does per frame is join the frame's payloads into an access unit and write a few
kilobytes to a pipe; when the pipe holds more than :data:`PIPE_LIMIT` (the child, or
the ingest behind it, is slower than real time) the frame is dropped, never queued, and
the output starts again from the next IDR.

A child that reports an error, exits, does not go live within ``outputs.connect_timeout_s``
of connecting, or reports no progress for as long once live, is ended (killed if it must
be) and a new one started after 1 s, then 2, 4… up to ``outputs.retry_max_s``, from the
next IDR. :class:`OutputStatus` says where the output is (``connecting``, ``live``,
``retrying``, ``ended``) with its counters and last error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import av

from streaming.audio_rates import AUDIO_CHUNK_S
from streaming.broadcast.feed import VideoFeed, ViewerVideo
from streaming.broadcast.h264_units import access_unit
from streaming.broadcast.rtmp_push import AUDIO, KEYFRAME, VIDEO, message
from streaming.idle_loops import carries_idr
from streaming.webrtc.pacing import SessionClock, wait_for_slot
from streaming.webrtc.tracks import PacketSource
from streaming.webrtc.video_encoder import LipstreamH264Encoder

logger = logging.getLogger(__name__)

#: Bytes written to the child and not yet read by it beyond which frames are dropped
#: (about a second of a 720p stream).
PIPE_LIMIT = 512 * 1024
#: Seconds a stopped child is given to close its stream before it is killed.
STOP_S = 5.0


@dataclass
class OutputStatus:
    """What an output is doing, and has done (``GET /sessions/{id}/outputs``)."""

    output_id: str
    kind: str
    target: str  # the URL without its stream key
    state: str = "connecting"  # connecting, live, retrying, ended
    frames_sent: int = 0
    frames_dropped: int = 0  # the ingest was slower than real time
    bytes_sent: int = 0
    connects: int = 0  # times it went live
    retries: int = 0
    last_error: str | None = None
    started_at: float = field(default_factory=time.time)


def shown_target(url: str) -> str:
    """``url`` without what authorises the push (the stream key, credentials, query)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    app = parts.path.rsplit("/", 1)[0] if parts.path.count("/") > 1 else ""
    return f"{parts.scheme}://{host}{app}/…"


class RtmpOutput:
    """The session pushed to ``url`` (module doc); :meth:`run` is its task."""

    def __init__(
        self,
        status: OutputStatus,
        url: str,
        *,
        clock: SessionClock,
        fps: int,
        feed: VideoFeed,
        audio: PacketSource,
        encoder: LipstreamH264Encoder,
        retry_max_s: float,
        timeout_s: float,
    ) -> None:
        self.status = status
        self._url = url
        self._clock = clock
        self._fps = fps
        self._video = ViewerVideo(feed)
        self._audio = audio
        self._encoder = encoder  # never opened: it only carries keyframe requests
        self._retry_max_s = retry_max_s
        self._timeout_s = timeout_s
        self._next_chunk = 0

    def refresh(self) -> None:
        """The status is kept up to date as the child reports."""

    async def finish(self) -> bool:
        """After its task was cancelled: nothing left (the task ended its child)."""
        return True

    async def run(self) -> None:
        """Push from the next IDR on, starting a new child after each failure, until
        cancelled (module doc)."""
        wait_s = 1.0
        while True:
            connects = self.status.connects
            reason = await self._push_once()
            if self.status.connects > connects:
                wait_s = 1.0  # it was live: the waits start again
            status = self.status
            status.state, status.last_error = "retrying", reason[:300]
            status.retries += 1
            logger.warning(
                "output %s to %s failed (%s); trying again in %.0f s",
                status.output_id,
                status.target,
                reason,
                wait_s,
            )
            await asyncio.sleep(wait_s)
            wait_s = min(2 * wait_s, self._retry_max_s)

    async def _push_once(self) -> str:
        """One child, until it fails: why it ended."""
        self.status.state = "connecting"
        command = [sys.executable, "-m", "streaming.broadcast.rtmp_push", self._url]
        command += ["--fps", str(self._fps), "--timeout-s", str(self._timeout_s)]
        child = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        reports = _Reports(self.status, self._timeout_s)
        reading = asyncio.create_task(reports.read(child))
        self._video.resync()  # a new stream starts at an IDR
        try:
            return await self._feed_child(child, reports, reading)
        finally:
            await _end(child)
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading

    async def _feed_child(
        self, child: asyncio.subprocess.Process, reports: _Reports, reading: asyncio.Task[None]
    ) -> str:
        assert child.stdin is not None
        pipe = child.stdin
        period = 1.0 / self._fps
        index = self._clock.slots_due(period)
        self._next_chunk = math.floor(index * period / AUDIO_CHUNK_S + 1e-9)
        while True:
            slot = await wait_for_slot(self._clock, index, period)
            index = slot.index
            if reading.done():
                return reports.error or f"the pushing process ended ({child.returncode})"
            stalled = reports.stalled(time.monotonic())
            if stalled is not None:
                return stalled
            data = self._messages(index, await self._video.packet_for(index, self._encoder))
            if pipe.transport.get_write_buffer_size() > PIPE_LIMIT:
                self.status.frames_dropped += 1  # slower than real time: drop, resync
                self._video.resync()
            else:
                pipe.write(data)
            index += 1

    def _messages(self, index: int, packet: av.Packet[Any]) -> bytes:
        """Slot ``index``'s frame (if the chain allows one) and the audio chunks up to
        the slot's end, as messages for the child."""
        out = bytearray()
        payloads = packet.opaque if isinstance(packet.opaque, list) else []
        if payloads:
            kind = KEYFRAME if carries_idr(payloads) else VIDEO
            out += message(kind, index, access_unit(payloads))
        last_chunk = math.floor((index + 1) / self._fps / AUDIO_CHUNK_S + 1e-9)
        for chunk in range(max(self._next_chunk, last_chunk - 10), last_chunk):
            out += message(AUDIO, chunk, bytes(self._audio(chunk)))
        self._next_chunk = last_chunk
        return bytes(out)


class _Reports:
    """What the child says (module doc), into the output's status."""

    def __init__(self, status: OutputStatus, timeout_s: float) -> None:
        self._status = status
        self._timeout_s = timeout_s
        self._frames_before = status.frames_sent
        self._bytes_before = status.bytes_sent
        self._connecting_at: float | None = None
        self._heard_at = time.monotonic()
        self.error: str | None = None

    def stalled(self, now: float) -> str | None:
        """Why the child is to be ended for making no progress, if it is."""
        if self._status.state == "live" and now - self._heard_at > self._timeout_s:
            return f"no progress for {self._timeout_s:g} s"
        connecting = self._connecting_at
        if (
            self._status.state != "live"
            and connecting is not None
            and now - connecting > self._timeout_s
        ):
            return f"not live {self._timeout_s:g} s after connecting"
        return None

    async def read(self, child: asyncio.subprocess.Process) -> None:
        assert child.stdout is not None
        status = self._status
        async for raw in child.stdout:
            line = raw.decode(errors="replace").strip()
            self._heard_at = time.monotonic()
            if line == "connecting":
                self._connecting_at = self._heard_at
            elif line == "live":
                status.state = "live"
                status.connects += 1
                logger.info("output %s is live: %s", status.output_id, status.target)
            elif line.startswith("sent "):
                frames, sent = (int(value) for value in line.split()[1:3])
                status.frames_sent = self._frames_before + frames
                status.bytes_sent = self._bytes_before + sent
            elif line.startswith("error "):
                self.error = line.removeprefix("error ")


async def _end(child: asyncio.subprocess.Process) -> None:
    """Close the child's input (it closes its stream and exits); kill it if it has not
    within :data:`STOP_S`."""
    if child.stdin is not None and not child.stdin.is_closing():
        child.stdin.close()
    try:
        async with asyncio.timeout(STOP_S):
            await child.wait()
    except TimeoutError:
        child.kill()
        await child.wait()
