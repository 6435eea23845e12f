"""Server-added delay beyond the model's lookahead, with live WebRTC calls.

    .venv/bin/python -m benchmarks.run --only delay [--quick]

Per lip-synced frame, the time from its audio being complete on the session timeline to
the composed frame being ready (``Session.stats.processing_ms``), p50/p95/p99 over all
frames of 1 and 4 concurrent demo-avatar (1280×720) sessions. The calls come from a
separate client process (``benchmarks.webrtc_load``: aiortc, receiving and decoding the
H.264 video) and speak all the time (the bundled sample, repeated, pushed with
``POST /sessions/{id}/audio``). Also prints the configured end-to-end delay
(``session.delay_s`` = lookahead + 20 ms tick + pipeline margin).

Each call count is measured in ``REPEATS`` separate windows (fresh calls each time); every
window is printed, and the figure held against the target is the median window's p95,
so one window that a neighbour on a shared machine slowed down cannot decide it alone.

Target: p95 <= 60 ms. Not a test.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

from aiohttp import web

from benchmarks.common import Result, Target, percentiles, print_table, print_targets
from benchmarks.live_server import live_server, load_run, write_speech
from config.settings import Settings

CALLS = (1, 4)
REPEATS = 3
TARGET_P95_MS = 60.0


async def _measure(root: Path, seconds: float, repeats: int) -> dict[int, list[Result]]:
    speech = write_speech(root / "speech.wav", seconds + 10)
    by_calls: dict[int, list[Result]] = {calls: [] for calls in CALLS}
    async with live_server(root) as (app, url):
        for _ in range(repeats):
            for calls in CALLS:
                by_calls[calls].append(await _window(app, url, calls, seconds, speech))
    return by_calls


async def _window(
    app: web.Application, url: str, calls: int, seconds: float, speech: Path
) -> Result:
    run = await load_run(app, url, calls=calls, seconds=seconds, speech=speech, avatar="demo")
    values = [v for per in run.processing_ms.values() for v in per]
    p50, p95, p99 = percentiles(values)
    return {
        "frames": len(values),
        "p50_ms": p50,
        "p95_ms": p95,
        "p99_ms": p99,
        "max_ms": max(values, default=float("nan")),
        "dropped": run.dropped,
        "client_fps": run.client["fps"],
        "delay_ms": run.delay_ms,
        "lookahead_ms": run.lookahead_ms,
        "server_cpu_s_per_s": run.server_cpu_s / run.window_s,
    }


def run(quick: bool = False, *, seconds: float | None = None) -> Result:
    seconds = seconds or (8.0 if quick else 10.0)
    repeats = 1 if quick else REPEATS
    with tempfile.TemporaryDirectory() as tmp:
        by_calls = asyncio.run(_measure(Path(tmp), seconds, repeats))
    rows = []
    median_p95 = {
        calls: statistics.median(float(w["p95_ms"]) for w in windows)
        for calls, windows in by_calls.items()
    }
    for calls, windows in by_calls.items():
        for n, r in enumerate(windows, 1):
            fps = r["client_fps"]
            assert isinstance(fps, list)
            rows.append(
                [
                    calls,
                    n,
                    r["frames"],
                    r["p50_ms"],
                    f"**{r['p95_ms']:.1f}**",
                    r["p99_ms"],
                    r["max_ms"],
                    f"{min(fps):.1f}–{max(fps):.1f}",
                    sum(sum(d.values()) for d in r["dropped"].values()),
                ]
            )
    print_table(
        f"Server-added delay, demo avatar 1280x720, speaking continuously "
        f"({repeats} windows of {seconds:g} s per call count)",
        [
            "calls",
            "window",
            "frames",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "max ms",
            "client fps",
            "dropped",
        ],
        rows,
    )
    any_run = next(iter(by_calls.values()))[0]
    settings = Settings()
    print(
        f"\n  configured end-to-end delay (session.delay_s): {any_run['delay_ms']:.1f} ms = "
        f"lookahead {any_run['lookahead_ms']:.1f} ms (right_context "
        f"{settings.audio.right_context}) + 20 ms tick + pipeline margin "
        f"{settings.session.pipeline_margin_ms:g} ms"
    )
    targets = [
        Target(
            f"p95 server-added delay, {c} call(s), median window",
            p95,
            TARGET_P95_MS,
            False,
            " ms",
        )
        for c, p95 in median_p95.items()
    ]
    print_targets(targets)
    return {
        "seconds": seconds,
        "calls": by_calls,
        "median_p95_ms": median_p95,
        "targets": [t.as_json() for t in targets],
    }


if __name__ == "__main__":
    run()
