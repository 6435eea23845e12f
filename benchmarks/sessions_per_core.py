"""Sessions per core: the most concurrent demo sessions that all keep >= 24 fps.

    .venv/bin/python -m benchmarks.run --only sessions_per_core [--quick]

At 854×480 and 1280×720 (demo avatar, configured encoder), K = 1, 2, 3 ... speaking
calls from a separate client process (``benchmarks.webrtc_load``; it receives and
decodes every call's H.264, on the same machine). A step passes when every call
received >= 24 fps over the window, at most 1% of the frames lost their lip-sync (a
frame whose inference missed its deadline is sent as the idle frame: the fps hides it)
and the server-added delay does not grow (median of the last quarter of frames within
20 ms of the first quarter's). The server's CPU is
its own process's utime+stime (``/proc/self/stat``) over the window; sessions per core
= the largest passing K / the cores the server used at that K. Target at 720p: >= 4
sessions per core (issue 12). Not a test.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import Result, Target, print_table, print_targets
from benchmarks.live_server import live_server, load_run, write_speech
from inference_core.assets.demo_avatar import write_demo_avatar

MIN_FPS = 24.0
GROWTH_MS = 20.0
MAX_DROPPED = 0.01  # share of the window's frames whose lip-sync may be dropped
TARGET_PER_CORE = 4.0


def _growing(per_session: list[list[float]]) -> bool:
    for values in per_session:
        quarter = len(values) // 4
        if quarter >= 5 and (
            statistics.median(values[-quarter:]) - statistics.median(values[:quarter]) > GROWTH_MS
        ):
            return True
    return False


async def _measure(root: Path, seconds: float, max_calls: int) -> dict[str, list[Result]]:
    write_demo_avatar(root / "avatars" / "demo480", size=(854, 480))
    speech = write_speech(root / "speech.wav", seconds + 15)
    steps: dict[str, list[Result]] = {}
    async with live_server(root) as (app, url):
        for label, avatar in (("854x480", "demo480"), ("1280x720", "demo")):
            steps[label] = []
            for calls in range(1, max_calls + 1):
                run = await load_run(
                    app, url, calls=calls, seconds=seconds, speech=speech, avatar=avatar
                )
                fps = [float(f) for f in run.client["fps"]]
                grows = _growing(list(run.processing_ms.values()))
                cores = run.server_cpu_s / run.window_s
                dropped = sum(sum(d.values()) for d in run.dropped.values())
                expected = calls * 25 * run.window_s
                ok = min(fps) >= MIN_FPS and not grows and dropped <= MAX_DROPPED * expected
                steps[label].append(
                    {
                        "calls": calls,
                        "min_fps": min(fps),
                        "mean_fps": statistics.mean(fps),
                        "delay_grows": grows,
                        "server_cores": cores,
                        "pass": ok,
                        "dropped": dropped,
                    }
                )
                if not ok:
                    break
    return steps


def run(quick: bool = False, *, seconds: float | None = None, max_calls: int = 8) -> Result:
    seconds = seconds or (6.0 if quick else 10.0)
    with tempfile.TemporaryDirectory() as tmp:
        steps = asyncio.run(_measure(Path(tmp), seconds, max_calls))
    rows, summary, targets = [], {}, []
    for label, results in steps.items():
        for r in results:
            rows.append(
                [
                    label,
                    r["calls"],
                    r["min_fps"],
                    r["mean_fps"],
                    r["dropped"],
                    "yes" if r["delay_grows"] else "no",
                    r["server_cores"],
                    "ok" if r["pass"] else "fail",
                ]
            )
        passing = [r for r in results if r["pass"]]
        best = passing[-1] if passing else None
        per_core = float(best["calls"]) / float(best["server_cores"]) if best else 0.0
        summary[label] = {
            "steps": results,
            "max_sessions": best["calls"] if best else 0,
            "sessions_per_server_core": per_core,
        }
        if label == "1280x720":
            targets.append(Target("720p sessions per server core", per_core, TARGET_PER_CORE, True))
    print_table(
        f"Sessions per core (demo avatar, speaking calls, {seconds:g} s window per step)",
        [
            "size",
            "calls",
            "min fps",
            "mean fps",
            "dropped",
            "delay grows",
            "server cores used",
            "step",
        ],
        rows,
    )
    print()
    for label, s in summary.items():
        print(
            f"  {label}: {s['max_sessions']} sessions keep >= {MIN_FPS:g} fps; "
            f"{s['sessions_per_server_core']:.2f} sessions per server core"
        )
    print_targets(targets)
    return {"sizes": summary, "seconds": seconds, "targets": [t.as_json() for t in targets]}


if __name__ == "__main__":
    run()
