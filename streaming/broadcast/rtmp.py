"""A session pushed to an RTMP ingest (YouTube, Twitch, nginx-rtmp, a CDN) as H.264 + AAC
in FLV (``docs/architecture.md`` §21).

The video is the session's own encode, never encoded again: on each video slot of the
session's clock the output takes the frame the session sent from its feed, through the
same chain rule as a viewer (:class:`~streaming.broadcast.feed.ViewerVideo`: from an
IDR on), with the session's audio packets of that frame's time. That hand-off is all
the event loop does; a thread of the output's own (:class:`_Muxer`) turns payloads back
into access units (:mod:`~streaming.broadcast.h264_units`), decodes the Opus packets and
encodes AAC, and writes FLV to the ingest through FFmpeg's RTMP client, whose network
writes may block. Between the two a queue of :data:`QUEUE_FRAMES` frames: when the
ingest is slower than real time the newest frames are dropped, never queued, and the
output starts again from the next IDR.

An ingest that refuses, times out or drops the stream is tried again after 1 s, then 2,
4… up to ``outputs.retry_max_s``, from the next IDR; :class:`OutputStatus` says where it
is (``connecting``, ``live``, ``retrying``, ``ended``) with its counters and last error.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import io
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import av
import numpy as np

from streaming.audio_rates import AUDIO_CHUNK_S, CHUNK_SAMPLES, OUT_RATE
from streaming.broadcast.feed import VideoFeed, ViewerVideo
from streaming.broadcast.h264_units import access_unit
from streaming.idle_loops import carries_idr
from streaming.webrtc.pacing import SessionClock, wait_for_slot
from streaming.webrtc.tracks import PacketSource
from streaming.webrtc.video_encoder import LipstreamH264Encoder

logger = logging.getLogger(__name__)

#: Frames waiting for the muxer thread at most (one second at 25 fps).
QUEUE_FRAMES = 25
#: The AAC stream: bitrate, and samples per AAC frame (FFmpeg's encoder takes 1024).
AAC_BITRATE = 96_000
AAC_FRAME = 1024
_MS = fractions.Fraction(1, 1000)


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


@dataclass(frozen=True, slots=True)
class _Frame:
    """One video slot for the muxer: its frame's payloads (None: nothing sent for it)
    and the Opus packets of the audio chunks up to the slot's end."""

    index: int
    payloads: list[bytes] | None
    keyframe: bool
    audio: list[tuple[int, bytes]]


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
        self._clock = clock
        self._fps = fps
        self._video = ViewerVideo(feed)
        self._audio = audio
        self._encoder = encoder  # never opened: it only carries keyframe requests
        self._queue: queue.Queue[_Frame | None] = queue.Queue(maxsize=QUEUE_FRAMES)
        self._muxer = _Muxer(url, status, self._queue, fps, retry_max_s, timeout_s)
        self._thread = threading.Thread(
            target=self._muxer.run, name=f"lipstream-rtmp-{status.output_id[:6]}", daemon=True
        )

    async def run(self) -> None:
        """Hand each video slot's frame and audio to the muxer until cancelled."""
        self._thread.start()
        period = 1.0 / self._fps
        index = self._clock.slots_due(period)
        next_chunk = math.floor(index * period / AUDIO_CHUNK_S + 1e-9)
        try:
            while True:
                slot = await wait_for_slot(self._clock, index, period)
                index = slot.index
                packet = await self._video.packet_for(index, self._encoder)
                payloads = packet.opaque if isinstance(packet.opaque, list) else []
                last_chunk = math.floor((index + 1) * period / AUDIO_CHUNK_S + 1e-9)
                first_chunk = max(next_chunk, last_chunk - 10)  # after a skip: recent only
                audio = [(m, bytes(self._audio(m))) for m in range(first_chunk, last_chunk)]
                next_chunk = last_chunk
                frame = _Frame(index, payloads or None, bool(payloads) and _keyframe(packet), audio)
                try:
                    self._queue.put_nowait(frame)
                except queue.Full:  # the ingest is slower than real time: drop, resync
                    self.status.frames_dropped += 1
                    self._video.resync()
                index += 1
        finally:
            self.stop()

    def refresh(self) -> None:
        """The status is the muxer thread's, always up to date."""

    async def finish(self, timeout_s: float = 5.0) -> bool:
        """After its task was cancelled: stop the muxer thread and wait up to
        ``timeout_s`` for it to close the stream; whether it did."""
        self.stop()
        return await asyncio.to_thread(self.join, timeout_s)

    def stop(self) -> None:
        """Ask the muxer thread to finish (it closes the stream); returns at once."""
        self._muxer.stop.set()
        with contextlib.suppress(queue.Full):  # else it sees ``stop`` within its next wait
            self._queue.put_nowait(None)

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the muxer thread (blocking: call it in a thread);
        whether it ended."""
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        return not self._thread.is_alive()


def _keyframe(packet: av.Packet[Any]) -> bool:
    payloads = packet.opaque
    return isinstance(payloads, list) and carries_idr(payloads)


class _Muxer:
    """The output's thread: FLV to the ingest, connecting again after a failure."""

    def __init__(
        self,
        url: str,
        status: OutputStatus,
        frames: queue.Queue[_Frame | None],
        fps: int,
        retry_max_s: float,
        timeout_s: float,
    ) -> None:
        self._url = url
        self._status = status
        self._frames = frames
        self._fps = fps
        self._retry_max_s = retry_max_s
        self._timeout_s = timeout_s
        self.stop = threading.Event()

    def run(self) -> None:
        wait_s = 1.0
        while not self.stop.is_set():
            connects = self._status.connects
            try:
                self._stream()
                break  # stopped
            except (av.FFmpegError, OSError, ValueError) as exc:
                if self._status.connects > connects:
                    wait_s = 1.0  # it was live: a new failure starts the waits again
                self._failed(exc, wait_s)
                if self._wait(wait_s):
                    break
                wait_s = min(2 * wait_s, self._retry_max_s)
        self._status.state = "ended"

    def _failed(self, exc: Exception, wait_s: float) -> None:
        status = self._status
        status.last_error = f"{type(exc).__name__}: {exc}"[:300]
        status.state = "retrying"
        status.retries += 1
        logger.warning(
            "output %s to %s failed (%s); trying again in %.0f s",
            status.output_id,
            status.target,
            status.last_error,
            wait_s,
        )

    def _wait(self, seconds: float) -> bool:
        """Wait ``seconds`` before trying again, taking (and dropping) what the session
        hands over meanwhile, so nothing queues up; whether the output was stopped."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.stop.is_set():
                return True
            with contextlib.suppress(queue.Empty):
                self._frames.get(timeout=min(left, 0.2))
        return self.stop.is_set()

    def _next(self) -> _Frame | None:
        """The next frame for the stream; None once stopped."""
        while not self.stop.is_set():
            try:
                frame = self._frames.get(timeout=1.0)
            except queue.Empty:
                continue
            return frame
        return None

    def _stream(self) -> None:
        """One connection: from the next IDR until stopped (returns) or failed (raises)."""
        status = self._status
        status.state = "connecting"
        first = self._next()
        while first is not None and not first.keyframe:
            first = self._next()
        if first is None or first.payloads is None:
            return
        timeout = (self._timeout_s, self._timeout_s)
        container = av.open(self._url, "w", format="flv", timeout=timeout)
        try:
            video = _video_stream(container, access_unit(first.payloads))
            audio = container.add_stream("aac", rate=OUT_RATE, layout="mono")
            audio.bit_rate = AAC_BITRATE
            sound = _Sound(first.index * OUT_RATE // self._fps)
            frame: _Frame | None = first
            while frame is not None:
                if frame.payloads is not None:
                    data = access_unit(frame.payloads)
                    packet = av.Packet(data)
                    packet.stream = video
                    packet.time_base = _MS
                    packet.pts = packet.dts = (frame.index - first.index) * 1000 // self._fps
                    packet.is_keyframe = frame.keyframe
                    container.mux(packet)
                    status.frames_sent += 1
                    status.bytes_sent += len(data)
                    if status.state != "live":
                        status.state = "live"
                        status.connects += 1
                        logger.info("output %s is live: %s", status.output_id, status.target)
                for encoded in sound.encode(audio, frame.audio):
                    container.mux(encoded)
                    status.bytes_sent += encoded.size
                frame = self._next()
        finally:
            with contextlib.suppress(av.FFmpegError, OSError):
                container.close()


def _video_stream(container: Any, keyframe: bytes) -> Any:
    """The FLV's video stream, its parameters (SPS, PPS, size) read from the first IDR."""
    with av.open(io.BytesIO(keyframe), format="h264") as parsed:
        stream = container.add_stream_from_template(parsed.streams.video[0])
    stream.time_base = _MS
    return stream


class _Sound:
    """The session's Opus packets → PCM → AAC frames of 1024 samples, stamped in
    samples from the stream's first frame (``origin``, in 48 kHz samples)."""

    def __init__(self, origin: int) -> None:
        self._origin = origin
        self._decoder = av.CodecContext.create("libopus", "r")
        self._decoder.sample_rate = OUT_RATE
        self._decoder.layout = "mono"
        self._pending = np.zeros(0, dtype=np.float32)
        self._pts: int | None = None

    def encode(self, stream: Any, chunks: list[tuple[int, bytes]]) -> list[av.Packet[Any]]:
        packets: list[av.Packet[Any]] = []
        for index, payload in chunks:
            start = index * CHUNK_SAMPLES - self._origin
            if start < 0:
                continue  # before the first video frame
            if self._pts is None:
                self._pts = start
            pcm = np.zeros(CHUNK_SAMPLES, dtype=np.float32)
            for decoded in self._decoder.decode(av.Packet(payload)):
                samples = decoded.to_ndarray().astype(np.float32).reshape(-1)
                if decoded.format.name.startswith("s16"):
                    samples /= 32768.0
                pcm[: min(len(samples), CHUNK_SAMPLES)] = samples[:CHUNK_SAMPLES]
            self._pending = np.concatenate([self._pending, pcm])
            while len(self._pending) >= AAC_FRAME:
                block, self._pending = self._pending[:AAC_FRAME], self._pending[AAC_FRAME:]
                frame = av.AudioFrame.from_ndarray(block[None, :], format="fltp", layout="mono")
                frame.sample_rate = OUT_RATE
                frame.pts = self._pts
                self._pts += AAC_FRAME
                packets.extend(stream.encode(frame))
        return packets
