"""A load client: K WebRTC calls to a lipstream server, each speaking, per-call fps back.

The calls are made with ``lipstream_client``, the published Python client.

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

from aiortc.contrib.media import MediaPlayer

import lipstream_client as lc
from streaming.webrtc.compat import loopback_only_ice


class LoadCall:
    """One receiving call through ``lipstream_client``; records video frame arrival times."""

    def __init__(self, client: lc.Client, avatar: str) -> None:
        self.client = client
        self.avatar = avatar
        self.call: lc.Call | None = None
        self.video_times: list[float] = []
        self.offered_at = 0.0  # when the offer was sent (monotonic)
        self._counter: asyncio.Task[None] | None = None
        self._player: MediaPlayer | None = None

    @property
    def session_id(self) -> str:
        return self.call.session_id if self.call is not None else ""

    async def connect(self, microphone: Path | None = None) -> None:
        self.offered_at = time.monotonic()
        track = None
        if microphone is not None:  # the speech plays as the caller's microphone, looped
            self._player = MediaPlayer(str(microphone), loop=True)
            track = self._player.audio
        # The benchmark reads no events; without the data channel the offer is the one a
        # plain app sends (audio and video only).
        self.call = await lc.open_call(
            self.client, self.avatar, microphone=track, data_channel=False
        )
        self._counter = asyncio.create_task(self._count(self.call))

    async def _count(self, call: lc.Call) -> None:
        async for frame in call.video_frames():  # each decoded frame, as it arrived
            self.video_times.append(frame.received_at)

    async def speak(self, wav: bytes) -> None:
        assert self.call is not None
        await self.call.push_audio(wav, "audio/wav")

    def fps_between(self, start: float, end: float) -> float:
        return sum(1 for t in self.video_times if start <= t < end) / (end - start)

    async def hang_up(self) -> None:
        if self.call is not None:
            with contextlib.suppress(lc.LipstreamError):
                await self.call.hang_up()
        if self._counter is not None:
            self._counter.cancel()
            await asyncio.gather(self._counter, return_exceptions=True)
        if self._player is not None and self._player.audio is not None:
            self._player.audio.stop()


async def drive(
    url: str, calls: int, seconds: float, speech: Path, avatar: str, microphone: bool = False
) -> dict[str, object]:
    """Open ``calls`` calls, make them speak (pushed audio, or the caller's microphone),
    measure fps over ``seconds``; hang up."""
    wav = speech.read_bytes()  # noqa: ASYNC240 - once, before any call starts
    async with lc.Client(url) as client:
        active = [LoadCall(client, avatar) for _ in range(calls)]
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
