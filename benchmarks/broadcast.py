"""Server CPU of one speaking session's WHEP viewers and RTMP output
(``docs/design/broadcast.md`` §21).

    .venv/bin/python -m benchmarks.broadcast [--viewers 0 1 4 8] [--seconds 10] [--rtmp] \\
        [--find-limit] [--remb] [--json]

A real server in this process, on the event loop ``lipstream serve`` uses
(:func:`~benchmarks.live_server.run_as_served`), the demo avatar at 1280×720 and one
session no caller owns (``POST /sessions``) that speaks all the time: the bundled sample
is pushed again (``/audio``) whenever less than :data:`QUEUED_S` of it is left. For each
viewer count N the load client (``benchmarks.whep_load``, another process) opens N WHEP
viewers, one decoding and the others assembling frames undecoded (N 720p decoders would
take the cores from the server), and counts their frames in media time; over the
client's window of ``--seconds`` this process reads its own CPU and the frames the
session sent:

- server ms / frame: this process's CPU per frame the session sent;
- ms / frame per viewer: (ms / frame with N viewers − with none) / N;
- viewers per core: 1000 ms / (25 frames × ms / frame per viewer), what one core's CPU
  would pay for with nothing else to do (the session's own cost not counted);
- the viewers' frame rates (median, lowest) and the load client's CPU in cores.

``--rtmp`` adds the session with no viewer and one RTMP output to nginx's RTMP module (run
as ``tests/rtmp_server.py`` runs it; ``outputs.allow_private`` on): its cost is the
difference with no output. ``--find-limit`` raises N (1, 2, 4, 8, 12, 16, 20, … 40) until
the median viewer's rate falls below 24 fps. The viewers send no REMB unless ``--remb``:
aiortc's estimate, in one process receiving for many connections, reads its own delays
as congestion, and a viewer's link then paces the session's stream below its bitrate.
On a noisy 2-core VM, with the load client on the same cores, compare runs alternated,
not figures taken an hour apart. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import grp
import json
import os
import pwd
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from benchmarks.common import Result, machine, print_table
from benchmarks.listening_profile import WARM_UP_S, background_settled
from benchmarks.live_server import SAMPLE, client_result, cpu_seconds, live_server, run_as_served
from inference_core.assets.demo_avatar import write_demo_avatar
from streaming.live.session import Session
from web.app_keys import SESSIONS

FPS = 25
#: The speech queued in the session below which the sample is pushed again.
QUEUED_S = 10.0
LIMIT_FPS = 24.0
NOISE_MS = 0.05  # a cost per viewer below it gives no viewers-per-core figure
LIMIT_STEPS = (1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40)
NGINX = Path("/usr/sbin/nginx")
RTMP_MODULE = Path("/usr/lib/nginx/modules/ngx_rtmp_module.so")


async def _speak(http: ClientSession, session: Session) -> None:
    """Keep the session speaking: the sample pushed again whenever little is left."""
    wav = SAMPLE.read_bytes()
    while True:
        if session.queued_audio_s < QUEUED_S:
            async with http.post(
                f"/sessions/{session.session_id}/audio",
                data=wav,
                headers={"Content-Type": "audio/wav"},
            ) as response:
                response.raise_for_status()
        await asyncio.sleep(0.5)


def _relayed(session: Session) -> dict[str, int]:
    """Frames each viewer's track has relayed so far, by viewer."""
    return {v.viewer_id: v.video.frames_relayed for v in session.audience._viewers.values()}


def _server_cpu() -> float:
    """This process's CPU seconds, and its RTMP outputs' pushing processes' (children of
    this process that are part of the server; the load client is not counted)."""
    total = cpu_seconds()
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                if b"rtmp_push" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # it ended meanwhile
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def _window(session: Session, seconds: float) -> Result:
    """Over ``seconds``: server ms per frame the session sent, the session's fps, and the
    lowest share of those frames a viewer's track relayed (what the server lost, not the
    client)."""
    relayed0 = _relayed(session)
    sent0, cpu0, t0 = session.frames_sent, _server_cpu(), time.monotonic()
    await asyncio.sleep(seconds)
    sent, cpu, relayed = session.frames_sent - sent0, _server_cpu() - cpu0, _relayed(session)
    shares = [(n - relayed0[v]) / max(sent, 1) for v, n in relayed.items() if v in relayed0]
    return {
        "ms_per_frame": cpu * 1000 / max(sent, 1),
        "session_fps": sent / (time.monotonic() - t0),
        "relayed_min": min(shares, default=None),
    }


async def _with_viewers(
    url: str, session: Session, viewers: int, seconds: float, remb: bool
) -> Result:
    """One row: ``viewers`` viewers from the load client, measured over its window."""
    if viewers == 0:
        return {"viewers": 0, **await _window(session, seconds)}
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.whep_load",
        *("--viewers", str(viewers), "--seconds", str(seconds), "--decode", "1"),
        *(() if remb else ("--no-remb",)),
        "--",  # a session id may begin with "-"
        url,
        session.session_id,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert client.stdout is not None
        async with asyncio.timeout(120):
            while b'"window"' not in await client.stdout.readline():
                if client.stdout.at_eof():
                    raise RuntimeError(f"load client failed (exit {await client.wait()})")
        window = await _window(session, seconds)
        async with asyncio.timeout(seconds + 120):
            out, _ = await client.communicate()
    finally:
        if client.returncode is None:
            client.kill()
            await client.wait()
    result = client_result(out, client.returncode)
    rates = sorted(v["fps"] for v in result["per_viewer"])
    return {
        "viewers": viewers,
        **window,
        "viewer_fps_median": statistics.median(rates),
        "viewer_fps_min": rates[0],
        "client_cores": result["client_cores"],
    }


def _per_viewer(row: Result, base_ms: float) -> Result:
    if row["viewers"]:
        row["ms_per_viewer"] = (row["ms_per_frame"] - base_ms) / row["viewers"]
        per_core = 1000 / (FPS * row["ms_per_viewer"]) if row["ms_per_viewer"] > NOISE_MS else None
        row["viewers_per_core"] = per_core
    return row


def _nginx_conf(directory: Path) -> tuple[int, Path]:
    """A free loopback port and an nginx.conf taking RTMP on it (``daemon off``, its pid
    and log in ``directory``, one ``live`` application)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    directory.mkdir(parents=True, exist_ok=True)
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    conf = directory / "nginx.conf"
    conf.write_text(
        f"load_module {RTMP_MODULE};\ndaemon off;\nuser {user} {group};\n"
        f"worker_processes 1;\npid {directory}/nginx.pid;\n"
        f"error_log {directory}/error.log info;\nevents {{ worker_connections 64; }}\n"
        f"rtmp {{ server {{ listen 127.0.0.1:{port}; chunk_size 4096;\n"
        "    application live { live on; record off; } } }\n"
    )
    return port, conf


@contextlib.asynccontextmanager
async def rtmp_ingest(directory: Path) -> AsyncIterator[str]:
    """nginx with its RTMP module on a free loopback port, as ``tests/rtmp_server.py``
    runs it; yields the URL to push a stream to."""
    port, conf = _nginx_conf(directory)
    nginx = await asyncio.create_subprocess_exec(
        str(NGINX), "-p", str(directory), "-c", str(conf), "-e", str(directory / "error.log"),
        stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with asyncio.timeout(30):
            while True:
                if nginx.returncode is not None:
                    raise RuntimeError(f"nginx exited with {nginx.returncode}; see {directory}")
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                await asyncio.sleep(0.1)
        yield f"rtmp://127.0.0.1:{port}/live/bench"
    finally:
        if nginx.returncode is None:
            nginx.terminate()
            await nginx.wait()


async def _rtmp_row(
    http: ClientSession, session: Session, root: Path, seconds: float, base_ms: float
) -> Result:
    """No viewer and one RTMP output: what the output costs over the session alone."""
    async with rtmp_ingest(root / "nginx") as target:
        async with http.post(f"/sessions/{session.session_id}/outputs", json={"rtmp": target}) as r:
            output_id = (await r.json())["output_id"]
        async with asyncio.timeout(60):
            while not any(  # noqa: ASYNC110 - polls the output's status
                s.state == "live" and s.frames_sent > 0 for s in session.outputs.statuses()
            ):
                await asyncio.sleep(0.1)
        await asyncio.sleep(WARM_UP_S)
        window = await _window(session, seconds)
        (status,) = session.outputs.statuses()
        await http.delete(f"/sessions/{session.session_id}/outputs/{output_id}")
    return {
        "viewers": "0 + RTMP",
        **window,
        "ms_per_output": window["ms_per_frame"] - base_ms,
        "output": {"frames_sent": status.frames_sent, "frames_dropped": status.frames_dropped},
    }


async def _measure(
    root: Path, viewers: list[int], seconds: float, rtmp: bool, find_limit: bool, remb: bool
) -> Result:
    settings: dict[str, object] = {"outputs": {"allow_private": True}}
    async with live_server(root, settings) as (app, url), ClientSession(base_url=url) as http:
        async with http.post("/sessions", json={"avatar": "demo"}) as created:
            session = app[SESSIONS].get((await created.json())["session_id"])
        speaker = asyncio.create_task(_speak(http, session))
        try:
            async with asyncio.timeout(60):
                while session.stats.frames_inferred < FPS:  # noqa: ASYNC110 - polls the session
                    await asyncio.sleep(0.1)
            await asyncio.sleep(WARM_UP_S)
            await background_settled(timeout_s=60)
            base = await _with_viewers(url, session, 0, seconds, remb)
            rows = [base]
            for n in (n for n in viewers if n):
                rows.append(await _with_viewers(url, session, n, seconds, remb))
            if rtmp:
                rows.append(await _rtmp_row(http, session, root, seconds, base["ms_per_frame"]))
            steps: list[Result] = []
            for n in LIMIT_STEPS if find_limit else ():
                steps.append(await _with_viewers(url, session, n, seconds, remb))
                if steps[-1]["viewer_fps_median"] < LIMIT_FPS:
                    break
            if speaker.done():
                speaker.result()  # the pushes failed: say why
        finally:
            speaker.cancel()
            await asyncio.gather(speaker, return_exceptions=True)
    for row in rows + steps:
        if isinstance(row["viewers"], int):
            _per_viewer(row, base["ms_per_frame"])
    held = [s["viewers"] for s in steps if s["viewer_fps_median"] >= LIMIT_FPS]
    every = [s["viewers"] for s in steps if s["viewer_fps_min"] >= LIMIT_FPS]
    limit = {"median_at_24": max(held, default=0), "all_at_24": max(every, default=0)}
    return {
        "machine": machine(),
        "seconds": seconds,
        "remb": remb,
        "rows": rows,
        "limit_steps": steps,
        "limit": limit if find_limit else None,
    }


def run(
    viewers: list[int],
    seconds: float = 10.0,
    rtmp: bool = False,
    find_limit: bool = False,
    remb: bool = False,
) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_demo_avatar(root / "avatars" / "demo", size=(1280, 720))
        return run_as_served(_measure(root, viewers, seconds, rtmp, find_limit, remb))


def _table(title: str, rows: list[Result]) -> None:
    header = [
        "viewers",
        "server ms / frame",
        "ms / frame per viewer (or output)",
        "viewers per core",
        "session fps",
        "relayed / sent, lowest viewer",
        "viewer fps median",
        "viewer fps min",
        "client cores",
    ]

    def cell(row: Result, key: str) -> Any:
        value = row.get(key)
        return "–" if value is None else value

    print_table(
        title,
        header,
        [
            [
                row["viewers"],
                row["ms_per_frame"],
                cell(row, "ms_per_viewer") if "ms_per_output" not in row else row["ms_per_output"],
                *(cell(row, k) for k in ("viewers_per_core", "session_fps", "relayed_min")),
                *(cell(row, k) for k in ("viewer_fps_median", "viewer_fps_min", "client_cores")),
            ]
            for row in rows
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--viewers", type=int, nargs="+", default=[0, 1, 4, 8])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rtmp", action="store_true", help="add one RTMP output's cost")
    parser.add_argument("--find-limit", action="store_true", help="viewers held at 24 fps")
    parser.add_argument("--remb", action="store_true", help="the viewers send REMB")
    parser.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = parser.parse_args()
    result = run(args.viewers, args.seconds, args.rtmp, args.find_limit, args.remb)
    if args.json:
        print(json.dumps(result))
        return
    m = result["machine"]
    print(f"{m['cpu']} ({m['cpus']} CPUs), {m['date']}, {args.seconds:g} s windows")
    _table("One speaking 720p session: server CPU per viewer", result["rows"])
    if result["limit"] is not None:
        _table("Viewers one process holds at >= 24 fps", result["limit_steps"])
        limit = result["limit"]
        print(
            f"\nmedian viewer >= 24 fps up to {limit['median_at_24']} viewers; "
            f"every viewer >= 24 fps up to {limit['all_at_24']}"
        )


if __name__ == "__main__":
    main()
