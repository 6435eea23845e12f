"""What the cluster mode costs: one process against a front + 2 Ray workers, same cores.

    .venv/bin/python -m benchmarks.run --only cluster [--quick]

Three figures (``docs/design/cluster.md`` §14):

* **placement**: the time the front takes to order the workers for a new session with
  1,000 registered avatars and 16 workers (simulated reports, each worker holding 60
  models), over 20,000 decisions;
* **capacity**: 2 speaking 1280×720 demo calls (microphone, from a separate load client
  process) served by one process, then by a front with 2 workers on a local Ray runtime.
  The machine's CPU over a window inside the client's (all cores, from ``/proc/stat``)
  less the load client's own (its ``/proc/<pid>/stat``, read at the same instants) is
  what serving took, the front and Ray's own processes included; divided by the frames
  the client received, it is the serving CPU per frame. The two modes alternate, twice
  (once with ``--quick``), since this VM's speed drifts by up to 2× from one minute to
  the next; ``capacity ratio`` = one process's median CPU per frame ÷ the cluster's
  (1.0: the cluster serves as many calls on the same cores; target ≥ 0.9);
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

import aiohttp
from aiohttp import web

from benchmarks.common import Result, Target, print_table, print_targets
from benchmarks.live_server import (
    client_result,
    live_server,
    served,
    start_load,
    wait_for_calls,
    write_speech,
)
from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from web.cluster.placement import WorkerReport, WorkerState, candidates

SIZE = (1280, 720)
CALLS = 2
MODES = ("one process", "front + 2 workers")
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
            live_sessions=rng.randrange(10),
            room_places=rng.randrange(1, 10),
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
    async with served(build_front_app(config)) as (app, url):
        yield app, url


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _calls_live(app: web.Application, one: bool) -> None:
    """Return once the load client's calls are live (60 s at most)."""
    if one:
        await wait_for_calls(app, CALLS, lambda s: s.frames_sent > 0)
        return
    from web.cluster.app import FRONT

    front = app[FRONT]
    async with asyncio.timeout(60):
        while True:
            await front.refresh()
            if sum(w.report.live_sessions for w in front.workers.values() if w.report) >= CALLS:
                return
            await asyncio.sleep(0.2)


async def _lip_sync_counts(url: str) -> tuple[int, int]:
    """Frames inferred and dropped so far over every live session, through the HTTP API."""
    async with aiohttp.ClientSession(base_url=url) as http:
        async with http.get("/admin/sessions") as listed:
            ids = [s["id"] for s in (await listed.json())["sessions"]]
        inferred = dropped = 0
        for session_id in ids:
            async with http.get(f"/sessions/{session_id}") as answer:
                state = await answer.json()
            inferred += state["frames_inferred"]
            dropped += sum(state["frames_dropped"].values())
    return inferred, dropped


async def _window(root: Path, mode: str, seconds: float) -> dict[str, Any]:
    speech = write_speech(root / "speech.wav", seconds + 15)
    one = mode == "one process"
    server = live_server(root, {"server": WIDE_OPEN}) if one else cluster_server(root, 2)
    async with server as (app, url):
        load = await start_load(url, calls=CALLS, seconds=seconds, speech=speech, microphone=True)
        await _calls_live(app, one)
        await asyncio.sleep(2.0)  # speaking, caches warm
        # Both read at the same two instants, inside the client's window.
        synced0 = await _lip_sync_counts(url)
        busy0, client0, t0 = _busy_seconds(), _process_cpu(load.pid), time.monotonic()
        await asyncio.sleep(seconds * 0.5)
        busy, client = _busy_seconds() - busy0, _process_cpu(load.pid) - client0
        window = time.monotonic() - t0
        synced1 = await _lip_sync_counts(url)
        out, _ = await load.communicate()
    result = client_result(out, load.returncode)
    frames = sum(result["fps"]) * window  # the client's fps over its whole window
    serving_s = busy - client
    inferred, dropped = synced1[0] - synced0[0], synced1[1] - synced0[1]
    return {
        "mode": mode,
        "lip_synced": inferred / (inferred + dropped) if inferred + dropped else 0.0,
        "fps": result["fps"],
        "serving_cores": serving_s / window,
        "client_cores": client / window,
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
        for _ in range(1 if quick else 2):  # alternating: the VM's speed drifts between windows
            for mode in MODES:
                rows.append(asyncio.run(_window(root, mode, seconds)))
    import ray

    if ray.is_initialized():
        ray.shutdown()
    print_table(
        f"Cluster mode: {CALLS} speaking 720p calls, same 2 cores ({seconds:g} s)",
        [
            "mode",
            "fps per call",
            "lip-synced",
            "serving cores",
            "client cores",
            "CPU ms per frame",
            "offer → first frame s",
        ],
        [
            [
                r["mode"],
                " / ".join(f"{f:.1f}" for f in r["fps"]),
                f"{100 * r['lip_synced']:.1f}%",
                r["serving_cores"],
                r["client_cores"],
                r["cpu_ms_per_frame"],
                statistics.median(r["first_frame_s"]),
            ]
            for r in rows
        ],
    )
    per_frame = {
        m: statistics.median(r["cpu_ms_per_frame"] for r in rows if r["mode"] == m) for m in MODES
    }
    ratio = per_frame[MODES[0]] / per_frame[MODES[1]]
    print(f"\n  placement: {decision_us:.1f} µs per decision (1,000 avatars, 16 workers)")
    print(f"  capacity ratio (one process ÷ cluster, median CPU per frame): {ratio:.3f}")
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
