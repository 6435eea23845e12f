"""Server-added delay beyond the model's lookahead, with live WebRTC calls.

    .venv/bin/python -m benchmarks.run --only delay [--quick]

Per lip-synced frame, the time from its audio being complete on the session timeline to
the composed frame being ready (``Session.stats.processing_ms``), p50/p95/p99 over all
frames of 1 and 4 concurrent demo-avatar (1280×720) sessions. The calls come from a
separate client process (``benchmarks.webrtc_load``: aiortc, receiving and decoding the
H.264 video) and speak all the time (the bundled sample, repeated, pushed with
``POST /sessions/{id}/audio``). Also prints the configured end-to-end delay
(``session.delay_s`` = lookahead + 20 ms tick + pipeline margin).

Target: p95 <= 60 ms. Not a test.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from benchmarks.common import Result, Target, percentiles, print_table, print_targets
from benchmarks.live_server import live_server, load_run, write_speech
from config.settings import Settings

CALLS = (1, 4)
TARGET_P95_MS = 60.0


async def _measure(root: Path, seconds: float) -> dict[int, Result]:
    speech = write_speech(root / "speech.wav", seconds + 10)
    by_calls: dict[int, Result] = {}
    async with live_server(root) as (app, url):
        for calls in CALLS:
            run = await load_run(
                app, url, calls=calls, seconds=seconds, speech=speech, avatar="demo"
            )
            values = [v for per in run.processing_ms.values() for v in per]
            p50, p95, p99 = percentiles(values)
            by_calls[calls] = {
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
    return by_calls


def run(quick: bool = False, *, seconds: float | None = None) -> Result:
    seconds = seconds or (8.0 if quick else 15.0)
    with tempfile.TemporaryDirectory() as tmp:
        by_calls = asyncio.run(_measure(Path(tmp), seconds))
    rows = []
    for calls, r in by_calls.items():
        fps = r["client_fps"]
        assert isinstance(fps, list)
        rows.append(
            [
                calls,
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
        f"Server-added delay, demo avatar 1280x720, speaking continuously ({seconds:g} s window)",
        ["calls", "frames", "p50 ms", "p95 ms", "p99 ms", "max ms", "client fps", "dropped"],
        rows,
    )
    any_run = next(iter(by_calls.values()))
    settings = Settings()
    print(
        f"\n  configured end-to-end delay (session.delay_s): {any_run['delay_ms']:.1f} ms = "
        f"lookahead {any_run['lookahead_ms']:.1f} ms (right_context "
        f"{settings.audio.right_context}) + 20 ms tick + pipeline margin "
        f"{settings.session.pipeline_margin_ms:g} ms"
    )
    targets = [
        Target(
            f"p95 server-added delay, {c} call(s)",
            float(r["p95_ms"]),
            TARGET_P95_MS,
            False,
            " ms",
        )
        for c, r in by_calls.items()
    ]
    print_targets(targets)
    return {"seconds": seconds, "calls": by_calls, "targets": [t.as_json() for t in targets]}


if __name__ == "__main__":
    run()
