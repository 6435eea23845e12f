"""Hostile connections against the real server (``lipstream serve`` as a subprocess).

2,000 connections send half a request head and nothing more: every one is closed once
``server.head_timeout_s`` has passed, while /health keeps answering; an address over
``server.max_connections_per_client`` has its extra connections refused at once. Counts
and states only: the deadlines below are generous bounds, not measurements.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import ClientError, ClientSession

from tests.live_calls import until

LIPSTREAM = Path(sys.executable).parent / "lipstream"
HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


@pytest.fixture
def many_files() -> Iterator[None]:
    """This process may open a few thousand sockets (the server raises its own limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **server: object) -> AsyncIterator[int]:
    port = _free_port()
    lines = "".join(f"  {k}: {v}\n" for k, v in {"port": port, **server}.items())
    config = tmp_path / "lipstream.yaml"
    config.write_text(
        f"server:\n{lines}avatars:\n  root: {tmp_path / 'avatars'}\n"
        f"  data_dir: {tmp_path / 'data'}\n  demo: false\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIPSTREAM_")}
    log = tmp_path / "stderr.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            str(LIPSTREAM), "--config", str(config), "serve", env=env, stderr=err
        )
    try:
        async with asyncio.timeout(60):
            while not await _health(port):
                assert proc.returncode is None, log.read_text()
                await asyncio.sleep(0.2)
        yield port
    finally:
        proc.kill()
        await proc.wait()


async def _health(port: int) -> bool:
    url = f"http://127.0.0.1:{port}/health"
    try:
        async with ClientSession() as http, http.get(url) as response:
            return response.status == 200
    except ClientError:
        return False


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _half_heads(port: int, count: int) -> list[Connection]:
    """``count`` connections that each sent half a head (keep the writers: a collected
    writer closes its connection)."""
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


def _close_all(connections: list[Connection]) -> None:
    for _, writer in connections:
        writer.close()


async def _closed(reader: asyncio.StreamReader) -> bool:
    """True once the server closed the connection (EOF or reset), with nothing sent."""
    try:
        return await reader.read(1024) == b""
    except ConnectionResetError:
        return True


async def test_half_sent_heads_are_closed_while_the_server_serves(
    tmp_path: Path, many_files: None
) -> None:
    async with serve(tmp_path, head_timeout_s=1.0, max_connections_per_client=5000) as port:
        connections = await _half_heads(port, 2000)
        try:
            assert await _health(port)  # the server answers while 2,000 heads dangle
            async with asyncio.timeout(60):
                closed = await asyncio.gather(*(_closed(r) for r, _ in connections))
            assert sum(closed) == 2000
            assert await _health(port)
        finally:
            _close_all(connections)


async def test_connections_over_the_per_address_cap_are_refused(
    tmp_path: Path, many_files: None
) -> None:
    async with serve(tmp_path, head_timeout_s=30.0, max_connections_per_client=50) as port:
        connections = await _half_heads(port, 60)
        try:
            async with asyncio.timeout(20):  # the ten over the cap go at once, not in 30 s
                refused = await asyncio.gather(*(_closed(r) for r, _ in connections[50:]))
            assert all(refused)
            assert not any(r.at_eof() for r, _ in connections[:50])
            assert not await _health(port)  # the address is still at its cap
            _close_all(connections[:10])
            await until(lambda: _health(port), "room again once ten connections closed")
        finally:
            _close_all(connections)
