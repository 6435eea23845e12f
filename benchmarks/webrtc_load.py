"""A load client: K WebRTC calls to a lipstream server, each speaking, per-call fps back.

The calls are made with ``lipstream_client``, the published Python client.

    .venv/bin/python -m benchmarks.webrtc_load --url http://127.0.0.1:8080 --calls 4 \
        --seconds 10 --speech speech.wav [--avatar demo ...] [--microphone] \
        [--pattern SPEAK_S LISTEN_S --seed N] [--timeline]

Each call offers to receive audio and video (as the demo page does), pushes ``--speech``
with ``POST /sessions/{id}/audio`` so the avatar speaks all the time (or, with
``--microphone``, sends it as the call's microphone, looped, as a caller does), receives and
decodes the H.264 video for ``--seconds`` after every call has its first frame, then
hangs up. Prints one JSON object: per call the frames received and fps over the window.
Run it as a separate process so its decoding does not share the server's event loop.

With ``--pattern``, each call's microphone is a conversation instead (a
:class:`ConversationMicrophone`): ``--speech`` for SPEAK_S seconds, then digital silence
for LISTEN_S seconds, repeating, each call starting at a random point of the cycle
(``--seed`` fixes the points, so two runs give their calls the same phases). Several
``--avatar`` names spread the calls over them in turn. ``--timeline`` adds, per call,
every video frame's arrival time and the bytes received so far, sampled every
:data:`BYTES_EVERY_S` (``time.monotonic``, the clock every process on the machine
shares), so a caller can cut its own window out of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fractions
import json
import random
import time
import wave
from collections.abc import Sequence
from pathlib import Path

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.contrib.media import MediaPlayer
from aiortc.mediastreams import MediaStreamError

import lipstream_client as lc
from streaming.webrtc.compat import loopback_only_ice

BYTES_EVERY_S = 1.0
_RATE = 16_000  # the microphone's sample rate (aiortc's Opus encoder resamples it)
_CHUNK = _RATE // 50  # 20 ms, a browser's Opus frame


class ConversationMicrophone(MediaStreamTrack):
    """A caller who speaks ``speak_s`` seconds (the next part of ``speech``, 16 kHz int16)
    and then is silent ``listen_s`` seconds (digital silence), over and over, starting
    ``phase_s`` into that cycle. Paced in real time, 20 ms a frame."""

    kind = "audio"

    def __init__(self, speech: np.ndarray, speak_s: float, listen_s: float, phase_s: float) -> None:
        super().__init__()
        self._speech = speech
        self._cycle = speak_s + listen_s
        self._speak = speak_s
        self._phase = phase_s
        self._spoken = 0  # samples of speech sent so far (the next burst goes on from here)
        self._sent = 0  # samples sent so far
        self._start: float | None = None

    @property
    def started_at(self) -> float | None:
        """When its first frame was taken (``time.monotonic``): phase 0 s is this less
        ``phase_s``."""
        return self._start

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            await asyncio.sleep(self._start + self._sent / _RATE - time.monotonic())
        at = (self._phase + self._sent / _RATE) % self._cycle
        if at < self._speak:
            idx = (self._spoken + np.arange(_CHUNK)) % len(self._speech)
            samples = self._speech[idx]
            self._spoken += _CHUNK
        else:
            samples = np.zeros(_CHUNK, dtype=np.int16)
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
        frame.sample_rate = _RATE
        frame.pts = self._sent
        frame.time_base = fractions.Fraction(1, _RATE)
        self._sent += _CHUNK
        return frame


def read_speech(path: Path) -> np.ndarray:
    """A 16 kHz mono 16-bit WAV's samples (what ``benchmarks.live_server.write_speech`` writes)."""
    with wave.open(str(path), "rb") as source:
        if (source.getframerate(), source.getnchannels(), source.getsampwidth()) != (_RATE, 1, 2):
            raise ValueError(f"{path}: expected 16 kHz mono 16-bit PCM")
        return np.frombuffer(source.readframes(source.getnframes()), dtype="<i2").copy()


class LoadCall:
    """One receiving call through ``lipstream_client``; records video frame arrival times."""

    def __init__(self, client: lc.Client, avatar: str) -> None:
        self.client = client
        self.avatar = avatar
        self.call: lc.Call | None = None
        self.video_times: list[float] = []
        self.bytes_received: list[tuple[float, int]] = []  # (monotonic, total), sampled
        self.offered_at = 0.0  # when the offer was sent (monotonic)
        self._counter: asyncio.Task[None] | None = None
        self._player: MediaPlayer | None = None
        self._microphone: MediaStreamTrack | None = None

    @property
    def session_id(self) -> str:
        return self.call.session_id if self.call is not None else ""

    async def connect(self, microphone: Path | MediaStreamTrack | None = None) -> None:
        """Call; ``microphone`` is a file played looped as the caller's microphone, or a
        track of its own."""
        self.offered_at = time.monotonic()
        track = None
        if isinstance(microphone, Path):  # the speech plays as the caller's microphone, looped
            self._player = MediaPlayer(str(microphone), loop=True)
            track = self._player.audio
        elif microphone is not None:
            track = self._microphone = microphone
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

    @property
    def microphone_started(self) -> float | None:
        """When a :class:`ConversationMicrophone` of this call started (None otherwise)."""
        mic = self._microphone
        return mic.started_at if isinstance(mic, ConversationMicrophone) else None

    async def sample_bytes(self) -> None:
        """Note the bytes this call has received so far (every packet of its transport:
        video, audio and RTCP, as aiortc counts them)."""
        if self.call is None:
            return
        report = await self.call.pc.getStats()
        total = sum(s.bytesReceived for s in report.values() if s.type == "transport")
        self.bytes_received.append((time.monotonic(), total))

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
        if self._microphone is not None:
            self._microphone.stop()


async def drive(
    url: str,
    calls: int,
    seconds: float,
    speech: Path,
    avatars: Sequence[str] = ("demo",),
    microphone: bool = False,
    *,
    pattern: tuple[float, float] | None = None,
    seed: int = 0,
    timeline: bool = False,
) -> dict[str, object]:
    """Open ``calls`` calls (on ``avatars`` in turn), make them speak (pushed audio, the
    caller's microphone, or a conversation ``pattern``: speak, listen seconds), measure
    fps over ``seconds``; hang up."""
    wav = speech.read_bytes()  # noqa: ASYNC240 - once, before any call starts
    pcm = read_speech(speech) if pattern is not None else None
    rng = random.Random(seed)
    phases = [rng.uniform(0, sum(pattern)) if pattern else 0.0 for _ in range(calls)]
    async with lc.Client(url) as client:
        active = [LoadCall(client, avatars[n % len(avatars)]) for n in range(calls)]
        sampling: asyncio.Task[None] | None = None
        try:
            for call, phase in zip(active, phases, strict=True):
                if pattern is not None and pcm is not None:
                    await call.connect(ConversationMicrophone(pcm, *pattern, phase))
                else:
                    await call.connect(speech if microphone else None)
            async with asyncio.timeout(30):
                while any(not c.video_times for c in active):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            if timeline:
                sampling = asyncio.create_task(_sample_bytes(active), name="load-bytes")
            if not microphone and pattern is None:
                await asyncio.gather(*(c.speak(wav) for c in active))
            await asyncio.sleep(1.0)  # the speech reaches the video after the delay
            await asyncio.gather(*(c.sample_bytes() for c in active))
            start, cpu_start = time.monotonic(), time.process_time()
            await asyncio.sleep(seconds)
            end, cpu_end = time.monotonic(), time.process_time()
            await asyncio.gather(*(c.sample_bytes() for c in active))
            halves = [
                (c.fps_between(start, (start + end) / 2), c.fps_between((start + end) / 2, end))
                for c in active
            ]
            result: dict[str, object] = {
                "calls": calls,
                "window_s": end - start,
                "client_cores": (cpu_end - cpu_start) / (end - start),
                "fps": [c.fps_between(start, end) for c in active],
                "fps_halves": halves,
                "session_ids": [c.session_id for c in active],
                # From sending the offer to the first video frame decoded, per call.
                "first_frame_s": [c.video_times[0] - c.offered_at for c in active],
                "bytes_per_s": [_rate(c.bytes_received, start, end) for c in active],
                "avatars": [c.avatar for c in active],
                "phases_s": phases,
            }
            if timeline:
                result["video_times"] = [c.video_times for c in active]
                result["bytes_received"] = [c.bytes_received for c in active]
                result["microphone_started"] = [c.microphone_started for c in active]
            return result
        finally:
            if sampling is not None:
                sampling.cancel()
                await asyncio.gather(sampling, return_exceptions=True)
            await asyncio.gather(*(c.hang_up() for c in active))


async def _sample_bytes(active: list[LoadCall]) -> None:
    while True:
        await asyncio.gather(*(c.sample_bytes() for c in active))
        await asyncio.sleep(BYTES_EVERY_S)


def _rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    """Bytes per second between the last sample at or before ``start`` and the first at
    or after ``end`` (the samples taken at the window's ends)."""
    before = [s for s in samples if s[0] <= start + 0.5]
    after = [s for s in samples if s[0] >= end - 0.5]
    if not before or not after or after[0][0] <= before[-1][0]:
        return 0.0
    return (after[0][1] - before[-1][1]) / (after[0][0] - before[-1][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--speech", type=Path, required=True)
    parser.add_argument("--avatar", nargs="+", default=["demo"], help="calls go to each in turn")
    parser.add_argument(
        "--microphone", action="store_true", help="send the speech as each call's microphone"
    )
    parser.add_argument(
        "--pattern",
        nargs=2,
        type=float,
        metavar=("SPEAK_S", "LISTEN_S"),
        help="each call's microphone speaks SPEAK_S then is silent LISTEN_S, from a random phase",
    )
    parser.add_argument("--seed", type=int, default=0, help="the phases' random seed")
    parser.add_argument(
        "--timeline", action="store_true", help="add frame arrival times and bytes samples"
    )
    args = parser.parse_args()
    with loopback_only_ice():
        result = asyncio.run(
            drive(
                args.url,
                args.calls,
                args.seconds,
                args.speech,
                args.avatar,
                args.microphone,
                pattern=tuple(args.pattern) if args.pattern else None,
                seed=args.seed,
                timeline=args.timeline,
            )
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
