"""A/B: the same benchmarks on this tree and on an earlier commit, in alternating rounds.

    .venv/bin/python -m benchmarks.ab --baseline 64a6e49 [--candidate HEAD] --rounds 3 \\
        --quick --only live_cpu delay voice_agent conversation --calls 1 2

Shared machines drift (another job starts, the VM is moved): figures taken an hour apart
cannot be compared. So each round runs every benchmark on both trees back to back, the
order flipping every round (A B, B A, A B…), and the table gives each tree's median over
the rounds, the ratio (this tree / baseline) and the spread of the rounds: a ratio
inside the rounds' own spread is noise.

Each tree runs its own benchmark code, in a child process whose working directory is
that tree (each commit named is checked out with ``git worktree`` in a temporary
directory), so the baseline is measured exactly as it was. ``--candidate`` measures a
commit rather than the working tree: what others edit meanwhile cannot reach the runs.
A benchmark that is new in this tree is copied into the baseline's worktree, so the
baseline is measured with the same instrument (it must use only what both trees have).
``--calls`` replaces the call counts of ``live_cpu`` and ``delay`` (module constants in
both trees). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import print_table

REPO = Path(__file__).resolve().parent.parent

Metrics = dict[str, float]


def _live_cpu(result: dict[str, Any]) -> Metrics:
    return {
        f"server CPU ms per 720p frame, {r['calls']} call(s)": r["live_ms"] for r in result["live"]
    }


def _delay(result: dict[str, Any]) -> Metrics:
    return {
        f"added delay p95 ms, {calls} call(s)": float(p95)
        for calls, p95 in result["median_p95_ms"].items()
    }


def _voice_agent(result: dict[str, Any]) -> Metrics:
    return {
        "first streamed chunk -> first lip-synced frame p95 ms": _p95(
            result["first_frame_ms"]["stream"]
        ),
        "barge-in -> idle p95 ms": _p95(result["barge_in_ms"]),
    }


def _conversation(result: dict[str, Any]) -> Metrics:
    """Sharing on (the default): server CPU per conversational call-second per scenario
    (its inverse is calls per server core), and the listening and speaking calls' CPU per
    frame; each the mean of the run's rounds."""
    metrics: dict[str, list[float]] = defaultdict(list)
    for r in result["conversational"]:
        if r["shared_idle"]:
            metrics[f"server CPU s per call-s, {r['scenario']}"].append(r["cpu_per_call_s"])
    for r in result["duty"]:
        if r["shared_idle"]:
            metrics[f"server CPU ms per frame, {r['mode']} call"].append(r["cpu_ms_per_frame"])
    return {k: statistics.mean(v) for k, v in metrics.items()}


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _core_overhead(result: dict[str, Any]) -> Metrics:
    metrics = {}
    for count, r in result["sessions"].items():
        metrics[f"core CPU us per frame, {count} sessions"] = r["core_us"]
        metrics[f"scheduler CPU us per frame (null model), {count} sessions"] = r["scheduler_us"]
    for batch, us in result["wrapper_us"].items():
        metrics[f"run_batch outside the model, us per frame, batch {batch}"] = us
    return metrics


def _core_throughput(result: dict[str, Any]) -> Metrics:
    return {
        f"{name} served/raw, {count} sessions": r["ratio"]
        for name, model in result["models"].items()
        for count, r in model["sessions"].items()
    }


#: What is compared of each benchmark's result (what its ``run()`` returns).
EXTRACT: dict[str, Callable[[dict[str, Any]], Metrics]] = {
    "core_overhead": _core_overhead,
    "core_throughput": _core_throughput,
    "live_cpu": _live_cpu,
    "delay": _delay,
    "voice_agent": _voice_agent,
    "conversation": _conversation,
}

_CHILD = """
import json, sys
import benchmarks.{name} as module
calls = {calls!r}
if calls and hasattr(module, "CALLS"):
    module.CALLS = tuple(calls)
result = module.run(quick={quick!r})
with open({out!r}, "w") as f:
    json.dump(result, f, default=str)
"""


def _run(tree: Path, name: str, quick: bool, calls: list[int], out: Path) -> Metrics:
    module = tree / "benchmarks" / f"{name}.py"
    if not module.exists():  # new in this tree: the baseline is measured with it too
        shutil.copy(REPO / "benchmarks" / f"{name}.py", module)
    code = _CHILD.format(name=name, calls=calls, quick=quick, out=str(out))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL
    )
    result = json.loads(out.read_text())
    # JSON keys are strings: the call counts of delay's median_p95_ms among them.
    return EXTRACT[name](result)


@contextmanager
def _checkout(commit: str | None) -> Iterator[Path]:
    """A worktree of ``commit`` for the duration (None: this working tree)."""
    if commit is None:
        yield REPO
        return
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), commit],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", required=True, help="the commit to compare against")
    parser.add_argument("--candidate", help="the commit to measure (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=sorted(EXTRACT), default=sorted(EXTRACT))
    parser.add_argument("--calls", nargs="+", type=int, default=[], help="call counts")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {
        "baseline": defaultdict(list),
        "this tree": defaultdict(list),
    }
    with (
        _checkout(args.baseline) as base,
        _checkout(args.candidate) as candidate,
        tempfile.TemporaryDirectory() as tmp,
    ):
        trees = [("baseline", base), ("this tree", candidate)]
        for round_ in range(args.rounds):
            for label, tree in trees if round_ % 2 == 0 else trees[::-1]:
                for name in args.only:
                    out = Path(tmp) / f"{label}-{name}-{round_}.json"
                    metrics = _run(tree, name, args.quick, args.calls, out)
                    for metric, value in metrics.items():
                        figures[label][metric].append(value)
                    print(f"round {round_ + 1} {label} {name}: {metrics}", flush=True)
    rows = []
    for metric, base_values in figures["baseline"].items():
        new_values = figures["this tree"][metric]
        base_median, new_median = statistics.median(base_values), statistics.median(new_values)
        rows.append(
            [
                metric,
                round(base_median, 2),
                f"{min(base_values):.2f}–{max(base_values):.2f}",
                round(new_median, 2),
                f"{min(new_values):.2f}–{max(new_values):.2f}",
                round(new_median / base_median, 3) if base_median else float("nan"),
            ]
        )
    print_table(
        f"A/B, {args.rounds} alternating rounds: this tree against {args.baseline}",
        ["figure", "baseline median", "baseline rounds", "this tree median", "rounds", "ratio"],
        rows,
    )
    if args.json:
        args.json.write_text(json.dumps({k: dict(v) for k, v in figures.items()}, indent=2))


if __name__ == "__main__":
    main()
