"""The smallest ``session.pipeline_margin_ms`` that keeps a loaded server's frames lip-synced.

    .venv/bin/python -m benchmarks.run --only margin [--quick]

The margin is the part of the configured delay left for features, batched inference and
compositing after the model's lookahead and one 20 ms tick (``docs/design/delay.md``
§8): every millisecond of it is a millisecond every caller waits, and a frame that
misses it goes out as the idle frame (its lip-sync lost). This benchmark finds how many
1280×720 demo calls admission control lets in with the default settings (its own
capacity model, :func:`~streaming.live.admission.refusal`, fed with the model's inference
cost and the server's CPU per frame sent as measured in a first 1-call window, as its CPU
meter would), then, for each margin, runs that many speaking
calls (speech as each call's microphone, from a separate client process) and counts the
share of the frames meant to be lip-synced that went out lip-synced: frames inferred ÷
(frames inferred + frames dropped for any reason). It does the same for every smaller
number of calls, since a machine that cannot serve what admission lets in needs a
different fix (admission's CPU figure) than a margin, and for one call more than
admission lets in (refused in a real server: the row shows what the refusal protects).

The server runs pinned to half of the cores (at least one) and the load client to the
rest (:func:`~benchmarks.live_server.split_cpus`), so that admission, which counts the
cores the process may use, is judged on the cores the server really has: a deployment
does not run its callers' H.264 decoders on the server's cores, and on the 2-core
development VM the clients of 3–4 calls took most of a core from an unpinned server.

Target: ≥ 99% lip-synced at the default margin with the admitted number of calls. The
suggested margin is the smallest tried that reaches 99%. Not a test.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

from benchmarks.common import Result, Target, print_table, print_targets
from benchmarks.live_server import (
    client_result,
    cpu_seconds,
    live_server,
    pinned,
    split_cpus,
    start_load,
    wait_for_calls,
    write_speech,
)
from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from streaming.live.admission import AdmissionControl, SessionLoad, refusal
from web.app_keys import CORE

MARGINS_MS = (20.0, 40.0, 60.0, 80.0, 120.0)
TARGET_SHARE = 0.99


def admitted_calls(app: web.Application, cpu_ms: float, avatar: str = "demo") -> int:
    """How many calls of ``avatar`` default admission control lets in on this machine,
    with the model's inference cost as measured in ``app`` (a server that ran it) and
    ``cpu_ms`` of the process's CPU per frame sent (what its CPU meter measures in a
    steady call)."""
    core = app[CORE]
    model = core.registry.entry(avatar).model
    assert model is not None, "run a call first: admission uses the measured cost"
    control = AdmissionControl(Settings(), core, measured_cpu_ms=lambda: cpu_ms)
    load = control.load_of(model, cpu_ms)
    budget = control.budget()
    running: list[SessionLoad] = []
    while refusal(budget, running, load) is None:
        running.append(load)
    return len(running)


def _window(
    root: Path, margin_ms: float, calls: int, seconds: float, admit: list[int] | None = None
) -> dict[str, Any]:
    """One window, the server pinned to its half of the cores and the client to the rest."""
    server_cpus, client_cpus = split_cpus()
    with pinned(server_cpus):
        return asyncio.run(_pinned_window(root, margin_ms, calls, seconds, client_cpus, admit))


async def _pinned_window(
    root: Path,
    margin_ms: float,
    calls: int,
    seconds: float,
    client_cpus: set[int],
    admit: list[int] | None,
) -> dict[str, Any]:
    speech = write_speech(root / "speech.wav", seconds + 15)
    settings: dict[str, object] = {"session": {"pipeline_margin_ms": margin_ms}}
    async with live_server(root, settings) as (app, url):
        load = start_load(
            url, calls=calls, seconds=seconds, speech=speech, microphone=True, cpus=client_cpus
        )
        client = await load
        sessions = await wait_for_calls(app, calls, lambda s: s.frames_sent > 0)
        await asyncio.sleep(1.0)
        before = [(s.stats.frames_inferred, sum(s.stats.frames_dropped.values())) for s in sessions]
        cpu0, sent0 = cpu_seconds(), sum(s.frames_sent for s in sessions)
        await asyncio.sleep(seconds * 0.7)
        cpu = cpu_seconds() - cpu0
        sent = sum(s.frames_sent for s in sessions) - sent0
        inferred = sum(s.stats.frames_inferred for s in sessions) - sum(b[0] for b in before)
        dropped = sum(sum(s.stats.frames_dropped.values()) for s in sessions) - sum(
            b[1] for b in before
        )
        if admit is not None:
            admit.append(admitted_calls(app, cpu * 1000 / sent))
        out, _ = await client.communicate()
        fps = client_result(out, client.returncode)["fps"]
    wanted = inferred + dropped
    return {
        "margin_ms": margin_ms,
        "calls": calls,
        "lip_synced": inferred / wanted if wanted else 0.0,
        "dropped": dropped,
        "min_fps": min(float(f) for f in fps),
    }


def run(quick: bool = False) -> Result:
    seconds = 6.0 if quick else 10.0
    default_margin = Settings().session.pipeline_margin_ms
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_demo_avatar(root / "avatars" / "demo", size=(1280, 720))
        admit: list[int] = []
        results = [_window(root, default_margin, 1, seconds, admit)]
        admitted = admit[0]
        for calls in range(1, admitted + 2):
            for margin in MARGINS_MS:
                if (calls, margin) != (1, default_margin):
                    results.append(_window(root, margin, calls, seconds))
    results.sort(key=lambda r: (r["calls"], r["margin_ms"]))
    print_table(
        f"Lip-synced share by margin, 720p calls speaking ({seconds * 0.7:.0f} s window); "
        f"admission lets in {admitted}",
        ["calls", "margin ms", "lip-synced", "dropped", "min fps"],
        [
            [
                f"{r['calls']} (refused by admission)" if r["calls"] > admitted else r["calls"],
                r["margin_ms"],
                f"{100 * r['lip_synced']:.1f}%",
                r["dropped"],
                r["min_fps"],
            ]
            for r in results
        ],
    )
    smallest: dict[int, float | None] = {}
    for calls in range(1, admitted + 2):
        enough = [
            r["margin_ms"]
            for r in results
            if r["calls"] == calls and r["lip_synced"] >= TARGET_SHARE
        ]
        smallest[calls] = min(enough) if enough else None
        print(f"  {calls} call(s): smallest margin keeping >= 99%: {smallest[calls]}")
    at_default = next(
        r["lip_synced"]
        for r in results
        if r["calls"] == admitted and r["margin_ms"] == default_margin
    )
    targets = [
        Target(
            f"lip-synced at {default_margin:g} ms with {admitted} calls",
            at_default,
            TARGET_SHARE,
            True,
        )
    ]
    print_targets(targets)
    return {
        "admitted": admitted,
        "results": results,
        "smallest_margin_ms": smallest,
        "targets": [t.as_json() for t in targets],
    }


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
