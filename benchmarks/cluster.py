"""What the cluster mode costs: one process against a front + 2 Ray workers, same cores.

    .venv/bin/python -m benchmarks.run --only cluster [--quick]

Three figures (``docs/architecture.md`` §14):

* **placement**: the time the front takes to order the workers for a new session with
  1,000 registered avatars and 16 workers (simulated reports, each worker holding 60
  models), over 20,000 decisions;
* **capacity**: K speaking 1280×720 demo calls (microphone, from a separate load client
  process) served by one process, then by a front with 2 workers on a local Ray runtime.
  The machine's CPU over the window (all cores, from ``/proc/stat``) less the load
  client's own is what serving took, Ray's own processes included; divided by the frames
  the client received, it is the serving CPU per frame. ``capacity ratio`` = one
  process's CPU per frame ÷ the cluster's (1.0: the cluster serves as many calls on the
  same cores; target ≥ 0.9);
* **offer to first frame**: from the client sending its offer to its first decoded
  frame, per call, one process against through the front.

Not a test: figures depend on the machine and its load; compare within one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from benchmarks.common import Result, Target, print_table, print_targets
from benchmarks.live_server import client_result, live_server, start_load, write_speech
from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from web.cluster.placement import WorkerReport, WorkerState, candidates

SIZE = (1280, 720)
CALLS = 2
TARGET_RATIO = 0.9
WIDE_OPEN = {  # admission opened wide, as in every live benchmark: it finds the limits
    "offer_rate_limit_per_minute": 10_000,
    "max_sessions": 64,
    "admission_headroom": 1.0,
    "cpu_ms_per_session_frame": 0.1,
    "inference_ms_per_frame_estimate": 0.1,
}


# -- placement ---------------------------------------------------------------------------


def placement_us(avatars: int = 1000, workers: int = 16, decisions: int = 20_000) -> float:
    """Mean µs per placement decision over simulated reports."""
    rng = random.Random(7)
    ids = [f"avatar-{i:04d}" for i in range(avatars)]
    states = []
    for w in range(workers):
        report = WorkerReport(
            name=f"w{w}",
            incarnation="0",
            url="",
            node="",
            node_id="",
            pid=0,
            models=frozenset(rng.sample(ids, 60)),
            sessions=rng.randrange(10),
            room_sessions=rng.randrange(1, 10),
            room_share=rng.random(),
        )
        states.append(WorkerState(f"w{w}", report, answering=True))
    asked = [rng.choice(ids) for _ in range(decisions)]
    start = time.perf_counter()
    for avatar in asked:
        candidates(avatar, states)
    return (time.perf_counter() - start) / decisions * 1e6


# -- capacity ------------------------------------------------------------------------------


def _busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (``/proc/stat``)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def cluster_server(root: Path, workers: int) -> AsyncIterator[tuple[web.Application, str]]:
    """A front with ``workers`` Ray workers on 127.0.0.1 (a free port)."""
    from web.cluster.app import build_front_app

    config = Settings.model_validate(
        {
            "avatars": {"root": str(root / "avatars"), "data_dir": str(root / "data")},
            "server": {**WIDE_OPEN, "ice_loopback_only": True},
            "cluster": {"workers": workers, "cpus_per_worker": 1},
        }
    )
    runner = web.AppRunner(build_front_app(config))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield runner.app, f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def _window(root: Path, mode: str, seconds: float) -> dict[str, Any]:
    speech = write_speech(root / "speech.wav", seconds + 15)
    server = (
        live_server(root, {"server": WIDE_OPEN})
        if mode == "one process"
        else cluster_server(root, 2)
    )
    async with server as (_, url):
        load = await start_load(url, calls=CALLS, seconds=seconds, speech=speech, microphone=True)
        await asyncio.sleep(4.0)  # the calls connect and start speaking (not measured)
        busy0, t0 = _busy_seconds(), time.monotonic()
        out, _ = await load.communicate()
        busy, wall = _busy_seconds() - busy0, time.monotonic() - t0
    result = client_result(out, load.returncode)
    client_s = result["client_cores"] * result["window_s"]
    frames = sum(result["fps"]) * result["window_s"]
    # The client's window is inside ours: serving CPU is scaled to the client's window.
    serving_s = (busy - client_s) * result["window_s"] / wall
    return {
        "mode": mode,
        "fps": result["fps"],
        "serving_cores": serving_s / result["window_s"],
        "cpu_ms_per_frame": serving_s * 1000 / frames if frames else float("nan"),
        "first_frame_s": result["first_frame_s"],
    }


def run(quick: bool = False) -> Result:
    decision_us = placement_us()
    seconds = 8.0 if quick else 15.0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_demo_avatar(root / "avatars" / "demo", size=SIZE)
        for mode in ("one process", "front + 2 workers"):
            rows.append(asyncio.run(_window(root, mode, seconds)))
    import ray

    if ray.is_initialized():
        ray.shutdown()
    print_table(
        f"Cluster mode: {CALLS} speaking 720p calls, same 2 cores ({seconds:g} s)",
        ["mode", "fps per call", "serving cores", "CPU ms per frame", "offer → first frame s"],
        [
            [
                r["mode"],
                " / ".join(f"{f:.1f}" for f in r["fps"]),
                r["serving_cores"],
                r["cpu_ms_per_frame"],
                statistics.median(r["first_frame_s"]),
            ]
            for r in rows
        ],
    )
    ratio = rows[0]["cpu_ms_per_frame"] / rows[1]["cpu_ms_per_frame"]
    print(f"\n  placement: {decision_us:.1f} µs per decision (1,000 avatars, 16 workers)")
    print(f"  capacity ratio (one process ÷ cluster CPU per frame): {ratio:.3f}")
    targets = [Target("capacity ratio, cluster vs one process", ratio, TARGET_RATIO, True)]
    print_targets(targets)
    return {
        "placement_us": decision_us,
        "windows": rows,
        "capacity_ratio": ratio,
        "targets": [t.as_json() for t in targets],
    }


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
