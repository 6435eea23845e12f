"""Soak: four calls and a viewer on one server for half an hour; does anything leak?

    .venv/bin/python -m benchmarks.soak [--minutes 30] [--slice-minutes 5] [--json out.json]
    .venv/bin/python -m benchmarks.run --only soak [--quick]

Peers' users report avatars that stop after 15 minutes to 2 hours of calls (OpenAvatarChat
#225, livekit/agents #2826): what a leak of tasks, threads, descriptors or memory does
slowly. This runs ``lipstream serve`` at its default settings in a process of its own
(``benchmarks/server_process.py``: the built-in demo avatar, made on first use; only
admission opened wide, as for every live benchmark) and, from this process
(``benchmarks/soak_calls.py``), two calls that speak every half minute (espeak-ng speech
as their microphones), two that listen (silent, but for an "okay" every 4 minutes that
keeps them within ``session.idle_timeout_s``) and one WHEP viewer of the first speaker.
At the start of every slice after the first (5 minutes; 1 in the
short version) one call is hung up and replaced by a new one, the viewer following the
call it watched; one more, the first speaker's once it has spoken, is the warm-up before
the first slice (:meth:`~benchmarks.soak_calls.Cast.warm_up`).

Per slice it prints the server's resident memory at the slice's end, and, sampled every
:data:`SAMPLE_S` from :data:`SETTLE_S` after the slice's replacement went live, its open
file descriptors, event loop tasks and threads (``/proc/<pid>`` and its ``/metrics``; the
fewest seen are what the calls hold, without the moments a request is being answered),
the video frames each call and the viewer received, the speakers' lip-sync (frames sent
with their face over the frames their speech gate sent, ``GET /sessions/{id}``), their
server-added delay and the server's part of microphone → heard (``added_delay_ms`` and
``caller_audio_ms``: p95 over their last 500 frames and chunks). Then whether each stayed
flat, held against :data:`BOUNDS` (the first slice is the steady state the others are
compared with); ``tests/test_soak.py`` asserts the same on the short version. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

import lipstream_client as lc
from benchmarks.common import Result, Target, print_table, print_targets
from benchmarks.server_process import ProcessReading, Served, read_process, serve_defaults
from benchmarks.soak_calls import Cast, SoakCall, make_speech
from benchmarks.whep_load import receiving
from config.settings import Settings
from streaming.webrtc.compat import loopback_only_ice

FPS = 25
SAMPLE_S = 5.0
#: Samples this soon after a slice's new call went live are not counted for descriptors,
#: tasks and threads: the call is still setting up (its codecs open on first use, its
#: set-up tasks end).
SETTLE_S = 10.0
MIB = 1 << 20
#: Why a frame may miss lip-sync on a machine too busy for real time (tests/live_calls.py).
LATENESS = frozenset({"late", "not_ready", "overload", "DeadlineExceededError", "QueueFullError"})


@dataclass(frozen=True)
class Bounds:
    """How far a slice may stray from the first before the soak calls it a leak.

    Descriptors, tasks and threads are each slice's fewest (module doc) over the first
    slice's; a leak only adds. A call the server does not give back leaves what a live
    call holds: some 15 event loop tasks (its timeline, link, audio receiver, watchdogs,
    ...), 4 threads (its codecs' filter graphs: what this soak found), its ICE socket (one
    descriptor, ICE on 127.0.0.1) and, if it spoke, some 12 MiB of x264 state. So:

    - ``tasks`` 2: a leaked call's tasks exceed it at once; one task leaked per call
      shows by the third replacement (the full version has five);
    - ``threads`` 1: a leaked call's codecs exceed it at once;
    - ``fds`` 1: a socket leaked per call exceeds it by the second replacement (the short
      version has two);
    - ``rss_growth_mib`` 64, from the first slice's end to the last's: the first few
      replacements of a speaker step RSS up by up to 30 MiB each and then it levels
      (glibc raises its mmap threshold once x264's buffers are freed, so later ones come
      from heaps it keeps; with ``MALLOC_MMAP_THRESHOLD_=131072`` the same calls hold
      RSS level within 430-455 MiB). So 3 minutes cannot tell that from a leaked call's
      12 MiB (the counts above catch that at once); what exceeds it there is a leak of
      5.6 KB per frame sent (12,000 frames in the two minutes), and in the full version
      a leaked speaking call per replacement or 450 bytes per frame (150,000 frames);
    - ``frames_per_call``: a call or viewer whose video stopped gets none in the last
      slice (counted, not a rate: a busy client decodes fewer than it is sent);
    - ``due_per_spoken``: the speech gate sent at least half as many frames to be
      lip-synced as the microphone spoke (a caller's audio that no longer reaches the
      timeline gives none), and some went out with their face, the rest dropped only
      for lateness (``tests/live_calls.py``: at the default margin a busy machine drops
      lip-sync rather than fall behind).
    """

    tasks: int = 2
    threads: int = 1
    fds: int = 1
    rss_growth_mib: float = 64.0
    frames_per_call: int = FPS  # video frames each call and the viewer get in the last slice
    due_per_spoken: float = 0.5  # speech-gate frames per frame of speech, speakers


BOUNDS = Bounds()


@dataclass
class CallSlice:
    """One call over one slice (from when the slice's replacement was live)."""

    role: str
    session_id: str
    new: bool  # called in this slice
    lost: bool  # its session ended before the slice did, and not by the soak
    frames: int
    spoken_frames: float
    due: int
    inferred: int
    faults: dict[str, int]
    added_p95_ms: float | None
    mic_p95_ms: float | None


@dataclass
class Slice:
    index: int
    start_s: float  # since the first slice began
    end_s: float
    replaced: str  # the role of the call replaced at its start ("" for the first)
    lost: int  # calls found ended by the server at its start, and called again
    readings: list[ProcessReading]
    settled: list[ProcessReading]  # those :data:`SETTLE_S` or more after its call was live
    calls: list[CallSlice]
    viewer_frames: int
    refusals: int  # offers refused for room, retried, so far

    def fewest(self, name: str) -> int:
        return min(int(getattr(r, name)) for r in self.settled)

    def most(self, name: str) -> int:
        return max(int(getattr(r, name)) for r in self.settled)


@dataclass
class SoakRun:
    minutes: float
    slice_s: float
    before: ProcessReading  # the server before its first call
    slices: list[Slice] = field(default_factory=list)
    after: ProcessReading | None = None  # once every call and viewer ended
    exit_status: int | None = None
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _counters(calls: list[SoakCall]) -> dict[str, dict[str, Any] | None]:
    """Each call's ``GET /sessions/{id}``; None for one whose session has ended."""
    states: dict[str, dict[str, Any] | None] = {}
    for call in calls:
        try:
            states[call.session_id] = await call.state()
        except lc.SessionNotFound:
            states[call.session_id] = None
    return states


def _call_slice(
    call: SoakCall,
    new: bool,
    start: float,
    end: float,
    s0: dict[str, Any] | None,
    s1: dict[str, Any] | None,
) -> CallSlice:
    frames = call.frames_between(start, end)
    if s0 is None or s1 is None:  # the server ended it: its counters are gone
        return CallSlice(call.role, call.session_id, new, True, frames, 0.0, 0, 0, {}, None, None)
    drops = {r: n - s0["frames_dropped"].get(r, 0) for r, n in s1["frames_dropped"].items()}
    inferred = s1["frames_inferred"] - s0["frames_inferred"]
    mic = s1["caller_audio_ms"]
    return CallSlice(
        role=call.role,
        session_id=call.session_id,
        new=new,
        lost=False,
        frames=frames,
        spoken_frames=call.spoken_s(start, end) * FPS,
        due=inferred + sum(drops.values()),
        inferred=inferred,
        faults={r: n for r, n in drops.items() if n and r not in LATENESS},
        added_p95_ms=s1["added_delay_ms"]["p95"] if call.speaks else None,
        mic_p95_ms=mic["p95"] if call.speaks and mic else None,
    )


async def _slice(
    index: int,
    cast: Cast,
    served: Served,
    http: aiohttp.ClientSession,
    t0: float,
    slice_s: float,
) -> Slice:
    """One slice: the replacement (after the first), samples until its end, counters."""
    start = time.monotonic()
    replaced = ""
    new: SoakCall | None = None
    lost = await cast.replace_lost()
    if index > 0:
        new = await cast.replace()
        replaced = new.role
    live = time.monotonic()
    before = await _counters(cast.calls)
    viewer_before = cast.viewer.frames
    readings, settled = [], []
    while True:
        readings.append(await read_process(served, http))
        if time.monotonic() - live >= SETTLE_S:
            settled.append(readings[-1])
        left_s = start + slice_s - time.monotonic()
        if left_s <= 0:
            break
        await asyncio.sleep(min(SAMPLE_S, left_s))  # the sampling schedule, a workload
    end = time.monotonic()
    after = await _counters(cast.calls)
    return Slice(
        index=index + 1,
        start_s=start - t0,
        end_s=end - t0,
        replaced=replaced,
        lost=lost,
        readings=readings,
        settled=settled or readings[-1:],
        calls=[
            _call_slice(c, c is new, live, end, before[c.session_id], after[c.session_id])
            for c in cast.calls
        ],
        viewer_frames=cast.viewer.frames - viewer_before,
        refusals=cast.refusals,
    )


async def soak(
    root: Path,
    minutes: float,
    slice_minutes: float,
    on_slice: Callable[[Slice], None] | None = None,
) -> SoakRun:
    """Run the soak (module doc) for ``minutes`` in slices of ``slice_minutes``, the
    server's files under ``root``; ``on_slice`` hears each slice as it ends."""
    # No REMB from the calls and the viewer: aiortc's estimate, in a client process this
    # busy, reads its own delays as congestion and would step them down the quality ladder.
    with receiving(remb=False):
        return await _soak(root, minutes, slice_minutes, on_slice)


async def _soak(
    root: Path, minutes: float, slice_minutes: float, on_slice: Callable[[Slice], None] | None
) -> SoakRun:
    speech = await make_speech()
    keepalive_s = 0.8 * Settings().session.idle_timeout_s
    slices = max(1, round(minutes / slice_minutes))
    # No connection kept alive: each would hold a descriptor and a task on the server.
    probe = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    calls = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    async with probe, calls, serve_defaults(root) as served:
        run = SoakRun(minutes, slice_minutes * 60, await read_process(served, probe))
        viewers = aiohttp.ClientSession(
            base_url=served.url, connector=aiohttp.TCPConnector(force_close=True)
        )
        async with viewers:
            cast = Cast(lc.Client(served.url, session=calls), viewers, speech, keepalive_s)
            await _slices(run, cast, served, probe, slices, on_slice)
        run.after = await _once_ended(served, probe)
    run.exit_status = served.proc.returncode
    run.warnings, run.errors = served.log_lines("warning"), served.log_lines("error")
    return run


async def _slices(
    run: SoakRun,
    cast: Cast,
    served: Served,
    http: aiohttp.ClientSession,
    slices: int,
    on_slice: Callable[[Slice], None] | None,
) -> None:
    """Open the cast, run ``slices`` slices, hang up."""
    try:
        await cast.open()
        await cast.warm_up()
        t0 = time.monotonic()
        for index in range(slices):
            run.slices.append(await _slice(index, cast, served, http, t0, run.slice_s))
            if on_slice is not None:
                on_slice(run.slices[-1])
    finally:
        await cast.close()


async def _once_ended(served: Served, http: aiohttp.ClientSession) -> ProcessReading:
    """The server's reading once it has no session and no viewer left (60 s at most)."""
    async with asyncio.timeout(60):
        while True:
            reading = await read_process(served, http)
            if not reading.sessions and not reading.viewers:
                return reading
            await asyncio.sleep(0.5)  # polling the server: its ends have no event here


def targets(run: SoakRun, bounds: Bounds = BOUNDS) -> list[Target]:
    """The flatness checks of ``run`` (module doc), each a :class:`Target`."""
    first, last = run.slices[0], run.slices[-1]
    later = run.slices[1:] or run.slices
    out = [
        Target(
            f"{name} after each replacement, most over the first slice's",
            max(s.fewest(name) for s in later) - first.fewest(name),
            slack,
            higher_is_better=False,
        )
        for name, slack in (
            ("tasks", bounds.tasks),
            ("threads", bounds.threads),
            ("fds", bounds.fds),
        )
    ]
    out.append(
        Target(
            "RSS growth, first slice's end to the last's",
            (last.readings[-1].rss_bytes - first.readings[-1].rss_bytes) / MIB,
            bounds.rss_growth_mib,
            higher_is_better=False,
            unit=" MiB",
        )
    )
    out.append(
        Target(
            "video frames, the call that got fewest in the last slice",
            min(c.frames for c in last.calls),
            bounds.frames_per_call,
            higher_is_better=True,
        )
    )
    out.append(
        Target(
            "viewer's frames in the last slice", last.viewer_frames, bounds.frames_per_call, True
        )
    )
    speakers = [c for c in last.calls if c.role == "speaker" and not c.lost]
    out.append(
        Target(
            "speakers' frames due to lip-sync per frame spoken, last slice (fewest)",
            min((c.due / max(c.spoken_frames, 1.0) for c in speakers), default=0.0),
            bounds.due_per_spoken,
            higher_is_better=True,
        )
    )
    out.append(
        Target(
            "speakers' frames sent with their face, last slice (fewest)",
            min((c.inferred for c in speakers), default=0),
            1,
            higher_is_better=True,
        )
    )
    ended = run.after if run.after is not None else last.readings[-1]
    out.append(
        Target(
            "sessions the server ended itself (a watchdog, a failed stage), whole run",
            ended.ended_by_server,
            0,
            higher_is_better=False,
        )
    )
    out.append(
        Target(
            "frames dropped for a fault (not lateness), last slice",
            sum(sum(c.faults.values()) for c in last.calls),
            0,
            higher_is_better=False,
        )
    )
    return out


def _range(s: Slice, name: str) -> str:
    low, high = s.fewest(name), s.most(name)
    return str(low) if low == high else f"{low}–{high}"


def _ms(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{max(known):.0f}" if known else "–"


def slice_row(s: Slice) -> list[object]:
    speakers = [c for c in s.calls if c.role == "speaker"]
    lip = min((c.inferred / c.due if c.due else 0.0 for c in speakers if not c.lost), default=0.0)
    return [
        s.index,
        f"{s.start_s / 60:.1f}–{s.end_s / 60:.1f}",
        s.replaced or "–",
        f"{s.readings[-1].rss_bytes / MIB:.0f}",
        f"{s.readings[-1].cache_bytes / MIB:.0f}",
        _range(s, "fds"),
        _range(s, "tasks"),
        _range(s, "threads"),
        min(c.frames for c in s.calls),
        s.viewer_frames,
        f"{lip:.2f}",
        _ms([c.added_p95_ms for c in speakers]),
        _ms([c.mic_p95_ms for c in speakers]),
        s.refusals,
        s.readings[-1].ended_by_server,
    ]


HEADER = [
    "slice",
    "minutes",
    "replaced",
    "RSS MiB",
    "caches MiB",
    "fds",
    "tasks",
    "threads",
    "frames (fewest call)",
    "viewer frames",
    "lip-synced (worst speaker)",
    "added p95 ms",
    "mic→sent p95 ms",
    "refused offers",
    "ended by the server",
]


def _reading(r: ProcessReading) -> str:
    return f"RSS {r.rss_bytes / MIB:.0f} MiB, {r.fds} fds, {r.tasks} tasks, {r.threads} threads"


def report(run: SoakRun) -> list[Target]:
    """Print the run's table and its verdicts; return the targets."""
    print_table(
        f"Soak: 2 speaking + 2 listening calls and 1 viewer, one call replaced every "
        f"{run.slice_s / 60:g} min, {len(run.slices)} slices (fds, tasks, threads: fewest–most "
        f"sampled every {SAMPLE_S:g} s from {SETTLE_S:g} s after the slice's new call was live; "
        "RSS and caches at its end)",
        HEADER,
        [slice_row(s) for s in run.slices],
    )
    rss = [
        f"{r.rss_bytes / MIB:.0f}" for s in run.slices for r in s.readings[:: round(60 / SAMPLE_S)]
    ]
    print(f"\n  RSS every minute (MiB): {' '.join(rss)}")
    print(f"  before the first call: {_reading(run.before)}")
    if run.after is not None:
        print(f"  after every call ended: {_reading(run.after)}")
        print(f"  sessions ended, by reason: {run.after.ended}")
    print(
        f"  server exit status {run.exit_status}; its log: {len(run.warnings)} warnings, "
        f"{len(run.errors)} errors"
    )
    for line in run.errors[:5]:
        print(f"    {line[:300]}")
    found = targets(run)
    print_targets(found)
    return found


def as_json(run: SoakRun, found: list[Target]) -> Result:
    return {
        "minutes": run.minutes,
        "slice_s": run.slice_s,
        "before": asdict(run.before),
        "after": asdict(run.after) if run.after is not None else None,
        "slices": [asdict(s) for s in run.slices],
        "exit_status": run.exit_status,
        "warnings": len(run.warnings),
        "errors": run.errors,
        "targets": [t.as_json() for t in found],
    }


def measure(minutes: float, slice_minutes: float, root: Path | None = None) -> SoakRun:
    """The soak with the server's files (its log among them) in ``root``, or in a
    temporary folder; prints a line as each slice ends."""

    def progress(s: Slice) -> None:
        print(f"  slice {s.index} done at {s.end_s / 60:.1f} min: {_reading(s.readings[-1])}")

    with tempfile.TemporaryDirectory() as tmp, loopback_only_ice():
        folder = root or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        return asyncio.run(soak(folder, minutes, slice_minutes, progress))


def run(quick: bool = False) -> Result:
    """``benchmarks.run``'s entry: 30 minutes, or 3 with ``quick``."""
    minutes, slice_minutes = (3.0, 1.0) if quick else (30.0, 5.0)
    soaked = measure(minutes, slice_minutes)
    return as_json(soaked, report(soaked))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument(
        "--slice-minutes",
        type=float,
        help="one call replaced per slice (default 5; 1 for runs under 10 minutes)",
    )
    parser.add_argument("--json", type=Path, help="write the result to this file")
    parser.add_argument(
        "--dir", type=Path, help="keep the server's files here (server.log), not in a temp folder"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # A busy client's decoder complaining of a frame it lost is the client's: frames are
    # counted as they arrive either way.
    logging.getLogger("aiortc.rtcrtpreceiver").setLevel(logging.ERROR)
    slice_minutes = args.slice_minutes or (5.0 if args.minutes >= 10 else 1.0)
    soaked = measure(args.minutes, slice_minutes, args.dir)
    result = as_json(soaked, report(soaked))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
