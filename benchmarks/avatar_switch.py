"""Switching a live call's avatar: request to first frame of the new avatar, and CPU after.

    .venv/bin/python -m benchmarks.run --only avatar_switch [--quick]

A server in this process (``live_server``) and a load client in another process making
``CALLS`` calls to avatar ``a`` (the demo avatar at 640x360), each speaking the bundled
speech as its microphone (looped), so the server is busy with live calls the whole time. One of
those calls is switched, over HTTP from this process (``POST /sessions/{id}/avatar``):

1. **loaded**: between ``a`` and ``b`` (another face at 448x336), both models loaded;
2. **cold**: to ``c0``, ``c1``, … (never loaded before: the registry loads each during
   the request) and back to ``a``.

For each switch: request to response (the switch scheduled), and request to the first
frame of the new avatar handed to the call's video track (``LivePipeline.sent`` of the
switch's first frame, the moment ``avatar_changed`` goes out). That frame is the next
one the speech gate decides after the request; frames are decided a lookahead after
their audio and sent a session delay after it, so it goes out about the delay less the
lookahead later (the pipeline margin and a tick, 60 ms by default): the floor of the
figure.

CPU: the server process's CPU seconds per second of wall time over a window of the
same calls before the switches and again after all of them, the switched call back on
``a``: a switch that left anything running (an old model's frames, a loop, a task)
would show as a higher ratio. Target: after / before <= 1.1. Not a test.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.common import Result, Target, percentiles, print_table, print_targets
from benchmarks.live_server import (
    cpu_seconds,
    live_server,
    start_load,
    wait_for_calls,
    write_speech,
)
from inference_core.assets.demo_avatar import write_demo_avatar
from streaming.live.manager import SessionManager
from streaming.live.session import Session
from web.app_keys import SESSIONS

CALLS = 3
TARGET_CPU_RATIO = 1.1


async def _switch(
    http: aiohttp.ClientSession, url: str, session: Session, avatar: str
) -> tuple[float, float]:
    """Switch ``session`` to ``avatar``: (ms to the response, ms to its first frame sent)."""
    sent = asyncio.get_running_loop().create_future()
    start = time.perf_counter()

    def watch(index: int) -> None:
        first = switched.get("frame")
        if first is not None and index >= first and not sent.done():
            sent.set_result(time.perf_counter())

    switched: dict[str, Any] = {}
    session.pipeline.sent_listeners.append(watch)
    try:
        async with http.post(
            f"{url}/sessions/{session.session_id}/avatar", json={"avatar": avatar}
        ) as response:
            body = await response.json()
            if response.status != 200:
                raise RuntimeError(f"switch to {avatar} refused: {body}")
        answered = time.perf_counter()
        switched.update(body)
        shown = await asyncio.wait_for(sent, 30)
    finally:
        session.pipeline.sent_listeners.remove(watch)
    while session.switching or session.pipeline.dissolving:  # noqa: ASYNC110 - polls the call
        await asyncio.sleep(0.05)
    return (answered - start) * 1000, (shown - start) * 1000


async def _cpu_per_s(seconds: float) -> float:
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    await asyncio.sleep(seconds)
    return (cpu_seconds() - cpu0) / (time.perf_counter() - t0)


async def _measure(root: Path, switches: int, window_s: float) -> Result:
    avatars = root / "avatars"
    write_demo_avatar(avatars / "a", size=(640, 360), seed=0)
    write_demo_avatar(avatars / "b", size=(448, 336), seed=7)
    for i in range(switches):
        write_demo_avatar(avatars / f"c{i}", size=(448, 336), seed=10 + i)
    speech = write_speech(root / "speech.wav", 20)
    seconds = 3 * window_s + switches * 4 + 30
    settings: dict[str, object] = {
        "avatars": {"root": str(avatars), "data_dir": str(root / "data"), "demo": False}
    }
    async with live_server(root, settings) as (app, url):
        client = await start_load(
            url, calls=CALLS, seconds=seconds, speech=speech, avatar="a", microphone=True
        )
        try:
            live = await wait_for_calls(app, CALLS, lambda s: s.frames_sent > 50)
            manager: SessionManager = app[SESSIONS]
            session = live[0]
            delay_ms = session.delay_s * 1000
            await manager.core.load("b")
            before = await _cpu_per_s(window_s)
            loaded: list[tuple[float, float]] = []
            cold: list[tuple[float, float]] = []
            async with aiohttp.ClientSession() as http:
                for i in range(switches):
                    loaded.append(await _switch(http, url, session, "b" if i % 2 == 0 else "a"))
                if session.avatar_id != "a":
                    await _switch(http, url, session, "a")
                for i in range(switches):
                    cold.append(await _switch(http, url, session, f"c{i}"))
                    await _switch(http, url, session, "a")
            after = await _cpu_per_s(window_s)
            dropped = {s.session_id[:8]: dict(s.stats.frames_dropped) for s in manager.sessions}
        finally:
            if client.returncode is None:
                client.kill()
            await client.wait()
    return {
        "calls": CALLS,
        "delay_ms": round(delay_ms, 1),
        "loaded": _figures(loaded),
        "cold": _figures(cold),
        "cpu_per_s_before": round(before, 3),
        "cpu_per_s_after": round(after, 3),
        "cpu_ratio": round(after / before, 3),
        "switched_call": session.session_id[:8],
        "frames_dropped": dropped,
    }


def _figures(runs: list[tuple[float, float]]) -> Result:
    answered = [a for a, _ in runs]
    shown = [s for _, s in runs]
    p50, p95, _ = percentiles(shown)
    a50, a95, _ = percentiles(answered)
    return {
        "switches": len(runs),
        "response_p50_ms": round(a50, 1),
        "response_p95_ms": round(a95, 1),
        "first_frame_p50_ms": round(p50, 1),
        "first_frame_p95_ms": round(p95, 1),
        "first_frame_max_ms": round(max(shown), 1),
        "first_frame_median_ms": round(statistics.median(shown), 1),
    }


def run(quick: bool = False) -> Result:
    switches, window_s = (4, 4.0) if quick else (10, 10.0)
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(_measure(Path(tmp), switches, window_s))
    rows = [
        [
            kind,
            result[kind]["switches"],
            result[kind]["response_p50_ms"],
            result[kind]["response_p95_ms"],
            result[kind]["first_frame_p50_ms"],
            result[kind]["first_frame_p95_ms"],
        ]
        for kind in ("loaded", "cold")
    ]
    print_table(
        f"Avatar switch during {CALLS} live speaking calls (delay {result['delay_ms']} ms): "
        "request to response and to the first new frame sent",
        ["model", "switches", "response p50 ms", "p95", "first frame p50 ms", "p95"],
        rows,
    )
    switched = result["switched_call"]
    for call, drops in result["frames_dropped"].items():
        mark = " (the switched call)" if call == switched else ""
        print(f"  frames dropped, call {call}{mark}: {drops}")
    print(
        f"  server CPU per second: {result['cpu_per_s_before']} before, "
        f"{result['cpu_per_s_after']} after the switches (ratio {result['cpu_ratio']})"
    )
    targets = [
        Target(
            "server CPU after / before the switches", result["cpu_ratio"], TARGET_CPU_RATIO, False
        )
    ]
    print_targets(targets)
    result["targets"] = [t.as_json() for t in targets]
    return result
