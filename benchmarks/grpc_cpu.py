"""Server CPU per frame through each raw inference door, one version of the code against another.

    .venv/bin/python -m benchmarks.grpc_cpu [TREE ...] [--rounds 6] [--requests 40]

Each TREE, a git revision (archived into a temporary folder) or a folder holding a
lipstream source tree (none given: this checkout), is served by a ``lipstream serve`` of
its own (``benchmarks/protocols.py``'s, its code put first on ``PYTHONPATH``) on the
demo lip-sync model, one CPU device. One client here sends ``FRAMES_PER_REQUEST`` float
frames a request (2.5 MB a frame in, 1.2 MB out) back to back through a door,
``--requests`` requests a segment; the server process's CPU over the segment (user +
system, all its threads, ``/proc/<pid>/stat``) divided by the frames it served is the
segment's figure. Segments alternate over trees and doors, round after round, with the
trees' order rotating, so every version sees the same machine; the figure is the median
of the rounds. ``/v1/infer`` and the protocol's REST door are measured alongside, as the
reference the gRPC doors compare with. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import Result, print_table
from benchmarks.protocols import (
    DOORS,
    FRAMES_PER_REQUEST,
    MODEL_ID,
    Doors,
    RawRunner,
    _inputs,
    serve,
)
from inference_core.assets.demo_avatar import write_demo_avatar

REPO = Path(__file__).resolve().parent.parent
#: Enough frames that the CPU clock's 10 ms ticks stay under 1% of a segment.
BATCH = 8


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def source_tree(tree: str, scratch: Path) -> Path:
    """The folder ``tree`` names, or revision ``tree`` of this repository archived."""
    if Path(tree).is_dir():
        return Path(tree).resolve()
    out = scratch / f"tree-{len(list(scratch.iterdir()))}"
    out.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", tree], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


async def measure(trees: list[str], rounds: int, requests: int, scratch: Path) -> Result:
    """Each door's server CPU ms per frame, per tree: medians and every round's."""
    visual, audio = _inputs(FRAMES_PER_REQUEST, np.random.default_rng(1))
    per_round: dict[str, dict[str, list[float]]] = {t: {d: [] for d in DOORS} for t in trees}
    async with contextlib.AsyncExitStack() as stack:
        servers: dict[str, tuple[int, Doors]] = {}
        for tree in trees:
            root = scratch / f"served-{len(servers)}"
            package = write_demo_avatar(root / "avatars" / MODEL_ID, count=2)
            raw = RawRunner(package / "lipsync.onnx")
            served = await stack.enter_async_context(serve(root, BATCH, source_tree(tree, scratch)))
            doors = Doors(served, root / "stubs", (raw.visual_name, raw.audio_name))
            stack.push_async_callback(doors.close)
            for door in DOORS:  # warm every door
                for _ in range(3):
                    await doors.request(door)(visual, audio)
            servers[tree] = (served.proc.pid, doors)
        for i in range(rounds):
            order = trees[i % len(trees) :] + trees[: i % len(trees)]
            for door in DOORS:
                for tree in order:
                    pid, doors = servers[tree]
                    request = doors.request(door)
                    frames, cpu = 0, process_cpu(pid)
                    for _ in range(requests):
                        frames += await request(visual, audio)
                    per_round[tree][door].append((process_cpu(pid) - cpu) * 1000 / frames)
    return {
        tree: {
            door: {"ms_per_frame": statistics.median(values), "rounds": values}
            for door, values in doors_figures.items()
        }
        for tree, doors_figures in per_round.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trees", nargs="*", help="git revisions or source folders")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    trees = args.trees or [str(REPO)]
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(trees, args.rounds, args.requests, Path(tmp)))
    rows = [
        [
            door,
            tree,
            f"**{figures[door]['ms_per_frame']:.2f}**",
            f"{min(figures[door]['rounds']):.2f}–{max(figures[door]['rounds']):.2f}",
        ]
        for door in DOORS
        for tree, figures in result.items()
    ]
    print_table(
        f"Server CPU per frame ({args.rounds} rounds x {args.requests} requests of "
        f"{FRAMES_PER_REQUEST} float frames, demo model, one client)",
        ["door", "tree", "server CPU ms / frame (median)", "rounds"],
        rows,
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
