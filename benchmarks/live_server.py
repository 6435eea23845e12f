"""A lipstream server in this process plus a load-client process, for the live benchmarks.

The server runs on this process's event loop (so its sessions' stats and its CPU time can
be read directly), the kind of loop ``lipstream serve`` runs it on
(:func:`run_as_served`); the WebRTC clients run in a separate process
(``benchmarks.webrtc_load``) so their H.264 decoding does not share the server's loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import wave
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from aiohttp import web

from config.settings import Settings
from streaming.audio_in.decode import decode_audio
from streaming.live.manager import SessionManager
from streaming.live.session import Session
from streaming.webrtc.compat import loopback_only_ice
from web.app import build_app
from web.app_keys import SESSIONS

T = TypeVar("T")

SAMPLE = Path(__file__).resolve().parent.parent / "web" / "static" / "sample.wav"
#: ``server:`` settings that open admission control wide: a benchmark decides its own load
#: (and finds the limits itself), where the defaults would refuse calls a busy machine
#: measured as too costly.
OPEN_ADMISSION: dict[str, object] = {
    "offer_rate_limit_per_minute": 10_000,
    "max_sessions": 64,
    "admission_headroom": 1.0,
    "cpu_ms_per_session_frame": 0.1,
    "inference_ms_per_frame_estimate": 0.1,
}


def write_speech(path: Path, seconds: float) -> Path:
    """The bundled speech sample, repeated to last ``seconds``, as a 16 kHz mono WAV."""
    pcm = decode_audio(SAMPLE).pcm_16k
    reps = int(np.ceil(seconds * 16_000 / len(pcm)))
    samples = (np.clip(np.tile(pcm, reps), -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(samples.tobytes())
    return path


def cpu_seconds(pid: int | None = None) -> float:
    """This process's (or ``pid``'s) user + system CPU time, all its threads, from
    ``/proc/<pid>/stat``."""
    stat = Path("/proc/self/stat" if pid is None else f"/proc/{pid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class LiveRun:
    """What one load run measured on the server side."""

    processing_ms: dict[str, list[float]] = field(default_factory=dict)
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)
    server_cpu_s: float = 0.0
    window_s: float = 0.0
    client: dict[str, Any] = field(default_factory=dict)
    delay_ms: float = 0.0
    lookahead_ms: float = 0.0


def served_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop ``lipstream serve`` runs on in this tree
    (``server.event_loop``: uvloop by default); None: asyncio's, as in trees from before
    that setting (an A/B copies this file into them)."""
    try:
        from web.serve import event_loop_factory
    except ImportError:
        return None
    return event_loop_factory(Settings().server.event_loop)


def run_as_served(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on the event loop ``lipstream serve`` runs on, so that a benchmark
    measures the server as deployed."""
    with asyncio.Runner(loop_factory=served_loop_factory()) as runner:
        return runner.run(main)


@asynccontextmanager
async def live_server(
    root: Path, settings: dict[str, object] | None = None
) -> AsyncIterator[tuple[web.Application, str]]:
    """Serve ``build_app`` on 127.0.0.1 (a free port); yields the app and its URL."""
    config = Settings.model_validate(
        {
            "avatars": {"root": str(root / "avatars"), "data_dir": str(root / "data")},
            "server": dict(OPEN_ADMISSION),
            **(settings or {}),
        }
    )
    with loopback_only_ice():
        async with served(build_app(config)) as (app, url):
            yield app, url


@asynccontextmanager
async def served(
    app: web.Application, host: str = "127.0.0.1"
) -> AsyncIterator[tuple[web.Application, str]]:
    """``app`` served on ``host`` at a free port; yields it and its URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield runner.app, f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def start_load(
    url: str,
    *,
    calls: int,
    seconds: float,
    speech: Path,
    avatar: str | Sequence[str] = "demo",
    microphone: bool = False,
    cpus: set[int] | None = None,
    pattern: tuple[float, float] | None = None,
    seed: int = 0,
    timeline: bool = False,
) -> asyncio.subprocess.Process:
    """Start the load client (``benchmarks.webrtc_load``): ``calls`` calls speaking
    ``speech``, pushed over HTTP or (``microphone``) as each call's microphone; on
    ``cpus`` only, when given. Several avatars take the calls in turn; a ``pattern``
    (speak, listen seconds; phases from ``seed``) makes each microphone a conversation;
    ``timeline`` asks for frame arrival times and bytes samples."""
    avatars = [avatar] if isinstance(avatar, str) else list(avatar)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.webrtc_load",
        *("--url", url, "--calls", str(calls), "--seconds", str(seconds)),
        *("--speech", str(speech), "--avatar", *avatars),
        *(("--microphone",) if microphone else ()),
        *(("--pattern", *map(str, pattern), "--seed", str(seed)) if pattern else ()),
        *(("--timeline",) if timeline else ()),
        stdout=asyncio.subprocess.PIPE,
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )


def split_cpus() -> tuple[set[int], set[int]]:
    """This process's cores cut in two: the server's (the first half, at least one) and
    the load client's (the rest, or the same one on a single core)."""
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    return set(cores[:half]), set(cores[half:] or cores)


@contextmanager
def pinned(cpus: set[int]) -> Iterator[None]:
    """While open, this thread (and every thread it starts: a server built inside) runs
    on ``cpus`` only; the affinity it had is put back on exit."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


async def wait_for_calls(
    app: web.Application, calls: int, started: Callable[[Session], bool]
) -> list[Session]:
    """The sessions, once ``calls`` of them are live and each is ``started`` (60 s at most)."""
    manager: SessionManager = app[SESSIONS]
    async with asyncio.timeout(60):
        while len(manager.sessions) < calls or not all(  # noqa: ASYNC110 - polls the manager
            started(s) for s in manager.sessions
        ):
            await asyncio.sleep(0.1)
    return list(manager.sessions)


def client_result(out: bytes, returncode: int | None) -> dict[str, Any]:
    """The load client's JSON line, or an error naming its exit status."""
    if returncode != 0:
        raise RuntimeError(f"load client failed (exit {returncode})")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def load_run(
    app: web.Application, url: str, *, calls: int, seconds: float, speech: Path, avatar: str
) -> LiveRun:
    """Run ``calls`` speaking calls from a client process; collect server-side figures."""
    client = await start_load(url, calls=calls, seconds=seconds, speech=speech, avatar=avatar)
    result = LiveRun()
    seen: dict[str, Session] = {}
    # Wait until every call sends frames and speaks, then reset the stats: from here on
    # the window is steady speech.
    live = await wait_for_calls(app, calls, lambda s: s.frames_sent > 0)
    await asyncio.sleep(1.5)
    for session in live:
        seen[session.session_id] = session
        session.stats.processing_ms.clear()
        session.stats.frames_dropped.clear()
    cpu0, t0 = cpu_seconds(), asyncio.get_running_loop().time()
    await asyncio.sleep(seconds * 0.9)
    result.server_cpu_s = cpu_seconds() - cpu0
    result.window_s = asyncio.get_running_loop().time() - t0
    for sid, session in seen.items():
        result.processing_ms[sid] = list(session.stats.processing_ms)
        result.dropped[sid] = dict(session.stats.frames_dropped)
        result.delay_ms, result.lookahead_ms = session.delay_s * 1000, session.lookahead_ms
    out, _ = await client.communicate()
    result.client = client_result(out, client.returncode)
    return result
