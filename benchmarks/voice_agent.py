"""A voice agent's view: first audio chunk → first lip-synced frame, and barge-in → idle.

One call to the demo avatar from ``lipstream_client`` (the published client, in this
process, over real loopback HTTP, WebSocket and WebRTC). Utterances of espeak-ng speech at
24 kHz (a typical TTS rate), their leading silence trimmed so the first chunk is voiced,
are sent alternately

- **streamed**: 40 ms messages over the audio stream WebSocket, as a streaming TTS sends
  them (the client paces them; the first goes at once), and
- **pushed**: the same audio as one WAV body (``POST /sessions/{id}/audio``),

and each is timed from the moment the client sends its first byte to the moment the
server hands the first lip-synced video frame to aiortc (the session's own hooks, read
in this process: nothing is inferred from decoded pictures). The target is the model's
lookahead plus at most 60 ms at p95: the rest of the configured delay (a 20 ms tick and
``session.pipeline_margin_ms``) is all the server adds.

Barge-in: while a long streamed utterance is being spoken, ``{"type": "interrupt"}`` goes
over the same WebSocket; timed to the first video frame handed to aiortc without
lip-sync after which no lip-synced frame follows (target p95 <= 200 ms).
"""

from __future__ import annotations

import asyncio
import io
import tempfile
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks.common import Result, Target, percentiles, print_table, print_targets
from benchmarks.live_server import live_server
from config.settings import TtsSettings
from lipstream_client import Event, connect
from streaming.audio_in.resample import resample_mono
from streaming.audio_in.tts import build_tts_engine
from streaming.audio_rates import OUT_RATE
from streaming.live.session import Session
from web.app_keys import SESSIONS

RATE = 24_000
CHUNK = RATE // 25  # 40 ms
PHRASES = (
    "hello there, how can I help you today",
    "sure, I can look that up for you",
    "the weather tomorrow will be sunny and warm",
    "your order has been shipped this morning",
    "is there anything else I can do for you",
)
LONG = "this answer goes on for quite a while so that the user wants to interrupt it now"


@dataclass
class FrameLog:
    """Every video frame the session sent: (index, monotonic time, lip-synced)."""

    frames: list[tuple[int, float, bool]] = field(default_factory=list)
    _lip_synced: bool = False

    def attach(self, session: Session) -> None:
        session.pipeline.sent_listeners.append(self._sent)

    def lip_synced_sent(self, _sending: object) -> None:  # SessionManager.on_frame_sent
        self._lip_synced = True

    def _sent(self, index: int) -> None:
        self.frames.append((index, time.monotonic(), self._lip_synced))
        self._lip_synced = False

    def first_lip_synced_after(self, t0: float) -> tuple[int, float] | None:
        """The first lip-synced frame sent at or after ``t0``: its index and time."""
        return next(((i, t) for i, t, lip in self.frames if t >= t0 and lip), None)

    def sent_since(self, t0: float, count: int) -> bool:
        return sum(t >= t0 for _, t, _ in self.frames) >= count

    def idle_after(self, t0: float) -> float | None:
        """When frames went idle for good after ``t0`` (None while lip-synced ones follow)."""
        after = [(t, lip) for _, t, lip in self.frames if t >= t0]
        last_lip = max((i for i, (_, lip) in enumerate(after) if lip), default=-1)
        return after[last_lip + 1][0] if last_lip + 1 < len(after) else None


async def _speech(text: str) -> np.ndarray:
    """``text`` spoken by the server's own espeak-ng engine, at :data:`RATE`, trimmed."""
    engine = build_tts_engine(TtsSettings(engine="espeak"))
    try:
        pcm = resample_mono(await engine.synthesize(text), OUT_RATE, RATE)
    finally:
        await engine.close()
    loud = np.flatnonzero(np.abs(pcm) > 0.05)
    return pcm[loud[0] : loud[-1] + 1]


def _wav(pcm: np.ndarray) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


async def _until(condition: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Poll ``condition`` every 10 ms (a benchmark's driver, not a test's assertion)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the call did not get there in time")
        await asyncio.sleep(0.01)


async def measure(root: Path, utterances: int, settings: dict[str, object] | None = None) -> Result:
    """``utterances`` streamed and pushed utterances and as many barge-ins, on a server
    with ``settings`` (e.g. ``{"video": {"shared_idle": False}}``) over the defaults."""
    log = FrameLog()
    phrases = [await _speech(text) for text in PHRASES]
    long = await _speech(LONG)
    first_ms: dict[str, list[float]] = {"stream": [], "push": []}
    onset_ms: dict[str, list[float]] = {"stream": [], "push": []}
    event_ms: list[float] = []
    barge_ms: list[float] = []
    async with live_server(root, settings) as (app, url):
        app[SESSIONS].on_frame_sent = log.lip_synced_sent
        async with await connect(url, "demo") as call:
            session = app[SESSIONS].get(call.session_id)
            log.attach(session)
            await _until(lambda: len(log.frames) >= 25)
            async with call.stream_audio(format="s16le", rate=RATE) as stream:
                events = stream.events()

                async def wait_event(
                    kind: str, utterance: int | None = None
                ) -> tuple[float, Event]:
                    async for event in events:
                        if event["type"] == kind and utterance in (None, event.get("utterance")):
                            return time.monotonic(), event
                    raise RuntimeError("the stream ended")

                async def idle() -> None:
                    await _until(lambda: session.queued_audio_s == 0)
                    await _until(lambda: not session.app_audio.speech.speaking)
                    seen = len(log.frames)
                    await _until(lambda: len(log.frames) >= seen + 12)  # a pause

                number = 0  # utterances are numbered in the order they are queued
                for n in range(utterances):
                    pcm = phrases[n % len(phrases)]
                    for mode in ("stream", "push"):
                        await idle()
                        number += 1
                        t0 = time.monotonic()
                        if mode == "stream":
                            for start in range(0, len(pcm), CHUNK):  # the first goes at once
                                await stream.send(pcm[start : start + CHUNK])
                            await stream.end()
                            told, started = await wait_event("speech_started", number)
                            event_ms.append((told - t0) * 1000)
                        else:
                            queued = await call.push_audio(_wav(pcm), "audio/wav")
                            assert queued.utterance == number
                            _, started = await wait_event("speech_started", number)
                        await _until(partial(log.first_lip_synced_after, t0))
                        first = log.first_lip_synced_after(t0)
                        assert first is not None
                        first_ms[mode].append((first[1] - t0) * 1000)
                        # Where that frame shows, against the audio onset (media time).
                        onset_ms[mode].append(first[0] * 40 - started["media_ms"])
                        await wait_event("speech_ended", number)
                for _ in range(utterances):
                    await idle()
                    number += 1
                    for start in range(0, len(long), CHUNK):
                        await stream.send(long[start : start + CHUNK])
                    await stream.end()
                    started_at, _ = await wait_event("speech_started", number)
                    await asyncio.sleep(started_at + 0.5 - time.monotonic())  # into the speech
                    t0 = time.monotonic()
                    await stream.interrupt()
                    await wait_event("interrupted")
                    await _until(partial(log.sent_since, t0, 15))
                    went_idle = log.idle_after(t0)
                    assert went_idle is not None
                    barge_ms.append((went_idle - t0) * 1000)
            lookahead_ms = session.lookahead_ms
            delay_ms = session.delay_s * 1000
    return {
        "first_frame_ms": first_ms,
        "first_frame_after_onset_ms": onset_ms,
        "speech_started_event_ms": event_ms,
        "barge_in_ms": barge_ms,
        "lookahead_ms": lookahead_ms,
        "delay_ms": delay_ms,
    }


def run(quick: bool = False) -> Result:
    utterances = 6 if quick else 20
    with tempfile.TemporaryDirectory() as tmp:
        measured = asyncio.run(measure(Path(tmp), utterances))
    lookahead = measured["lookahead_ms"]
    rows = []
    for label, values in (
        (
            "first chunk streamed → first lip-synced frame sent",
            measured["first_frame_ms"]["stream"],
        ),
        ("whole body pushed → first lip-synced frame sent", measured["first_frame_ms"]["push"]),
        ("first chunk streamed → speech_started received", measured["speech_started_event_ms"]),
        ("interrupt sent → frames idle for good", measured["barge_in_ms"]),
        (
            "first lip-synced frame's time − audio onset (media)",
            [
                *measured["first_frame_after_onset_ms"]["stream"],
                *measured["first_frame_after_onset_ms"]["push"],
            ],
        ),
    ):
        p50, p95, _ = percentiles(values)
        rows.append([label, len(values), round(p50, 1), round(p95, 1), round(max(values), 1)])
    print_table(
        f"Voice agent: one call, demo avatar, lookahead {lookahead:.1f} ms, "
        f"configured delay {measured['delay_ms']:.1f} ms",
        ["what", "n", "p50 ms", "p95 ms", "max ms"],
        rows,
    )
    stream_p95 = percentiles(measured["first_frame_ms"]["stream"])[1]
    barge_p95 = percentiles(measured["barge_in_ms"])[1]
    targets = [
        Target(
            "first chunk → lip-synced frame, p95 - lookahead",
            stream_p95 - lookahead,
            60.0,
            False,
            " ms",
        ),
        Target("barge-in → idle, p95", barge_p95, 200.0, False),
    ]
    print_targets(targets)
    return {**measured, "targets": [t.as_json() for t in targets]}


if __name__ == "__main__":
    run()
