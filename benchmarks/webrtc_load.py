"""A load client: K WebRTC calls to a lipstream server, each speaking, per-call fps back.

    .venv/bin/python -m benchmarks.webrtc_load --url http://127.0.0.1:8080 --calls 4 \
        --seconds 10 --speech speech.wav [--avatar demo] [--microphone]

Each call offers to receive audio and video (as the demo page does), pushes ``--speech``
with ``POST /sessions/{id}/audio`` so the avatar speaks all the time (or, with
``--microphone``, sends it as the call's microphone, looped, as a caller does), receives and
decodes the H.264 video for ``--seconds`` after every call has its first frame, then
hangs up. Prints one JSON object: per call the frames received and fps over the window.
Run it as a separate process so its decoding does not share the server's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path

import av
from aiohttp import ClientSession
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer
from aiortc.mediastreams import MediaStreamError

from streaming.webrtc.compat import loopback_only_ice


class Call:
    """One receiving call; records video frame arrival times."""

    def __init__(self, http: ClientSession, avatar: str) -> None:
        self.http = http
        self.avatar = avatar
        self.pc = RTCPeerConnection()
        self.session_id = ""
        self.video_times: list[float] = []
        self.offered_at = 0.0  # when the offer was sent (monotonic)
        self._tasks: list[asyncio.Task[None]] = []
        self._player: MediaPlayer | None = None

    async def connect(self, microphone: Path | None = None) -> None:
        self.offered_at = time.monotonic()
        if microphone is None:
            self.pc.addTransceiver("audio", direction="recvonly")
        else:  # the speech plays as the caller's microphone, in real time, looped
            self._player = MediaPlayer(str(microphone), loop=True)
            assert self._player.audio is not None
            self.pc.addTrack(self._player.audio)
        self.pc.addTransceiver("video", direction="recvonly")

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            self._tasks.append(asyncio.create_task(self._consume(track)))

        await self.pc.setLocalDescription(await self.pc.createOffer())
        local = self.pc.localDescription
        async with self.http.post(
            "/offer", json={"sdp": local.sdp, "type": local.type, "avatar": self.avatar}
        ) as response:
            if response.status != 200:
                raise RuntimeError(f"offer refused: {response.status} {await response.text()}")
            answer = await response.json()
        self.session_id = answer["session_id"]
        await self.pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))

    async def speak(self, wav: bytes) -> None:
        async with self.http.post(
            f"/sessions/{self.session_id}/audio", data=wav, headers={"Content-Type": "audio/wav"}
        ) as response:
            if response.status != 202:
                raise RuntimeError(f"audio push refused: {response.status}")

    async def _consume(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if isinstance(frame, av.VideoFrame):
                    self.video_times.append(time.monotonic())

    def fps_between(self, start: float, end: float) -> float:
        return sum(1 for t in self.video_times if start <= t < end) / (end - start)

    async def hang_up(self) -> None:
        with contextlib.suppress(Exception):
            async with self.http.delete(f"/sessions/{self.session_id}"):
                pass
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def drive(
    url: str, calls: int, seconds: float, speech: Path, avatar: str, microphone: bool = False
) -> dict[str, object]:
    """Open ``calls`` calls, make them speak (pushed audio, or the caller's microphone),
    measure fps over ``seconds``; hang up."""
    wav = speech.read_bytes()  # noqa: ASYNC240 - once, before any call starts
    async with ClientSession(base_url=url) as http:
        active = [Call(http, avatar) for _ in range(calls)]
        try:
            for call in active:
                await call.connect(speech if microphone else None)
            async with asyncio.timeout(30):
                while any(not c.video_times for c in active):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            if not microphone:
                await asyncio.gather(*(c.speak(wav) for c in active))
            await asyncio.sleep(1.0)  # the speech reaches the video after the delay
            start, cpu_start = time.monotonic(), time.process_time()
            await asyncio.sleep(seconds)
            end, cpu_end = time.monotonic(), time.process_time()
            halves = [
                (c.fps_between(start, (start + end) / 2), c.fps_between((start + end) / 2, end))
                for c in active
            ]
            return {
                "calls": calls,
                "window_s": end - start,
                "client_cores": (cpu_end - cpu_start) / (end - start),
                "fps": [c.fps_between(start, end) for c in active],
                "fps_halves": halves,
                "session_ids": [c.session_id for c in active],
                # From sending the offer to the first video frame decoded, per call.
                "first_frame_s": [c.video_times[0] - c.offered_at for c in active],
            }
        finally:
            await asyncio.gather(*(c.hang_up() for c in active))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--speech", type=Path, required=True)
    parser.add_argument("--avatar", default="demo")
    parser.add_argument(
        "--microphone", action="store_true", help="send the speech as each call's microphone"
    )
    args = parser.parse_args()
    with loopback_only_ice():
        result = asyncio.run(
            drive(args.url, args.calls, args.seconds, args.speech, args.avatar, args.microphone)
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
