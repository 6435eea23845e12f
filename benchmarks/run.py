"""Run the lipstream benchmark suite: one table per benchmark, PASS/MISS per target.

    .venv/bin/python -m benchmarks.run [--quick] [--json out.json [--plots]] [--only NAME ...]

Benchmarks (each its own module with ``run(quick) -> dict``): core_throughput, core_overhead,
protocols, frame_costs, delay, browser_delay, memory, cold_start, sessions_per_core, live_cpu,
margin, cluster, voice_agent, conversation, avatar_switch, gpu (CUDA only: elsewhere it says why it
measured nothing). ``soak`` (30 minutes of calls; 3 with ``--quick``) runs only when named
(``--only soak``): the full run is meant to take about 10 minutes.
Targets are ratios and limits printed as PASS/MISS; nothing here fails a test. Figures
depend on the machine and its load: compare figures from one run.

``--plots`` (with ``--json``) also draws the figures of ``benchmarks.plots`` as SVG files
next to the JSON; it is a flag, not the default, because matplotlib is an optional extra
(``pip install 'lipstream[plots]'``): without it the run still writes its JSON and says
what to install. ``python -m benchmarks.plots results.json`` plots an earlier run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import time
from pathlib import Path

from benchmarks.common import Result, machine
from benchmarks.plots import PlotsUnavailableError, write_plots

BENCHMARKS = (
    "core_throughput",
    "core_overhead",
    "protocols",
    "frame_costs",
    "delay",
    "browser_delay",
    "memory",
    "cold_start",
    "sessions_per_core",
    "live_cpu",
    "margin",
    "cluster",
    "voice_agent",
    "conversation",
    "gpu",
    "avatar_switch",
)
#: Run only when named with ``--only``: too long for the full run.
NAMED_ONLY = ("soak",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter runs, noisier figures")
    parser.add_argument("--json", type=Path, help="write every result to this file")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS + NAMED_ONLY, metavar="NAME")
    parser.add_argument(
        "--plots", action="store_true", help="also write SVG figures next to the --json file"
    )
    args = parser.parse_args()
    if args.plots and not args.json:
        parser.error("--plots writes next to the results: give --json too")
    logging.basicConfig(level=logging.WARNING)
    info = machine()
    print(
        f"lipstream benchmarks on {info['cpu']} ({info['cpus']} CPUs), {info['date']}, "
        f"load average {info['load_average']}"
    )
    results: dict[str, Result] = {"machine": info, "quick": args.quick}
    for name in args.only or BENCHMARKS:
        start = time.perf_counter()
        module = importlib.import_module(f"benchmarks.{name}")
        results[name] = module.run(quick=args.quick)
        print(f"  ({name}: {time.perf_counter() - start:.0f} s)")
    targets = [
        (name, t)
        for name, r in results.items()
        if isinstance(r, dict)
        for t in r.get("targets", [])
    ]
    print("\n## Targets\n")
    for name, t in targets:
        verdict = "PASS" if t["pass"] else "MISS"
        print(f"  {verdict}  {name}: {t['name']} = {t['value']} (target {t['op']} {t['limit']})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    if args.plots:
        _plot(args.json)


def _plot(results_json: Path) -> None:
    """Figures from the JSON just written (its keys as a later re-plot will read them)."""
    try:
        written = write_plots(json.loads(results_json.read_text()), results_json.parent)
    except PlotsUnavailableError as exc:
        print(f"\nno plots: {exc}")
        return
    if not written:
        print("\nno plots: none of the benchmarks run has a figure (benchmarks/plots.py)")
    for path in written:
        print(f"  plot: {path}")


if __name__ == "__main__":
    main()
