"""One listening call, profiled end to end: where its CPU goes while the avatar is silent.

    .venv/bin/python -m benchmarks.listening_profile [--seconds 20] [--caller mic|none|browser]
    .venv/bin/python -m benchmarks.listening_profile --speaking
    .venv/bin/python -m benchmarks.listening_profile --ab BASE CANDIDATE [--rounds 3]

A real server runs in this process (:func:`benchmarks.live_server.live_server`, the demo
avatar at 1280×720) and one call is placed by the load client in another process
(``benchmarks.webrtc_load``). Its caller is silent: ``--caller mic`` (the default) sends
a silent WAV as its microphone, which reaches the server as Opus (decoded, not quite
digital zeros); ``--caller none`` sends no microphone, and the client pushes digital
silence over HTTP instead, as a call nobody speaks into; ``--caller browser`` places the
call from Debian's Chromium with the demo page's ``lipstream.js`` (a silent WAV as its
microphone; ``apt-get install -y chromium``), as a browser user's call costs the server
(Opus DTX both ways, transport-cc). ``--speaking`` sends the
bundled speech as the microphone: the speaking reference. The window starts once the
avatar's shared idle loops are built (their thread has been idle for a second), and
reads:

* the server process's CPU per video frame sent (``/proc/self/stat``);
* the CPU of each of its threads (``/proc/self/task/*/stat``), grouped by the Python
  thread's name with its number dropped (native threads by their ``comm``); CPU of
  threads that ended inside the window is the row "threads gone";
* the event loop's CPU per kind of callback: ``asyncio.Handle._run`` is wrapped for the
  window with two ``time.thread_time`` calls (about 1 µs per callback, counted in the
  callbacks' own rows). A task's steps are named by its coroutine, other callbacks by
  their function; "loop outside callbacks" is the loop thread's CPU not inside one
  (``epoll``, the scheduler);
* the stages of the timeline's job and the others a call runs
  (:func:`benchmarks.live_cpu.stage_cpu`), with their calls per frame.

``--ab BASE CANDIDATE`` runs this profile (this file, copied into each tree) in a
worktree of each commit, alternating the order every round, and prints each tree's
median per row (on a noisy 2-core VM, compare the ratio inside one run, not figures an
hour apart). Each tree's server runs on the event loop that tree's ``lipstream serve``
would (``--loop server``, the default; asyncio before ``server.event_loop``). Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.ab import _checkout
from benchmarks.chromium import caller_pages
from benchmarks.common import Result, print_table
from benchmarks.live_cpu import Patch, live_stages, stage_cpu
from benchmarks.live_server import (
    cpu_seconds,
    live_server,
    served_loop_factory,
    start_load,
    wait_for_calls,
    write_speech,
)
from inference_core.assets.demo_avatar import write_demo_avatar

SIZE = (1280, 720)
#: ``--caller browser``: the demo page's client library places the call in Chromium, its
#: microphone a silent WAV, and a muted video element plays what comes back.
BROWSER_CALL = """
async () => {
  const mic = await navigator.mediaDevices.getUserMedia({audio: {
    echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
  const {connect} = await import('/static/lipstream.js');
  const call = await connect({microphone: mic});
  const video = document.createElement('video');
  video.srcObject = call.stream; video.muted = true;
  document.body.appendChild(video);
  await video.play();
  window.__call = call;
}
"""
WARM_UP_S = 3.0
#: The thread that builds shared idle loops in the background (issue 26): the window
#: starts once it has been idle for a second.
BUILDER_THREAD = "lipstream-idle-loops"
TICKS = os.sysconf("SC_CLK_TCK")


def write_silence(path: Path, seconds: float) -> Path:
    """``seconds`` of digital silence as a 16 kHz mono WAV (the caller's microphone)."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(np.zeros(round(seconds * 16_000), dtype="<i2").tobytes())
    return path


# -- per thread ---------------------------------------------------------------------------


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of each thread of this process, by native id, with its
    name: the Python thread's without its number, else the kernel's ``comm``."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, float]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        tid = int(task.name)
        name = names.get(tid)
        label = re.sub(r"([-_]\d+)+$", "", name) if name else f"native: {comm}"
        if tid == os.getpid():
            label = "event loop (main)"
        out[tid] = (label, (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def thread_delta(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], process_s: float
) -> dict[str, float]:
    """CPU seconds per thread group between two :func:`thread_cpu` readings."""
    groups: defaultdict[str, float] = defaultdict(float)
    for tid, (label, cpu) in after.items():
        groups[label] += cpu - before.get(tid, (label, 0.0))[1]
    groups["threads gone"] = process_s - sum(groups.values())
    return dict(groups)


async def background_settled(label: str = BUILDER_THREAD, timeout_s: float = 240.0) -> float:
    """Wait until the threads named ``label`` used under 10 ms of CPU in a second (at
    once if there are none); the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        before = sum(cpu for name, cpu in thread_cpu().values() if name == label)
        await asyncio.sleep(1.0)
        if sum(cpu for name, cpu in thread_cpu().values() if name == label) - before < 0.01:
            break
    return time.monotonic() - start


@contextmanager
def chunk_levels() -> Iterator[dict[str, float]]:
    """The timeline's chunks while open: how many, how many were digital silence, and
    the largest sample."""
    from streaming.live.mixer import AudioMixer

    seen = {"chunks": 0.0, "zero": 0.0, "peak": 0.0}
    original = AudioMixer.next_chunk

    def next_chunk(mixer: AudioMixer) -> np.ndarray:
        chunk = original(mixer)
        peak = float(np.abs(chunk).max())
        seen["chunks"] += 1
        seen["zero"] += peak == 0.0
        seen["peak"] = max(seen["peak"], peak)
        return chunk

    AudioMixer.next_chunk = next_chunk  # type: ignore[method-assign, assignment]
    try:
        yield seen
    finally:
        AudioMixer.next_chunk = original  # type: ignore[method-assign]


# -- per loop callback ----------------------------------------------------------------------


def callback_kind(callback: Any) -> str:
    """A loop callback's kind: a task's coroutine, or the function called."""
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        return f"task {getattr(coro, '__qualname__', type(coro).__name__)}"
    func = getattr(callback, "func", callback)  # functools.partial
    return str(getattr(func, "__qualname__", type(func).__name__))


@contextmanager
def loop_callbacks() -> Iterator[tuple[defaultdict[str, float], defaultdict[str, int]]]:
    """CPU seconds and calls per callback kind on this thread's loop while open."""
    cost: defaultdict[str, float] = defaultdict(float)
    calls: defaultdict[str, int] = defaultdict(int)
    original = asyncio.Handle._run
    loop_thread = threading.get_ident()

    def run(handle: asyncio.Handle) -> None:
        if threading.get_ident() != loop_thread:
            original(handle)
            return
        start = time.thread_time()
        try:
            original(handle)
        finally:
            kind = callback_kind(handle._callback)  # type: ignore[attr-defined]
            cost[kind] += time.thread_time() - start
            calls[kind] += 1

    asyncio.Handle._run = run  # type: ignore[method-assign, assignment]
    try:
        yield cost, calls
    finally:
        asyncio.Handle._run = original  # type: ignore[method-assign]


# -- the stages ------------------------------------------------------------------------------


def listening_stages() -> list[Patch]:
    """The live stages, and the parts of the timeline's job split out."""
    from inference_core.features.encoder import AudioEncoder
    from inference_core.features.mel import StreamingMel
    from inference_core.features.stream import AudioFeatureStream
    from streaming.audio_in.resample import MonoResampler
    from streaming.live.mixer import AudioMixer
    from streaming.live.timeline import AudioTimeline
    from streaming.webrtc.tracks import OpusChunkEncoder

    stages = [p for p in live_stages() if p[0] is not AudioTimeline]
    return [
        *stages,
        (AudioMixer, "next_chunk", "job: mixer chunk (on the loop)"),
        (AudioTimeline, "_process_chunks", "job: the rest (gate, hand-back)"),
        (OpusChunkEncoder, "encode", "job: Opus encode"),
        (MonoResampler, "push", "job: resample to 16 kHz"),
        (AudioFeatureStream, "push", "job: features, rest"),
        (StreamingMel, "push", "job: features, mel"),
        (AudioEncoder, "encode", "job: features, audio encoder ONNX"),
    ]


# -- one run ---------------------------------------------------------------------------------


async def _profile(root: Path, seconds: float, speaking: bool, caller: str) -> Result:
    audio = root / "caller.wav"
    settle_s = 240.0  # the load client keeps its call this much longer
    if speaking:
        write_speech(audio, seconds + settle_s + 20)
    elif caller in ("mic", "browser"):
        write_silence(audio, seconds + settle_s + 20)
    else:  # pushed once: a second of zeros, then nothing (the timeline fills in zeros)
        write_silence(audio, 1.0)
    async with contextlib.AsyncExitStack() as stack:
        app, url = await stack.enter_async_context(live_server(root))
        if caller == "browser":
            client = None
            (page,) = await stack.enter_async_context(caller_pages(audio, 1))
            await page.goto(url + "/")
            await page.evaluate(BROWSER_CALL)
        else:
            client = await start_load(
                url,
                calls=1,
                seconds=seconds + settle_s,
                speech=audio,
                microphone=speaking or caller == "mic",
            )
        (session,) = await wait_for_calls(app, 1, lambda s: s.frames_sent > 0)
        await asyncio.sleep(WARM_UP_S)
        waited = await background_settled(timeout_s=settle_s - seconds)
        stage_calls: defaultdict[str, int] = defaultdict(int)
        sent0, inferred0 = session.frames_sent, session.stats.frames_inferred
        with (
            chunk_levels() as levels,
            stage_cpu(listening_stages(), stage_calls) as stages,
            loop_callbacks() as (callbacks, callback_calls),
        ):
            threads0, cpu0, t0 = thread_cpu(), cpu_seconds(), time.monotonic()
            await asyncio.sleep(seconds * 0.7)
            threads1, cpu1, t1 = thread_cpu(), cpu_seconds(), time.monotonic()
            stage_s, stage_n = dict(stages), dict(stage_calls)
            loop_s, loop_n = dict(callbacks), dict(callback_calls)
        frames = session.frames_sent - sent0
        inferred = session.stats.frames_inferred - inferred0
        link = session.peer.link if session.peer is not None else None
        link_note = "" if link is None else link_summary(link)
        if client is not None:
            if client.returncode is None:  # it would hold the call for the rest of its time
                client.terminate()
            await client.wait()
    if frames == 0:
        raise RuntimeError("no frame was sent in the window: see the load client's error")
    cpu = cpu1 - cpu0
    threads = thread_delta(threads0, threads1, cpu)
    loop_thread = threads.get("event loop (main)", 0.0)
    loop_s["loop outside callbacks"] = loop_thread - sum(loop_s.values())
    per_frame = 1000 / frames

    def scaled(values: dict[str, float]) -> dict[str, float]:
        return {k: v * per_frame for k, v in sorted(values.items(), key=lambda kv: -kv[1])}

    return {
        "mode": "speaking" if speaking else "listening",
        "caller": "speech (microphone)" if speaking else f"silent ({caller})",
        "settle_s": waited,
        "chunks_zero_share": levels["zero"] / max(levels["chunks"], 1.0),
        "chunks_peak": levels["peak"],
        "window_s": t1 - t0,
        "frames_sent": frames,
        "fps": frames / (t1 - t0),
        "inferred_share": inferred / frames,
        "link": link_note,
        "server_ms_per_frame": cpu * per_frame,
        "threads_ms": scaled(threads),
        "callbacks_ms": scaled(loop_s),
        "callbacks_per_frame": {k: n / frames for k, n in loop_n.items()},
        "stages_ms": scaled(stage_s),
        "stages_per_frame": {k: n / frames for k, n in stage_n.items()},
    }


def link_summary(link: Any) -> str:
    """What the call's link was doing at the window's end: what drives its estimate,
    the estimate, and whether the call may settle on a steady idle loop."""
    snapshot = link.snapshot()
    steady = getattr(getattr(link, "_encoder", None), "steady_idle", None)
    return f"{snapshot.mode}, {snapshot.estimate_bps // 1000} kbit/s, steady idle {steady}"


def profile(
    seconds: float = 20.0, speaking: bool = False, caller: str = "mic", loop: str = "server"
) -> Result:
    """One call's profile (see the module doc). ``loop``: ``"server"`` runs the server on
    the event loop ``lipstream serve`` of this tree would (``server.event_loop``; asyncio
    in trees from before that setting), or ``"asyncio"`` / ``"uvloop"`` (uvloop's callbacks
    are not asyncio handles: no callback rows)."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    elif loop == "server":
        factory = served_loop_factory()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_demo_avatar(root / "avatars" / "demo", size=SIZE)
        with asyncio.Runner(loop_factory=factory) as runner:
            result = runner.run(_profile(root, seconds, speaking, caller))
            result["event_loop"] = type(runner.get_loop()).__module__.split(".")[0]
            return result


def print_profile(result: Result, top: int = 14) -> None:
    """The profile as tables."""
    print_table(
        f"One {result['mode']} 720p call, {result['window_s']:.0f} s window",
        [
            "caller",
            "chunks of digital silence",
            "frames sent",
            "fps",
            "inferred / sent",
            "server CPU ms / frame",
            "link at the end",
        ],
        [
            [
                result["caller"],
                f"{100 * result['chunks_zero_share']:.0f}%",
                result["frames_sent"],
                result["fps"],
                f"{100 * result['inferred_share']:.0f}%",
                result["server_ms_per_frame"],
                result.get("link", ""),
            ]
        ],
    )
    print_table(
        "CPU per thread (ms per frame sent)",
        ["thread", "ms / frame"],
        [[k, v] for k, v in result["threads_ms"].items() if abs(v) >= 0.0005],
    )
    counts = result["callbacks_per_frame"]
    print_table(
        f"Event loop: CPU per callback kind (ms per frame sent, top {top})",
        ["callback", "calls / frame", "ms / frame"],
        [[k, counts.get(k, ""), v] for k, v in list(result["callbacks_ms"].items())[:top]],
    )
    counts = result["stages_per_frame"]
    print_table(
        "Stages (ms per frame sent; a stage inside another counts once, as itself)",
        ["stage", "calls / frame", "ms / frame"],
        [[k, counts.get(k, 0.0), v] for k, v in result["stages_ms"].items()],
    )


# -- A/B ---------------------------------------------------------------------------------------


#: What the profile runs on, copied into both trees of an A/B (benchmarks only).
_PROFILE_FILES = (
    "listening_profile.py",
    "live_cpu.py",
    "live_server.py",
    "webrtc_load.py",
    "common.py",
)


def _run_in(tree: Path, seconds: float, speaking: bool, caller: str, out: Path) -> Result:
    command = [sys.executable, "-m", "benchmarks.listening_profile", "--seconds", str(seconds)]
    command += ["--json", str(out), "--caller", caller, *(["--speaking"] if speaking else [])]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    result: Result = json.loads(out.read_text())
    return result


def ab(
    base: str, candidate: str, rounds: int, seconds: float, speaking: bool, caller: str
) -> Result:
    """This profile on two commits in alternating rounds; each row's median per tree."""
    runs: dict[str, list[Result]] = {"before": [], "after": []}
    with (
        _checkout(base) as before,
        _checkout(candidate) as after,
        tempfile.TemporaryDirectory() as tmp,
    ):
        trees = [("before", before), ("after", after)]
        here = Path(__file__).parent
        for tree in (before, after):  # the same profile and load client measure both
            for name in _PROFILE_FILES:
                shutil.copy(here / name, tree / "benchmarks" / name)
        for r in range(rounds):
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                out = Path(tmp) / "out.json"
                runs[name].append(_run_in(tree, seconds, speaking, caller, out))
    for table in ("threads_ms", "callbacks_ms", "stages_ms", "stages_per_frame"):
        _print_ab(table, runs, _rows(table))
    _print_ab(
        "summary",
        runs,
        lambda r: {
            "server CPU ms / frame": r["server_ms_per_frame"],
            "chunks of digital silence": r["chunks_zero_share"],
            "fps": r["fps"],
        },
    )
    return {"base": base, "candidate": candidate, "runs": runs}


def _rows(table: str) -> Callable[[Result], dict[str, float]]:
    def rows(result: Result) -> dict[str, float]:
        values: dict[str, float] = result[table]
        return values

    return rows


def _print_ab(
    title: str, runs: dict[str, list[Result]], rows: Callable[[Result], dict[str, float]]
) -> None:
    keys: dict[str, None] = {}
    for name in ("before", "after"):
        for run in runs[name]:
            keys.update(dict.fromkeys(rows(run)))
    table = []
    for key in keys:
        before = statistics.median(rows(r).get(key, 0.0) for r in runs["before"])
        after = statistics.median(rows(r).get(key, 0.0) for r in runs["after"])
        if max(abs(before), abs(after)) < 0.0005:
            continue
        table.append([key, before, after, after / before if before else "-"])
    print_table(
        f"{title}: median of {len(runs['before'])} rounds",
        ["row", "before", "after", "after / before"],
        table,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--speaking", action="store_true", help="the caller speaks")
    parser.add_argument("--caller", choices=["mic", "none", "browser"], default="mic")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--ab", nargs=2, metavar=("BASE", "CANDIDATE"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loop", choices=["server", "asyncio", "uvloop"], default="server")
    args = parser.parse_args()
    if args.ab:
        base, candidate = args.ab
        result = ab(base, candidate, args.rounds, args.seconds, args.speaking, args.caller)
    else:
        result = profile(args.seconds, args.speaking, args.caller, args.loop)
        print_profile(result)
    if args.json:
        args.json.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
