"""A LiveKit avatar session against a direct call: server CPU per frame, join time and
mouth → sound, for each way the video enters the room (``docs/design/livekit.md`` §22).

    .venv/bin/python -m benchmarks.livekit [--seconds 10] [--paths encoded h264 vp8] \
        [--rounds 2] [--json]

A real ``livekit-server`` (v1.13.5, dev mode, ``benchmarks/livekit_room.py``) and, per
media path (``livekit.video``: ``encoded``, lipstream's own H.264 forwarded as made;
``h264``, raw frames that libwebrtc encodes as one H.264 layer; ``vp8``, raw frames into
VP8 with LiveKit's default simulcast), one ``lipstream serve`` child process at its
defaults but for that setting (``livekit.allow_private`` on: the room is on loopback).
The demo avatar at 1280×720. Against each server, ``--rounds`` times, one after the
other:

- **a direct call**: ``lipstream_client.connect`` (aiortc, in this process, decoding the
  H.264 it receives), its speech pushed as one WAV (``POST /sessions/{id}/audio``);
- **a LiveKit session**: this process connects a room as the agent (a participant of
  kind agent), and a viewer (the ``livekit`` SDK, decoding the avatar's tracks);
  ``lipstream_client.livekit.AvatarSession.start`` (the plugin, with a real
  ``AgentSession``) has lipstream join; the same speech goes to it as one segment of the
  plugin's ``DataStreamAudioOutput`` (a TTS faster than real time).

Each is measured **speaking** (a window of ``--seconds`` starting :data:`WARM_S` after
the speech was handed over) and **listening** (a window once the session's queued audio
is spent and :data:`WARM_S` more have passed): the server process's CPU (user + system,
all threads: libwebrtc's and the LiveKit SDK's native ones are in it) divided by the
frames it sent (``GET /sessions/{id}``'s ``frames_sent``), and livekit-server's CPU over
the same window per frame it forwarded (the SFU's share, which a direct call does not
have; it runs once per room, however many subscribe). Idle loops the server built in a
window are counted beside it: a one-off cost per avatar and bitrate that every later
session shares (LiveKit's rate control can walk the target through several rungs on a
busy machine), which the second round has mostly behind it.

**Join**: from ``AvatarSession.start()`` to the first decoded video frame at the viewer;
``start()`` itself returns once lipstream answered ``201`` (joined and published).
**Mouth → sound**: :data:`BURSTS` buzz bursts as a segment; at the viewer, each sound
onset against the next mouth opening (``benchmarks/livekit_room.py``), as
``tests/test_livekit.py`` measures it.

Targets (issue 48), on the default path's last round: speaking ms / frame ≤ 1.3 × the
direct call's in the same server; join ≤ 1.5 s; mouth − sound as the tests hold it (median ≤ 80 ms,
most ≤ 120 ms at the SDK viewer). The viewer and the direct caller decode in this
process, on the same cores as the server: compare the paths' ratios, which share that
load, not figures of different runs. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import statistics
import tempfile
import time
import wave
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from livekit import rtc
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.browser_delay import MOUTH_QUIET_S, av_offsets_ms, mouth_box, rising_edges
from benchmarks.common import Result, Target, machine, print_table, print_targets
from benchmarks.live_server import cpu_seconds, write_speech
from benchmarks.livekit_room import (
    API_KEY,
    API_SECRET,
    LiveKit,
    Subscriber,
    buzz_bursts,
    open_level,
    run_livekit,
    sound_onsets,
)
from benchmarks.server_process import Served, serve_defaults
from inference_core.assets.demo_avatar import ensure_demo_avatar
from streaming.audio_in.decode import decode_audio
from streaming.audio_in.resample import resample_mono

logger = logging.getLogger(__name__)

PATHS = ("encoded", "h264", "vp8")
DEFAULT_PATH = "encoded"
#: Seconds after the speech is handed over (or spent) before a window opens: the
#: session's delay and the ramp of a first utterance are not in it.
WARM_S = 2.0
#: The agent's TTS rate (as ``tests/test_livekit.py``'s): lipstream resamples it.
TTS_RATE = 24_000
BURSTS = 8
#: Seconds any one wait here may take before the run gives up.
WAIT_S = 60.0
TARGET_RATIO = 1.3
TARGET_JOIN_S = 1.5
SYNC_MEDIAN_MS, SYNC_MAX_MS = 80.0, 120.0


@dataclass(frozen=True)
class Window:
    """One measured window of one session."""

    seconds: float
    frames: int
    server_ms_per_frame: float
    livekit_ms_per_frame: float
    #: Idle loops the server built (or was building) in the window: a one-off cost per
    #: avatar and bitrate, shared by every later session, in ms / frame here.
    loops_built: int

    @property
    def fps(self) -> float:
        return self.frames / self.seconds


class Meter:
    """The server's (and livekit-server's) CPU and one session's frames over a window."""

    def __init__(self, served: Served, livekit: LiveKit, http: aiohttp.ClientSession) -> None:
        self.served, self.livekit, self.http = served, livekit, http

    async def state(self, session_id: str) -> dict[str, Any]:
        async with self.http.get(f"{self.served.url}/sessions/{session_id}") as response:
            response.raise_for_status()
            state: dict[str, Any] = await response.json()
            return state

    async def loops(self) -> int:
        """Idle loops built so far and being built now (``/metrics``)."""
        async with self.http.get(f"{self.served.url}/metrics") as response:
            response.raise_for_status()
            text = await response.text()
        values = {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if not s.labels
        }
        built = values["lipstream_idle_loops_built_total"]
        return int(built + values["lipstream_idle_loops_building"])

    async def window(self, session_id: str, seconds: float) -> Window:
        before = await self.state(session_id)
        loops = await self.loops()
        cpu0, sfu0 = cpu_seconds(self.served.pid), cpu_seconds(self.livekit.process.pid)
        t0 = time.monotonic()
        await asyncio.sleep(seconds)  # the window being measured
        cpu1, sfu1 = cpu_seconds(self.served.pid), cpu_seconds(self.livekit.process.pid)
        elapsed = time.monotonic() - t0
        after = await self.state(session_id)
        frames = max(1, after["frames_sent"] - before["frames_sent"])
        return Window(
            seconds=elapsed,
            frames=frames,
            server_ms_per_frame=1000 * (cpu1 - cpu0) / frames,
            livekit_ms_per_frame=1000 * (sfu1 - sfu0) / frames,
            loops_built=await self.loops() - loops,
        )

    async def spent(self, session_id: str) -> None:
        """Once the session has no audio queued."""
        await _until(
            lambda: self._queue_empty(session_id), "the session's speech spent", poll_s=0.2
        )

    async def _queue_empty(self, session_id: str) -> bool:
        return bool((await self.state(session_id))["queued_audio_s"] == 0)


async def _until(condition: Callable[[], Any], what: str, poll_s: float = 0.05) -> None:
    """Poll ``condition`` (plain or async) until true; :data:`WAIT_S` at most."""
    deadline = time.monotonic() + WAIT_S
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {WAIT_S:g} s")
        await asyncio.sleep(poll_s)  # polling: nothing here signals it


def _wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(_int16(pcm).tobytes())
    return out.getvalue()


def _int16(pcm: np.ndarray) -> np.ndarray:
    samples: np.ndarray = (np.clip(pcm, -1.0, 1.0) * 32767).astype(np.int16)
    return samples


async def direct_call(meter: Meter, speech: np.ndarray, seconds: float) -> dict[str, Window]:
    """A direct call speaking, then listening (module doc)."""
    from lipstream_client import connect

    call = await connect(meter.served.url, "demo")
    try:
        await call.push_audio(_wav_bytes(speech, TTS_RATE), "audio/wav")
        await asyncio.sleep(WARM_S)  # the speech's ramp, not measured
        speaking = await meter.window(call.session_id, seconds)
        await meter.spent(call.session_id)
        await asyncio.sleep(WARM_S)  # the session's delay and blend back to listening
        listening = await meter.window(call.session_id, seconds)
    finally:
        await call.hang_up()
    return {"speaking": speaking, "listening": listening}


@contextlib.asynccontextmanager
async def agent_in_room(livekit: LiveKit, room_name: str) -> AsyncIterator[rtc.Room]:
    """This process as the room's agent (a participant of kind agent)."""
    room = rtc.Room()
    await room.connect(livekit.url, livekit.token(f"agent-{room_name}", room_name, kind="agent"))
    try:
        yield room
    finally:
        await room.disconnect()


async def livekit_session(
    meter: Meter, box: tuple[int, int, int, int], path: str, speech: np.ndarray, seconds: float
) -> dict[str, Any]:
    """The plugin's avatar in a room, speaking, listening, then bursts (module doc)."""
    from livekit.agents import AgentSession

    from lipstream_client.livekit import AvatarSession

    room_name = f"bench-{path}"
    viewer = Subscriber(meter.livekit, room_name, box)
    await viewer.connect()
    async with agent_in_room(meter.livekit, room_name) as room:
        agent_session: AgentSession[Any] = AgentSession()
        avatar = AvatarSession(meter.served.url, avatar="demo")
        started = time.monotonic()
        await avatar.start(
            agent_session,
            room,
            livekit_url=meter.livekit.url,
            livekit_api_key=API_KEY,
            livekit_api_secret=API_SECRET,
        )
        answered_s = time.monotonic() - started
        try:
            await _until(lambda: viewer.heard.arrived_s, "the avatar's first frame at the viewer")
            join_s = viewer.heard.arrived_s[0] - started
            assert avatar.session is not None
            assert avatar.audio_output is not None
            session_id = avatar.session.session_id
            output = avatar.audio_output
            finished: list[Any] = []
            output.on("playback_finished", finished.append)

            await _segment(output, speech)
            await asyncio.sleep(WARM_S)  # the speech's ramp, not measured
            speaking = await meter.window(session_id, seconds)
            await _until(lambda: finished, "the speech played")
            await meter.spent(session_id)
            await asyncio.sleep(WARM_S)  # the session's delay and blend back to listening
            listening = await meter.window(session_id, seconds)

            said_at = viewer.heard.audio_clock()[-1]
            await _segment(output, buzz_bursts(TTS_RATE, BURSTS))
            await _until(lambda: len(finished) >= 2, "the bursts played")
            await _until(
                lambda: viewer.heard.frames[-1][0] > viewer.heard.audio_clock()[-1] - 0.1,
                "the viewer's video caught up",
            )
            offsets = _mouth_minus_sound_ms(viewer, said_at)
        finally:
            await avatar.aclose()
            await viewer.close()
    return {
        "speaking": speaking,
        "listening": listening,
        "join_s": join_s,
        "answered_s": answered_s,
        "offsets_ms": offsets,
        "sizes": sorted(viewer.heard.sizes),
    }


async def _segment(output: Any, pcm: np.ndarray) -> None:
    """``pcm`` (at :data:`TTS_RATE`) as one segment, as fast as it is taken."""
    samples = _int16(pcm)
    step = TTS_RATE // 50
    for start in range(0, len(samples), step):
        chunk = samples[start : start + step]
        await output.capture_frame(rtc.AudioFrame(chunk.tobytes(), TTS_RATE, 1, len(chunk)))
    output.flush()


def _mouth_minus_sound_ms(viewer: Subscriber, since_s: float) -> list[float]:
    heard = viewer.heard
    sounds = sound_onsets(heard, since_s, quiet_s=0.4)
    if not sounds:
        return []
    window = heard.frames_between(sounds[0] - 0.5, sounds[-1] + 1.0)
    level = open_level(window)
    mouths = rising_edges([t for t, _ in window], [d for _, d in window], level, MOUTH_QUIET_S)
    return av_offsets_ms(sounds, mouths)


async def measure(paths: list[str], seconds: float, rounds: int) -> Result:
    """Every path's server against its own direct call, ``rounds`` times (module doc)."""
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="lipstream-livekit-bench-") as tmp:
        root = Path(tmp)
        speech_16k = decode_audio(write_speech(root / "speech.wav", seconds + WARM_S + 1)).pcm_16k
        speech = resample_mono(speech_16k, 16_000, TTS_RATE)
        box = mouth_box(ensure_demo_avatar(root / "data"))
        with run_livekit(root / "livekit") as livekit:
            for path in paths:
                sections = {"livekit": {"allow_private": True, "video": path}}
                results[path] = []
                async with (
                    serve_defaults(root, sections) as served,
                    aiohttp.ClientSession() as http,
                ):
                    meter = Meter(served, livekit, http)
                    for round_ in range(rounds):
                        direct = await direct_call(meter, speech, seconds)
                        room = await livekit_session(
                            meter, box, f"{path}-{round_}", speech, seconds
                        )
                        results[path].append({"direct": direct, "livekit": room})
                        logger.info("%s round %d: %s", path, round_, results[path][-1])
    return _summary(results, seconds)


def _summary(results: dict[str, list[dict[str, Any]]], seconds: float) -> Result:
    cpu_rows, room_rows = [], []
    out: dict[str, Any] = {"machine": machine(), "seconds": seconds, "paths": {}}
    for path, rounds in results.items():
        out["paths"][path] = []
        for number, result in enumerate(rounds, 1):
            direct, room = result["direct"], result["livekit"]
            figures: dict[str, Any] = {
                k: room[k] for k in ("join_s", "answered_s", "offsets_ms", "sizes")
            }
            for phase in ("speaking", "listening"):
                ours, call = room[phase], direct[phase]
                ratio = ours.server_ms_per_frame / call.server_ms_per_frame
                figures[phase] = {
                    "livekit": vars(ours) | {"fps": ours.fps},
                    "direct": vars(call) | {"fps": call.fps},
                    "ratio": ratio,
                }
                cpu_rows.append(
                    (
                        path,
                        number,
                        phase,
                        f"{call.server_ms_per_frame:.2f}",
                        f"{ours.server_ms_per_frame:.2f}",
                        f"{ratio:.2f}",
                        f"{ours.livekit_ms_per_frame:.2f}",
                        f"{call.fps:.1f} / {ours.fps:.1f}",
                        f"{call.loops_built} / {ours.loops_built}",
                    )
                )
            room_rows.append(
                (
                    path,
                    number,
                    f"{1000 * room['answered_s']:.0f}",
                    f"{1000 * room['join_s']:.0f}",
                    _offsets_cell(room["offsets_ms"]),
                    len(room["offsets_ms"]),
                )
            )
            out["paths"][path].append(figures)
    print_table(
        "Server CPU per frame sent: LiveKit session vs direct call (same server)",
        (
            "path",
            "round",
            "phase",
            "direct ms",
            "livekit ms",
            "ratio",
            "SFU ms",
            "fps direct / livekit",
            "loops built direct / livekit",
        ),
        cpu_rows,
    )
    print_table(
        "Join and mouth - sound at the viewer",
        ("path", "round", "start() ms", "first frame ms", "offsets ms (median, max |.|)", "n"),
        room_rows,
    )
    targets = []
    default = out["paths"].get(DEFAULT_PATH)
    if default:
        last = default[-1]  # the steady round: its loops built (module doc)
        size = [abs(o) for o in last["offsets_ms"]] or [float("inf")]
        targets = [
            Target(
                f"{DEFAULT_PATH}: speaking ms / frame vs direct (last round)",
                last["speaking"]["ratio"],
                TARGET_RATIO,
                higher_is_better=False,
                unit="x",
            ),
            Target(f"{DEFAULT_PATH}: join (last round)", last["join_s"], TARGET_JOIN_S, False, "s"),
            Target(
                f"{DEFAULT_PATH}: |mouth - sound| median",
                statistics.median(size),
                SYNC_MEDIAN_MS,
                False,
                "ms",
            ),
            Target(f"{DEFAULT_PATH}: |mouth - sound| max", max(size), SYNC_MAX_MS, False, "ms"),
        ]
        print_targets(targets)
    out["targets"] = [vars(t) | {"ok": t.ok} for t in targets]
    return out


def _offsets_cell(offsets: list[float]) -> str:
    if not offsets:
        return "none"
    return f"{statistics.median(offsets):+.0f}, {max(abs(o) for o in offsets):.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="each window's length")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument(
        "--rounds", type=int, default=2, help="direct call then LiveKit session, per server"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = asyncio.run(measure(args.paths, args.seconds, args.rounds))
    if args.json:
        print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
