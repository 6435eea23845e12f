"""A WHEP load client: N viewers of one session, what each received as one JSON line.

    .venv/bin/python -m benchmarks.whep_load URL SESSION_ID --viewers 20 --seconds 20 \\
        [--stall K] [--decode M] [--no-remb]

Each viewer is a bare aiortc peer connection posting its offer (receive-only H.264 video
and audio) to ``POST /sessions/{id}/whep`` as ``application/sdp``, as WHEP players do;
it ``DELETE``s its ``Location`` at the end. Once every viewer has a frame (and
:data:`SETTLE_S` more) the window of ``--seconds`` starts: the client prints ``{"window":
"start"}`` (for a server measuring in the caller's process) and reads ``GET
/sessions/{id}`` at its start, middle and end. At the middle the last ``--stall`` viewers
stop reading their tracks (aiortc goes on receiving, answering RTCP and decoding into the
track's queue, which has no bound).

Frames count in media time (:class:`Timeline`), so a window holds what the server sent
in it even when this process fell behind; after it, the client reads on until caught up
(:data:`DRAIN_S` at most). The first ``--decode`` viewers (default all) decode and digest
each picture's luma, the others digest the frames aiortc assembled, undecoded, and count
their audio from the Opus packets' own durations (N 720p decoders would take the cores
from the server): their frames go from aiortc's jitter buffer straight to the track, with
no decoder thread and no hop between threads per frame. Every viewer's socket gets a
receive buffer of :data:`RECEIVE_BUFFER` bytes, so that this process falling behind for a
few seconds delays its packets instead of losing them. ``--no-remb``: no REMB is sent (aiortc's
delay-based estimate, in one process receiving for many connections, reads its own
scheduling delays as congestion). The last line is the result: per viewer the frames and
audio samples in each half, its frame rate, and the digests of the frames of the
window's last :data:`DIGESTS_S` (the same frames for every viewer).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import socket
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import av
import numpy as np
from aiohttp import ClientError, ClientSession
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription, rtcrtpreceiver
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError
from aiortc.rate import RemoteBitrateEstimator

from streaming.webrtc.compat import loopback_only_ice

SETTLE_S = 1.0  # from every viewer's first frame to the window
DRAIN_S = 30.0
DIGESTS_S = 2.0
KEPT_DIGESTS = 250  # 10 s of frames: the window's last, even from a client that far behind
LAST_S = 10.0  # the window's end, counted on its own too
VIDEO_RATE = 90_000
AUDIO_RATE = 48_000
STATE_KEYS = ("state", "viewers", "frames_sent", "frames_encoded", "frames_shared")

RECEIVE_BUFFER = 4 << 20  # bytes; the kernel caps it at net.core.rmem_max
#: Opus frame durations in 48 kHz samples by the TOC byte's configuration (RFC 6716 §3.1).
OPUS_FRAME_SAMPLES = (480, 960, 1920, 2880) * 3 + (480, 960) * 2 + (120, 240, 480, 960) * 4


def _digest(data: bytes) -> str:
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()[:16]


def luma_digest(frame: av.VideoFrame) -> str:
    """A decoded picture's Y plane (without the row padding) as a short digest."""
    plane = frame.planes[0]
    rows = np.frombuffer(memoryview(plane), np.uint8)[: plane.line_size * frame.height]
    luma = rows.reshape(frame.height, plane.line_size)[:, : frame.width]
    return _digest(np.ascontiguousarray(luma).tobytes())


def opus_samples(packet: bytes) -> int:
    """The 48 kHz samples an Opus packet holds, from its TOC byte (RFC 6716 §3.1)."""
    if not packet:
        return 0
    code = packet[0] & 3
    frames = 1 if code == 0 else 2 if code < 3 else (packet[1] & 0x3F if len(packet) > 1 else 0)
    return OPUS_FRAME_SAMPLES[packet[0] >> 3] * frames


class Assembled:
    """Stands in for a receiver's decoder queue: each frame aiortc's jitter buffer
    assembles goes straight into the track's queue, undecoded, on the loop's thread."""

    def __init__(self, track_queue: asyncio.Queue[Any]) -> None:
        self.track_queue = track_queue

    def put(self, job: tuple[Any, JitterFrame] | None) -> None:
        self.track_queue.put_nowait(None if job is None else job[1])  # None: the track ends


@contextlib.contextmanager
def receiving(*, remb: bool) -> Iterator[None]:
    """While open, a receiver whose decoder queue is :class:`Assembled` starts no decoder
    thread (others decode as usual), and without ``remb`` no REMB is sent."""
    original, estimate = rtcrtpreceiver.decoder_worker, RemoteBitrateEstimator.add

    def worker(loop: Any, input_q: Any, output_q: Any, decode_error: Any) -> None:
        if not isinstance(input_q, Assembled):
            original(loop, input_q, output_q, decode_error)

    rtcrtpreceiver.decoder_worker = worker
    if not remb:
        RemoteBitrateEstimator.add = lambda *_, **__: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        rtcrtpreceiver.decoder_worker = original
        RemoteBitrateEstimator.add = estimate  # type: ignore[method-assign]


def widen_receive_buffers(pc: RTCPeerConnection) -> None:
    """Give each of ``pc``'s ICE sockets a :data:`RECEIVE_BUFFER`-byte receive buffer."""
    for transceiver in pc.getTransceivers():
        ice = transceiver.receiver.transport.transport
        for protocol in ice._connection._protocols:
            sock = protocol.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)


class Timeline:
    """A track's frames in media time: each counts when it was due to arrive (its media
    time plus the track's least transit), not when this process got to it."""

    def __init__(self) -> None:
        self.media: list[float] = []  # seconds from the track's first frame
        self.sizes: list[int] = []  # samples (audio) or 1 (video)
        self.offset = math.inf  # the least (arrival - media time)

    def add(self, media_s: float, size: int = 1) -> None:
        self.offset = min(self.offset, time.monotonic() - media_s)
        self.media.append(media_s)
        self.sizes.append(size)

    def latest(self) -> float:
        return max(self.media, default=-math.inf) + self.offset

    def count(self, start: float, end: float) -> int:
        due = (m + self.offset for m in self.media)
        return sum(n for t, n in zip(due, self.sizes, strict=True) if start <= t < end)


class WhepViewer:
    """One viewer: its video and audio timelines and its recent frames' digests."""

    def __init__(self, http: ClientSession, session_id: str, *, decode: bool) -> None:
        self.http = http
        self.session_id = session_id
        self.decode = decode
        self.pc = RTCPeerConnection()
        self.video, self.audio = Timeline(), Timeline()
        self.digests: deque[tuple[float, str]] = deque(maxlen=KEPT_DIGESTS)
        self.stalled = False
        self.lag_s = 0.0  # how far behind the media this process was at the window's end
        self.location = ""
        self._readers: list[asyncio.Task[None]] = []

    async def watch(self) -> None:
        self.pc.addTransceiver("video", direction="recvonly")
        self.pc.addTransceiver("audio", direction="recvonly")
        self.pc.on("track", self._on_track)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with self.http.post(
            f"/sessions/{self.session_id}/whep",
            data=self.pc.localDescription.sdp,
            headers={"Content-Type": "application/sdp"},
        ) as response:
            answer = await response.text()
            if response.status != 201:
                raise RuntimeError(f"WHEP offer answered {response.status}: {answer[:300]}")
            self.location = response.headers["Location"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        widen_receive_buffers(self.pc)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if not self.decode:  # before the receiver starts (at the connection), see receiving()
            assert isinstance(track, rtcrtpreceiver.RemoteStreamTrack)
            (receiver,) = (
                t.receiver for t in self.pc.getTransceivers() if t.receiver.track is track
            )
            receiver._RTCRtpReceiver__decoder_queue = Assembled(track._queue)  # type: ignore[attr-defined]
        self._readers.append(asyncio.create_task(self._read(track)))

    async def _read(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if isinstance(frame, av.AudioFrame):
                self.audio.add(float(frame.time or 0.0), frame.samples)
                continue
            if isinstance(frame, av.VideoFrame):
                media_s, digest = float(frame.time or 0.0), luma_digest(frame)
            elif track.kind == "audio":
                assert isinstance(frame, JitterFrame)  # assembled, not decoded
                self.audio.add(frame.timestamp / AUDIO_RATE, opus_samples(frame.data))
                continue
            else:
                assert isinstance(frame, JitterFrame)
                media_s, digest = frame.timestamp / VIDEO_RATE, _digest(frame.data)
            self.video.add(media_s)
            self.digests.append((media_s, digest))

    def stall(self) -> None:
        """Stop reading the tracks (what arrives from now on waits in their queues)."""
        self.stalled = True
        for reader in self._readers:
            reader.cancel()

    def caught_up(self, end: float) -> bool:
        return self.stalled or min(self.video.latest(), self.audio.latest()) >= end

    def report(self, t0: float, tm: float, t1: float) -> dict[str, Any]:
        video, audio = self.video, self.audio
        return {
            "stalled": self.stalled,
            "decoding": self.decode,
            "halves": [video.count(t0, tm), video.count(tm, t1)],
            "fps": video.count(t0, t1) / (t1 - t0),
            "last_10s": video.count(max(t0, t1 - LAST_S), t1),
            "audio_samples": [audio.count(t0, tm), audio.count(tm, t1)],
            "digests": [d for m, d in self.digests if t1 - DIGESTS_S <= m + video.offset < t1],
            "lag_s": self.lag_s,
        }

    async def leave(self) -> None:
        if self.location:
            with contextlib.suppress(ClientError, TimeoutError):
                async with self.http.delete(self.location):
                    pass
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        await self.pc.close()


async def _state(http: ClientSession, session_id: str) -> tuple[float, dict[str, Any]]:
    """(when it was asked, ``GET /sessions/{id}``'s counters)."""
    asked = time.monotonic()
    async with http.get(f"/sessions/{session_id}") as response:
        response.raise_for_status()
        state = await response.json()
    return asked, {k: state[k] for k in STATE_KEYS}


async def drive(
    url: str, session_id: str, viewers: int, seconds: float, stall: int = 0, decode: int = -1
) -> dict[str, Any]:
    """Watch ``session_id`` with ``viewers`` viewers (the first ``decode`` decoding, all
    if negative) for ``seconds``, the last ``stall`` of them stopping half-way."""
    decode = viewers if decode < 0 else decode
    async with ClientSession(base_url=url) as http:
        watching = [WhepViewer(http, session_id, decode=n < decode) for n in range(viewers)]
        try:
            for viewer in watching:
                await viewer.watch()
            async with asyncio.timeout(60):
                while not all(v.video.media for v in watching):  # noqa: ASYNC110 - polls
                    await asyncio.sleep(0.05)
            await asyncio.sleep(SETTLE_S)
            print(json.dumps({"window": "start"}), flush=True)
            cpu0 = time.process_time()
            states = [await _state(http, session_id)]
            await asyncio.sleep(seconds / 2)
            states.append(await _state(http, session_id))
            for viewer in watching[viewers - stall :]:
                viewer.stall()
            await asyncio.sleep(seconds / 2)
            states.append(await _state(http, session_id))
            (t0, _), (tm, _), (t1, last) = states
            cpu = time.process_time() - cpu0
            for viewer in watching:
                viewer.lag_s = max(0.0, t1 - min(viewer.video.latest(), viewer.audio.latest()))
            with contextlib.suppress(TimeoutError):  # read what is still queued here
                async with asyncio.timeout(DRAIN_S):
                    while not all(v.caught_up(t1) for v in watching):  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
        finally:
            await asyncio.gather(*(v.leave() for v in watching))
    return {
        "viewers": viewers,
        "stalled": stall,
        "decoding": decode,
        "halves_s": [tm - t0, t1 - tm],
        "frames_sent": [s["frames_sent"] for _, s in states],
        "session": last,
        "client_cores": cpu / (t1 - t0),
        "per_viewer": [v.report(t0, tm, t1) for v in watching],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url", help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("session_id")
    parser.add_argument("--viewers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--stall", type=int, default=0, help="the last K stop reading half-way")
    parser.add_argument("--decode", type=int, default=-1, help="the first M decode (default all)")
    parser.add_argument("--no-remb", action="store_true", help="the viewers send no REMB")
    args = parser.parse_args()
    if not 0 <= args.stall <= args.viewers:
        parser.error("--stall is between 0 and --viewers")
    with loopback_only_ice(), receiving(remb=not args.no_remb):
        result = asyncio.run(
            drive(args.url, args.session_id, args.viewers, args.seconds, args.stall, args.decode)
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
