"""``lipstream serve`` at its default settings as a child process, and what it holds.

For a benchmark that watches the server as deployed over a long run (``benchmarks/soak.py``):
the console script, its own event loop (uvloop), its raised open-file limit, its logging.
The configuration names only what a machine needs: free ports, folders for the demo
avatar (generated there on first use), ICE on 127.0.0.1 (``server.ice_loopback_only``:
the sandboxes these run in have no other address a client here reaches; nothing measured
depends on it) and admission opened wide as for every live benchmark
(:data:`~benchmarks.live_server.OPEN_ADMISSION`: the benchmark decides its load; at the
defaults a busy 2-core machine takes three calls, not four). Every other setting, on
the media path all of them (margins, presets, encoders, batching, caches, timeouts), is
the default; ``LIPSTREAM_*`` variables of this process are not passed on.

:func:`read_process` reads what a leak would make grow: the resident memory, open file
descriptors and threads from ``/proc/<pid>`` (the kernel's count, every native thread
included), the event loop's tasks and the caches' bytes from its ``GET /metrics``
(``web/process_metrics.py``: tasks can only be counted inside the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.live_server import OPEN_ADMISSION

LIPSTREAM = Path(sys.executable).parent / "lipstream"
STARTUP_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


@dataclass
class Served:
    """A running ``lipstream serve``: its process, base URL and log (its stderr)."""

    proc: asyncio.subprocess.Process
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_lines(self, level: str) -> list[str]:
        """The log's lines at ``level`` (``warning``, ``error``)."""
        text = self.log.read_text(errors="replace")
        return [line for line in text.splitlines() if f" level={level} " in line]


@dataclass(frozen=True)
class ProcessReading:
    """The server process at one moment."""

    rss_bytes: int
    fds: int
    threads: int
    tasks: int  # the event loop's, the scrape's own request among them
    cache_bytes: int  # background frames and encoded idle loops kept (both bounded)
    sessions: int
    viewers: int
    ended: dict[str, int]  # sessions ended so far, by reason (``/metrics``' labels)

    @property
    def ended_by_server(self) -> int:
        """Sessions the server ended itself (a watchdog, a failed stage), not hung up."""
        return sum(n for reason, n in self.ended.items() if not reason.startswith("hung up"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def serve_defaults(
    root: Path, sections: dict[str, dict[str, Any]] | None = None
) -> AsyncIterator[Served]:
    """``lipstream serve`` with the defaults (module doc), its files under ``root``; yields
    once ``/ready`` answers 200; stops it with SIGTERM (its drain) at the end.
    ``sections`` are settings the benchmark compares or needs (``livekit``), beside the
    machine's."""
    port = grpc_port = free_port()
    while grpc_port == port:
        grpc_port = free_port()
    settings = {
        "server": {
            "port": port,
            "grpc_port": grpc_port,
            "ice_loopback_only": True,
            **OPEN_ADMISSION,
        },
        "avatars": {"root": str(root / "avatars"), "data_dir": str(root / "data")},
        **(sections or {}),
    }
    config = root / "lipstream.yaml"
    config.write_text(yaml.safe_dump(settings))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIPSTREAM_")}
    env["PYTHONUNBUFFERED"] = "1"
    log = root / "server.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            str(LIPSTREAM), "--config", str(config), "serve", env=env, stderr=err
        )
    served = Served(proc, f"http://127.0.0.1:{port}", log)
    try:
        async with aiohttp.ClientSession() as probe, asyncio.timeout(STARTUP_TIMEOUT_S):
            while not await _answers(probe, f"{served.url}/ready"):
                if proc.returncode is not None:
                    raise RuntimeError(f"lipstream serve exited {proc.returncode}: see {log}")
                await asyncio.sleep(0.2)  # polling for start-up
        yield served
    finally:
        await stop(served)


async def stop(served: Served) -> int | None:
    """SIGTERM (the server drains and exits), SIGKILL after :data:`STOP_TIMEOUT_S`; the
    exit status (None if it had to be killed)."""
    proc = served.proc
    if proc.returncode is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(STOP_TIMEOUT_S):
            return await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None


async def _answers(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def read_process(served: Served, http: aiohttp.ClientSession) -> ProcessReading:
    """The server's figures now (module doc). ``http`` should not keep connections alive
    (``TCPConnector(force_close=True)``): each one would be a descriptor and a task more
    on the server while it stays open. ``/proc`` is read first, so the scrape's own
    connection is not among the descriptors."""
    proc = Path(f"/proc/{served.pid}")
    statm = (proc / "statm").read_text().split()
    fds, threads = len(os.listdir(proc / "fd")), len(os.listdir(proc / "task"))
    async with http.get(f"{served.url}/metrics") as response:
        response.raise_for_status()
        text = await response.text()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    values = {s.name: s.value for s in samples if not s.labels}
    ended = {
        s.labels["reason"]: int(s.value)
        for s in samples
        if s.name == "lipstream_sessions_ended_total" and s.value
    }
    return ProcessReading(
        rss_bytes=int(statm[1]) * os.sysconf("SC_PAGE_SIZE"),
        fds=fds,
        threads=threads,
        tasks=int(values["lipstream_event_loop_tasks"]),
        cache_bytes=int(
            values["lipstream_background_cache_bytes"] + values["lipstream_idle_loop_cache_bytes"]
        ),
        sessions=int(values["lipstream_sessions_live"]),
        viewers=int(values["lipstream_viewers"]),
        ended=ended,
    )
