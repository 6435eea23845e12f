"""``lipstream serve`` as a real subprocess: the console script, its own listener and signals.

Tests that need what only the process does (the guarded listener, the open-file limit,
SIGTERM draining, a cluster front) start it here on a free loopback port (and its gRPC
listener on another, so that no two tests meet on 8081) and talk to it over HTTP;
:func:`lipstream_serve` yields once ``/health`` answers and kills the process at the end
if it is still up.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import ClientError, ClientSession, TCPConnector

LIPSTREAM = Path(sys.executable).parent / "lipstream"
STARTUP_TIMEOUT_S = 60.0


@dataclass
class Server:
    proc: asyncio.subprocess.Process
    http: ClientSession
    port: int
    stderr: Path
    grpc_port: int | None = None  # None when the test turned gRPC off

    @property
    def grpc_address(self) -> str:
        assert self.grpc_port is not None, "this server runs without gRPC"
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def lipstream_serve(
    tmp_path: Path,
    *args: str,
    server: Mapping[str, object] | None = None,
    demo: bool = True,
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
    sections: Mapping[str, Mapping[str, object]] | None = None,
) -> AsyncIterator[Server]:
    """``lipstream serve [args]`` with ``server:`` settings ``server`` (plus a free port
    and a free ``grpc_port``, unless given: None turns gRPC off); the built-in demo
    avatar unless ``demo`` is false; other sections' settings in ``sections`` (plain
    values). A cluster front answers once its workers reported: give it a longer
    ``startup_timeout_s``."""
    port = grpc_port = free_port()
    while grpc_port == port:
        grpc_port = free_port()
    settings = {"port": port, "grpc_port": grpc_port, **(server or {})}
    lines = "".join(f"  {k}: {'null' if v is None else v}\n" for k, v in settings.items())
    config = tmp_path / "lipstream.yaml"
    config.write_text(
        f"server:\n{lines}"
        f"avatars:\n  root: {tmp_path / 'avatars'}\n  data_dir: {tmp_path / 'data'}\n"
        f"  demo: {str(demo).lower()}\n"
        "video:\n  preset: ultrafast\n"
        + "".join(
            f"{name}:\n" + "".join(f"  {k}: {_yaml(v)}\n" for k, v in values.items())
            for name, values in (sections or {}).items()
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIPSTREAM_")}
    env["PYTHONUNBUFFERED"] = "1"
    stderr = tmp_path / "stderr.log"
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            str(LIPSTREAM),
            "--config",
            str(config),
            "serve",
            *args,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        # Polled on connections of its own, so ``http`` holds none yet (connection caps).
        async with ClientSession(base_url=base_url) as probe:
            async with asyncio.timeout(startup_timeout_s):
                while not await answers(probe, "/health"):
                    assert proc.returncode is None, stderr.read_text(errors="replace")
                    await asyncio.sleep(0.2)  # polling for start-up, not synchronisation
        async with ClientSession(base_url=base_url) as http:
            chosen = settings["grpc_port"]
            assert chosen is None or isinstance(chosen, int)
            yield Server(proc, http, port, stderr, chosen)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _yaml(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def descendants(pid: int) -> dict[int, str]:
    """The processes below ``pid`` (children, theirs, ...), by pid, each with the name the
    kernel shows for it (``/proc/<pid>/comm``: at most 15 characters, so Ray's
    ``ray::DashboardAgent`` reads ``ray::DashboardA``). Linux only."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            names[int(entry.name)] = (entry / "comm").read_text().strip()
        except OSError:  # it ended while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found: dict[int, str] = {}
    below = [pid]
    while below:
        parent = below.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found[child] = names.get(child, "")
                below.append(child)
    return found


async def answers_on_new_connection(port: int, path: str) -> bool:
    """:func:`answers`, on a connection opened for it and closed after it."""
    async with ClientSession(connector=TCPConnector(force_close=True)) as http:
        return await answers(http, f"http://127.0.0.1:{port}{path}")


async def answers(http: ClientSession, path: str) -> bool:
    """True when ``path`` answers 200; False on another status or no connection."""
    try:
        async with http.get(path) as response:
            return response.status == 200
    except ClientError:
        return False


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


async def half_heads(port: int, count: int) -> list[Connection]:
    """``count`` connections that each sent half a request head and nothing more (keep the
    writers: a collected writer closes its connection)."""
    connections: list[Connection] = []
    for start in range(0, count, 200):  # the listen backlog is 100: open in waves
        opened = await asyncio.gather(
            *(
                asyncio.open_connection("127.0.0.1", port)
                for _ in range(start, min(count, start + 200))
            )
        )
        for _, writer in opened:
            writer.write(HALF_HEAD)
        connections += opened
        await asyncio.gather(*(w.drain() for _, w in opened))
    return connections


def close_all(connections: list[Connection]) -> None:
    for _, writer in connections:
        writer.close()


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server closed the connection (EOF or reset), with nothing sent."""
    try:
        return await reader.read(1024) == b""
    except ConnectionResetError:
        return True
