"""Hostile connections against the real server (``lipstream serve`` as a subprocess).

2,000 connections send half a request head and nothing more: every one is closed once
``server.head_timeout_s`` has passed, while /health and a live call keep working; an
address over ``server.max_connections_per_client`` has its extra connections refused at
once. Counts and states only: the deadlines below are generous bounds, not measurements.
The cluster front's listener is checked the same way in ``tests/test_drain.py``.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live_calls import until
from tests.server_process import (
    answers,
    answers_on_new_connection,
    close_all,
    closed_by_server,
    half_heads,
    lipstream_serve,
)
from tests.webrtc_client import Caller


@pytest.fixture
def many_files() -> Iterator[None]:
    """This process may open a few thousand sockets (the server raises its own limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_half_sent_heads_are_closed_while_the_server_serves(
    tmp_path: Path, many_files: None
) -> None:
    settings = {"head_timeout_s": 1.0, "max_connections_per_client": 5000}
    async with lipstream_serve(tmp_path, server=settings, demo=False) as server:
        connections = await half_heads(server.port, 2000)
        try:
            assert await answers(server.http, "/health")  # it answers while 2,000 dangle
            async with asyncio.timeout(60):
                closed = await asyncio.gather(*(closed_by_server(r) for r, _ in connections))
            assert sum(closed) == 2000
            assert await answers(server.http, "/health")
        finally:
            close_all(connections)


async def test_a_live_call_streams_on_through_a_flood_of_half_sent_heads(
    tmp_path: Path, many_files: None, loopback: None
) -> None:
    """A call placed before the flood keeps receiving video while 2,000 heads dangle and
    are closed, and a new call connects in the middle of it."""
    settings = {
        "head_timeout_s": 2.0,
        "max_connections_per_client": 5000,
        "ice_loopback_only": "true",
    }
    async with lipstream_serve(tmp_path, server=settings) as server:
        first = Caller(server.http)
        first.keep_luma = False
        await first.connect()
        connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        second = Caller(server.http)
        second.keep_luma = False
        try:
            await first.wait_for_frames(10)
            connections = await half_heads(server.port, 2000)
            during = len(first.received.video_times)
            await second.connect()  # signalling works beside the dangling heads
            await second.wait_for_frames(10)
            await first.wait_for_frames(during + 25)  # the first call never stalled
            async with asyncio.timeout(60):
                closed = await asyncio.gather(*(closed_by_server(r) for r, _ in connections))
            assert sum(closed) == 2000
            state = await (await server.http.get(f"/sessions/{first.session_id}")).json()
            assert state["state"] == "streaming"
        finally:
            close_all(connections)
            await second.close()
            await first.close()
        assert "Traceback" not in server.log()


async def test_connections_over_the_per_address_cap_are_refused(
    tmp_path: Path, many_files: None
) -> None:
    settings = {"head_timeout_s": 30.0, "max_connections_per_client": 50}
    async with lipstream_serve(tmp_path, server=settings, demo=False) as server:
        connections = await half_heads(server.port, 60)
        try:
            async with asyncio.timeout(20):  # the ten over the cap go at once, not in 30 s
                refused = await asyncio.gather(*(closed_by_server(r) for r, _ in connections[50:]))
            assert all(refused)
            assert not any(r.at_eof() for r, _ in connections[:50])
            assert not await answers_on_new_connection(
                server.port, "/health"
            )  # the address is at its cap
            close_all(connections[:10])
            await until(
                lambda: answers_on_new_connection(server.port, "/health"),
                "room again once ten connections closed",
            )
        finally:
            close_all(connections)
