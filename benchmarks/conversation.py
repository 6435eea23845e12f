"""Conversational calls: what a caller who mostly listens costs, with shared idle loops on and off.

    .venv/bin/python -m benchmarks.run --only conversation [--quick]
    .venv/bin/python -m benchmarks.conversation [--quick] [--calls K] [--minutes M] [--rounds R]

K 1280×720 calls, each following the seeds' conversational pattern: the caller's
microphone (``benchmarks.webrtc_load``'s :class:`~benchmarks.webrtc_load.ConversationMicrophone`)
sends the bundled speech sample for 4 s, then digital silence for 11 s, over and over,
each call from a random point of that 15 s cycle (the same points in the sharing-on and
the sharing-off round of a pair). Two scenarios: all K calls on the demo avatar, and one
call on each of K demo avatars drawn with different seeds. Each is run with
``video.shared_idle`` on and off in alternating rounds (on, off, on, off ...), a fresh
server each round, in this process pinned to half of the cores, the load client in
another process on the other half (:func:`~benchmarks.live_server.split_cpus`). A round
waits ``warmup`` seconds after every call sends frames (the shared loops are built in the
background on first use: a one-off per avatar, not a call's cost), then measures a
window:

* **server CPU per call**: this process's user + system CPU seconds (``/proc``) per
  call-second of the window; **calls per server core** = 1 / that, counted only when the
  round kept every call at ≥ 24 fps received, ≥ 99 % of its speaking frames lip-synced
  (frames inferred ÷ (inferred + dropped for any reason): the frames the speech gate
  wanted inferred, ``benchmarks.margin``'s measure) and its added delay not growing (p95
  of the last third of the window within 20 ms of the first third's);
* **bytes per second per call** the client received (its transport's count: video,
  audio and RTCP), the **longest gap** between two frames a call decoded (a freeze shows
  here, not in fps), and the **share of frames sent from shared loops**
  (``SessionStats.frames_shared`` ÷ frames sent).

Then one call listening only (silence throughout) and one speaking only (the sample
throughout), sharing on and off: server CPU per frame sent, and listening ÷ speaking. And
``benchmarks.voice_agent``'s first streamed chunk → first lip-synced frame and barge-in,
sharing on and off in the same alternating rounds. Targets (issue 26): listening ÷
speaking CPU per frame ≤ 0.25 with sharing on; calls per core on ≥ 2 × off in each
scenario; both latency p95s within 5 ms of sharing off. Figures are ratios from one run:
the machine is shared and noisy. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import operator
import statistics
import tempfile
import time
from dataclasses import asdict, astuple, dataclass
from pathlib import Path
from typing import Any

from benchmarks import voice_agent
from benchmarks.common import Result, Target, percentiles, print_table, print_targets
from benchmarks.live_server import (
    client_result,
    cpu_seconds,
    live_server,
    pinned,
    run_as_served,
    split_cpus,
    start_load,
    wait_for_calls,
    write_speech,
)
from inference_core.assets.demo_avatar import write_demo_avatar
from streaming.live.session import Session

SPEAK_S, LISTEN_S = 4.0, 11.0
SIZE = (1280, 720)
MIN_FPS = 24.0
MIN_LIP_SYNCED = 0.99
GROWTH_MS = 20.0
MIN_THIRD = 10  # a call's frames in a third below which its p95 is not compared
SAMPLE_EVERY_S = 1.0
LISTEN_RATIO = 0.25
CALLS_RATIO = 2.0
LATENCY_MS = 5.0
SHARING = (True, False)


@dataclass(frozen=True)
class Plan:
    """How long and how often: the full run's, or ``--quick``'s."""

    calls: int
    window_s: float  # a conversational round's measured window
    warmup_s: float
    rounds: int  # each one sharing on, then off
    duty_window_s: float  # the listening-only and speaking-only windows
    utterances: int  # voice_agent's, per round and setting


FULL = Plan(calls=4, window_s=180.0, warmup_s=20.0, rounds=2, duty_window_s=20.0, utterances=10)
QUICK = Plan(calls=4, window_s=24.0, warmup_s=5.0, rounds=1, duty_window_s=6.0, utterances=2)


@dataclass(frozen=True)
class _Counts:
    sent: int
    inferred: int
    dropped: int
    shared: int
    encoded: int

    @classmethod
    def of(cls, session: Session) -> _Counts:
        stats = session.stats
        return cls(
            session.frames_sent,
            stats.frames_inferred,
            sum(stats.frames_dropped.values()),
            stats.frames_shared,
            stats.frames_encoded,
        )

    def __add__(self, other: _Counts) -> _Counts:
        return _Counts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __sub__(self, other: _Counts) -> _Counts:
        return _Counts(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))


class _Delays:
    """Each call's added delay (audio complete → frame ready) per frame, with when it was
    seen: the render path appends one to ``processing_ms`` per frame inferred, so the
    newest ``frames_inferred`` delta of them are the frames since the last sample."""

    def __init__(self, sessions: list[Session]) -> None:
        self._sessions = sessions
        self._seen = [s.stats.frames_inferred for s in sessions]
        self.values: dict[str, list[tuple[float, float]]] = {s.session_id: [] for s in sessions}

    def sample(self) -> None:
        now = time.monotonic()
        for n, session in enumerate(self._sessions):
            stats = session.stats
            new = min(stats.frames_inferred - self._seen[n], len(stats.processing_ms))
            self._seen[n] = stats.frames_inferred
            if new > 0:
                recent = list(stats.processing_ms)[-new:]
                self.values[session.session_id].extend((now, ms) for ms in recent)

    def growth_ms(self, t0: float, t1: float) -> float | None:
        """The largest rise, over calls, of the added delay's p95 from the window's first
        third to its last; all calls' frames together when no call spoke enough in both
        (short windows); None when they did not either."""
        third = (t1 - t0) / 3
        thirds = [
            (
                [ms for t, ms in values if t < t0 + third],
                [ms for t, ms in values if t >= t1 - third],
            )
            for values in self.values.values()
        ]
        pooled = ([ms for a, _ in thirds for ms in a], [ms for _, b in thirds for ms in b])
        enough = [(a, b) for a, b in thirds if min(len(a), len(b)) >= MIN_THIRD]
        if not enough and min(map(len, pooled)) >= MIN_THIRD:
            enough = [pooled]
        rises = [_p95(last) - _p95(first) for first, last in enough]
        return max(rises) if rises else None


def _p95(values: list[float]) -> float:
    return percentiles(values, (95,))[0]


def _fps_and_gap(times: list[float], t0: float, t1: float) -> tuple[float, float, float]:
    """Frames per second received in [t0, t1), the longest gap between frames (ms; the
    window's end counts as a frame, so a call whose frames stopped shows it) and when
    that gap began."""
    inside = [t for t in times if t0 <= t < t1]
    before = [t for t in times if t < t0][-1:] or [t0]
    gap, began = max((b - a, a) for a, b in itertools.pairwise([*before, *inside, t1]))
    return len(inside) / (t1 - t0), gap * 1000, began


def _bytes_per_s(samples: list[list[float]], t0: float, t1: float) -> float:
    """Bytes per second from the last sample at or before ``t0`` to the first at or after ``t1``."""
    before = [s for s in samples if s[0] <= t0]
    after = [s for s in samples if s[0] >= t1]
    start, end = (before or samples)[-1], (after or samples[-1:])[0]
    return (end[1] - start[1]) / (end[0] - start[0]) if end[0] > start[0] else 0.0


@dataclass(frozen=True)
class _CallFigures:
    """What one call's client saw in the window [t0, t1)."""

    fps: float
    bytes_per_s: float
    gap_ms: float  # the longest gap between two frames decoded
    gap_at_cycle_s: float | None  # where in its speak/listen cycle that gap began
    gap_bytes_per_s: float  # bytes still arriving meanwhile: what came was not decoded

    @classmethod
    def of(
        cls, load: Result, n: int, pattern: tuple[float, float], t0: float, t1: float
    ) -> _CallFigures:
        """Call ``n`` of the load client's result (its ``--timeline``)."""
        samples = load["bytes_received"][n]
        fps, gap_ms, began = _fps_and_gap(load["video_times"][n], t0, t1)
        mic_at = load["microphone_started"][n]
        at = None if mic_at is None else (began - mic_at + load["phases_s"][n]) % sum(pattern)
        return cls(
            fps,
            _bytes_per_s(samples, t0, t1),
            gap_ms,
            at,
            _bytes_per_s(samples, began, began + gap_ms / 1000),
        )


def _dropped_since(sessions: list[Session], before: list[dict[str, int]]) -> dict[str, int]:
    """Frames dropped by reason (``SessionStats.frames_dropped``) since ``before``."""
    dropped: dict[str, int] = {}
    for session, counted in zip(sessions, before, strict=True):
        for reason, n in session.stats.frames_dropped.items():
            if n > counted.get(reason, 0):
                dropped[reason] = dropped.get(reason, 0) + n - counted.get(reason, 0)
    return dropped


async def _round(
    root: Path,
    avatars: list[str],
    calls: int,
    pattern: tuple[float, float],
    *,
    shared: bool,
    seed: int,
    window_s: float,
    warmup_s: float,
    client_cpus: set[int],
) -> Result:
    """One round: a fresh server with ``video.shared_idle`` = ``shared``, ``calls`` calls
    following ``pattern`` from a load client on ``client_cpus``; the window's figures."""
    settings: dict[str, object] = {"video": {"shared_idle": shared}}
    async with live_server(root, settings) as (app, url):
        client = await start_load(
            url,
            calls=calls,
            seconds=warmup_s + window_s + 3.0,  # its window holds the server's
            speech=root / "speech.wav",
            avatar=avatars,
            cpus=client_cpus,
            pattern=pattern,
            seed=seed,
            timeline=True,
        )
        sessions = await wait_for_calls(app, calls, lambda s: s.frames_sent > 0)
        await asyncio.sleep(warmup_s)
        before = [_Counts.of(s) for s in sessions]
        before_dropped = [dict(s.stats.frames_dropped) for s in sessions]
        delays = _Delays(sessions)
        cpu0, t0 = cpu_seconds(), time.monotonic()
        while time.monotonic() < t0 + window_s:
            await asyncio.sleep(SAMPLE_EVERY_S)
            delays.sample()
        cpu, t1 = cpu_seconds() - cpu0, time.monotonic()
        ended = [s.end_reason for s in sessions if s.closed]
        dropped = _dropped_since(sessions, before_dropped)
        counts = {s.session_id: _Counts.of(s) - b for s, b in zip(sessions, before, strict=True)}
        out, _ = await client.communicate()
        load = client_result(out, client.returncode)
    calls_seen = [_CallFigures.of(load, n, pattern, t0, t1) for n in range(calls)]
    lip = []
    for sid in load["session_ids"]:
        wanted = counts[sid].inferred + counts[sid].dropped
        lip.append(counts[sid].inferred / wanted if wanted else 1.0)
    fps = [c.fps for c in calls_seen]
    worst = max(calls_seen, key=lambda c: c.gap_ms)
    total = functools.reduce(operator.add, counts.values())
    growth = delays.growth_ms(t0, t1)
    valid = (
        not ended
        and min(fps) >= MIN_FPS
        and min(lip) >= MIN_LIP_SYNCED
        and (growth or 0.0) <= GROWTH_MS
    )
    window = t1 - t0
    return {
        "shared_idle": shared,
        "calls": calls,
        "window_s": window,
        "server_cpu_s": cpu,
        "cpu_per_call_s": cpu / (window * calls),
        "cpu_ms_per_frame": cpu * 1000 / total.sent if total.sent else float("nan"),
        "min_fps": min(fps),
        "max_gap_ms": worst.gap_ms,
        "max_gap_at_cycle_s": worst.gap_at_cycle_s,
        "max_gap_bytes_per_s": worst.gap_bytes_per_s,
        "min_lip_synced": min(lip),
        "speaking_share": (total.inferred + total.dropped) / total.sent if total.sent else 0.0,
        "delay_growth_ms": growth,
        "bytes_per_s_per_call": statistics.mean(c.bytes_per_s for c in calls_seen),
        "shared_share": total.shared / total.sent if total.sent else 0.0,
        "frames": asdict(total),
        "dropped": dropped,
        "ended": ended,
        "valid": valid,
    }


def _pinned_round(
    root: Path, avatars: list[str], calls: int, pattern: tuple[float, float], **kw: Any
) -> Result:
    server_cpus, client_cpus = split_cpus()
    with pinned(server_cpus):
        return run_as_served(_round(root, avatars, calls, pattern, client_cpus=client_cpus, **kw))


def _pooled(rounds: list[Result]) -> Result:
    """Rounds of one configuration together: CPU over all their call-seconds, the worst
    call of any round, and calls per core only if every round was valid."""
    cpu = sum(r["server_cpu_s"] for r in rounds)
    call_s = sum(r["window_s"] * r["calls"] for r in rounds)
    sent = sum(r["frames"]["sent"] for r in rounds)
    valid = all(r["valid"] for r in rounds)
    growths = [r["delay_growth_ms"] for r in rounds if r["delay_growth_ms"] is not None]
    return {
        "rounds": len(rounds),
        "cpu_per_call_s": cpu / call_s,
        "calls_per_core": call_s / cpu if valid else float("nan"),
        "cpu_ms_per_frame": cpu * 1000 / sent if sent else float("nan"),
        "min_fps": min(r["min_fps"] for r in rounds),
        "max_gap_ms": max(r["max_gap_ms"] for r in rounds),
        "min_lip_synced": min(r["min_lip_synced"] for r in rounds),
        "delay_growth_ms": max(growths) if growths else None,
        "bytes_per_s_per_call": statistics.mean(r["bytes_per_s_per_call"] for r in rounds),
        "shared_share": sum(r["frames"]["shared"] for r in rounds) / sent if sent else 0.0,
        "valid": valid,
    }


def _measure(root: Path, plan: Plan) -> Result:
    """Every round, in order: per round, each scenario sharing on then off, the listening
    and speaking calls on then off, and voice_agent on then off."""
    names = ["demo", *(f"demo{n}" for n in range(2, plan.calls + 1))]
    for seed, name in enumerate(names):
        write_demo_avatar(root / "avatars" / name, size=SIZE, seed=seed)
    write_speech(root / "speech.wav", 30.0)
    scenarios = {"1 avatar": names[:1], f"{plan.calls} avatars, 1 call each": names}
    duties = {"listening": (0.0, SPEAK_S + LISTEN_S), "speaking": (SPEAK_S + LISTEN_S, 0.0)}
    conversational: list[Result] = []
    duty: list[Result] = []
    voice: dict[bool, list[Result]] = {shared: [] for shared in SHARING}
    timing = {"window_s": plan.window_s, "warmup_s": plan.warmup_s}
    for n in range(plan.rounds):
        for label, avatars in scenarios.items():
            for shared in SHARING:
                result = _pinned_round(
                    root, avatars, plan.calls, (SPEAK_S, LISTEN_S), shared=shared, seed=n, **timing
                )
                conversational.append({"scenario": label, "round": n + 1, **result})
        for mode, pattern in duties.items():
            for shared in SHARING:
                result = _pinned_round(
                    root,
                    names[:1],
                    1,
                    pattern,
                    shared=shared,
                    seed=n,
                    window_s=plan.duty_window_s,
                    warmup_s=plan.warmup_s,
                )
                duty.append({"mode": mode, "round": n + 1, **result})
        for shared in SHARING:
            settings: dict[str, object] = {"video": {"shared_idle": shared}}
            measured = voice_agent.measure(root / "voice", plan.utterances, settings)
            voice[shared].append(run_as_served(measured))
    return {
        "scenarios": list(scenarios),
        "conversational": conversational,
        "duty": duty,
        "voice": {"on" if k else "off": v for k, v in voice.items()},
    }


def _on(shared: bool) -> str:
    return "on" if shared else "off"


def _report(measured: Result, plan: Plan) -> list[Target]:
    """Print the tables; the targets."""
    conversational, duty = measured["conversational"], measured["duty"]
    print_table(
        f"Conversational calls, per round ({plan.calls} calls at 720p, speak {SPEAK_S:g} s / "
        f"listen {LISTEN_S:g} s from random phases, {plan.window_s:g} s window)",
        [
            "scenario",
            "round",
            "sharing",
            "server CPU s per call-s",
            "min fps",
            "longest gap ms",
            "min lip-synced",
            "speaking frames",
            "delay p95 rise ms",
            "kB/s per call",
            "shared frames",
            "valid",
        ],
        [
            [
                r["scenario"],
                r["round"],
                _on(r["shared_idle"]),
                r["cpu_per_call_s"],
                r["min_fps"],
                r["max_gap_ms"],
                f"{100 * r['min_lip_synced']:.1f}%",
                f"{100 * r['speaking_share']:.0f}%",
                "n/a" if r["delay_growth_ms"] is None else r["delay_growth_ms"],
                r["bytes_per_s_per_call"] / 1000,
                f"{100 * r['shared_share']:.1f}%",
                "yes" if r["valid"] else f"no ({len(r['ended'])} ended)" if r["ended"] else "no",
            ]
            for r in conversational
        ],
    )
    pooled: dict[str, dict[bool, Result]] = {
        label: {
            shared: _pooled(
                [r for r in conversational if r["scenario"] == label and r["shared_idle"] == shared]
            )
            for shared in SHARING
        }
        for label in measured["scenarios"]
    }
    rows = []
    for label, by in pooled.items():
        on, off = by[True], by[False]
        for shared, p in by.items():
            rows.append(
                [
                    label,
                    _on(shared),
                    p["cpu_per_call_s"],
                    p["calls_per_core"],
                    p["bytes_per_s_per_call"] / 1000,
                    f"{100 * p['shared_share']:.1f}%",
                ]
            )
        rows.append(
            [
                label,
                "**on / off**",
                on["cpu_per_call_s"] / off["cpu_per_call_s"],
                on["calls_per_core"] / off["calls_per_core"],
                on["bytes_per_s_per_call"] / off["bytes_per_s_per_call"],
                "",
            ]
        )
    print_table(
        "Conversational calls, rounds pooled (calls per core: n/a = nan unless every call "
        f"kept >= {MIN_FPS:g} fps, >= {100 * MIN_LIP_SYNCED:g}% lip-synced, delay p95 rise "
        f"<= {GROWTH_MS:g} ms)",
        [
            "scenario",
            "sharing",
            "server CPU s per call-s",
            "calls per server core",
            "kB/s per call",
            "shared frames",
        ],
        rows,
    )
    per_frame = {
        (mode, shared): _pooled(
            [r for r in duty if r["mode"] == mode and r["shared_idle"] == shared]
        )
        for mode in ("listening", "speaking")
        for shared in SHARING
    }
    ratio = {
        shared: per_frame["listening", shared]["cpu_ms_per_frame"]
        / per_frame["speaking", shared]["cpu_ms_per_frame"]
        for shared in SHARING
    }
    print_table(
        f"One 720p call listening only vs speaking only ({plan.duty_window_s:g} s windows): "
        "server CPU per frame sent",
        ["sharing", "listening ms", "speaking ms", "listening / speaking", "shared (listening)"],
        [
            [
                _on(shared),
                per_frame["listening", shared]["cpu_ms_per_frame"],
                per_frame["speaking", shared]["cpu_ms_per_frame"],
                ratio[shared],
                f"{100 * per_frame['listening', shared]['shared_share']:.1f}%",
            ]
            for shared in SHARING
        ],
    )
    voice = measured["voice"]
    latency: dict[str, tuple[float, float]] = {}
    rows = []
    for what, key in (
        ("first chunk streamed → first lip-synced frame sent", "stream"),
        ("interrupt sent → frames idle for good", "barge_in"),
    ):
        p95 = []
        for setting in ("on", "off"):
            values = [
                v
                for r in voice[setting]
                for v in (r["first_frame_ms"]["stream"] if key == "stream" else r["barge_in_ms"])
            ]
            p95.append(percentiles(values, (95,))[0])
        latency[key] = (p95[0], p95[1])
        rows.append([what, len(values), p95[0], p95[1], p95[0] - p95[1]])
    print_table(
        "Voice agent, sharing on and off in alternating rounds (p95 ms)",
        ["what", "n per setting", "on", "off", "on − off"],
        rows,
    )
    targets = [
        Target("listening / speaking CPU per frame, sharing on", ratio[True], LISTEN_RATIO, False)
    ]
    targets += [
        Target(
            f"calls per core on / off, {label}",
            by[True]["calls_per_core"] / by[False]["calls_per_core"],
            CALLS_RATIO,
            True,
        )
        for label, by in pooled.items()
    ]
    targets += [
        Target(f"{what} p95, on − off", on - off, LATENCY_MS, False, " ms")
        for what, (on, off) in (
            ("first chunk → lip-synced frame", latency["stream"]),
            ("barge-in", latency["barge_in"]),
        )
    ]
    print_targets(targets)
    measured["pooled"] = {
        label: {_on(shared): p for shared, p in by.items()} for label, by in pooled.items()
    }
    measured["listening_over_speaking"] = {_on(k): v for k, v in ratio.items()}
    measured["latency_p95_ms"] = {k: {"on": v[0], "off": v[1]} for k, v in latency.items()}
    return targets


def run(
    quick: bool = False,
    *,
    calls: int | None = None,
    minutes: float | None = None,
    rounds: int | None = None,
) -> Result:
    plan = QUICK if quick else FULL
    plan = Plan(
        calls=calls or plan.calls,
        window_s=minutes * 60 if minutes else plan.window_s,
        warmup_s=plan.warmup_s,
        rounds=rounds or plan.rounds,
        duty_window_s=plan.duty_window_s,
        utterances=plan.utterances,
    )
    with tempfile.TemporaryDirectory() as tmp:
        measured = _measure(Path(tmp), plan)
    targets = _report(measured, plan)
    return {**measured, "plan": plan.__dict__, "targets": [t.as_json() for t in targets]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short rounds, noisier figures")
    parser.add_argument("--calls", type=int, help="calls per round (K)")
    parser.add_argument("--minutes", type=float, help="each conversational round's window")
    parser.add_argument("--rounds", type=int, help="rounds, each sharing on then off")
    args = parser.parse_args()
    run(args.quick, calls=args.calls, minutes=args.minutes, rounds=args.rounds)


if __name__ == "__main__":
    main()
