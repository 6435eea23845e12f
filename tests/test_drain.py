"""``lipstream serve`` drains on SIGTERM/SIGINT: not ready, no new calls, live calls finish.

The server runs as a real subprocess (the console script, its own signal handling);
the test process calls it with an aiortc client over loopback.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import ClientSession
from aiortc import RTCPeerConnection

from tests.live_calls import TIMEOUT_S, until
from tests.server_process import (
    STARTUP_TIMEOUT_S,
    answers,
    close_all,
    closed_by_server,
    half_heads,
    lipstream_serve,
)
from tests.webrtc_client import Caller

logger = logging.getLogger(__name__)

# The call must show 25 more frames within the drain, on a machine that may be busy.
DRAIN_TIMEOUT_S = 5.0
HEAD_TIMEOUT_S = 2.0


def _settings(drain_timeout_s: float) -> dict[str, object]:
    return {
        "drain_timeout_s": drain_timeout_s,
        "ice_loopback_only": "true",
        # Half-sent heads at the front are closed after this (the guarded listener).
        "head_timeout_s": HEAD_TIMEOUT_S,
    }


def _not_ready(http: ClientSession) -> Callable[[], Awaitable[bool]]:
    async def not_ready() -> bool:
        async with http.get("/ready") as response:
            return response.status == 503

    return not_ready


async def _offer_sdp() -> str:
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp: str = pc.localDescription.sdp
        return sdp
    finally:
        await pc.close()


async def test_sigterm_drains_a_live_call_then_exits_cleanly(
    tmp_path: Path, loopback: None, record_property: Callable[[str, object], None]
) -> None:
    async with lipstream_serve(tmp_path, server=_settings(DRAIN_TIMEOUT_S)) as server:
        http = server.http
        assert (await http.get("/ready")).status == 200
        caller = Caller(http)
        caller.keep_luma = False
        await caller.connect()
        try:
            await caller.wait_for_frames(10)
            sdp = await _offer_sdp()
            frames_at_signal = len(caller.received.video_times)
            server.proc.send_signal(signal.SIGTERM)
            sent_at = time.monotonic()

            await until(_not_ready(http), "/ready to answer 503")
            ready_503_after = time.monotonic() - sent_at  # reported, not asserted
            reasons = (await (await http.get("/ready")).json())["reasons"]
            assert any("draining" in reason for reason in reasons), reasons

            refused = await http.post("/offer", json={"sdp": sdp, "type": "offer"})
            assert refused.status == 503
            assert int(refused.headers["Retry-After"]) > 0
            assert (await refused.json())["error"]["code"] == "too_many_sessions"

            # The live call goes on through the drain.
            state = await (await http.get(f"/sessions/{caller.session_id}")).json()
            assert state["state"] == "streaming"
            await caller.wait_for_frames(frames_at_signal + 25)

            async with asyncio.timeout(TIMEOUT_S):
                code = await server.proc.wait()
            exited_after = time.monotonic() - sent_at
        finally:
            await caller.close()
        record_property("ready_503_after_s", round(ready_503_after, 3))
        record_property("exited_after_s", round(exited_after, 2))
        logger.info("/ready 503 after %.3f s; exit after %.2f s", ready_503_after, exited_after)
        log = server.log()
        assert code == 0, log
        assert "Traceback" not in log, log
        assert "draining: 1 live sessions" in log, log
        assert "(server.drain_timeout_s passed): closing 1 live sessions" in log, log
        assert "reason=server shutdown" in log, log
        assert re.search(r"start-up heap frozen: \d{5,} objects", log), log  # before serving
        # The drain held the call for the whole timeout.
        assert exited_after >= DRAIN_TIMEOUT_S


async def test_drain_ends_when_the_last_call_hangs_up(tmp_path: Path, loopback: None) -> None:
    """SIGINT too; the drain stops waiting once no session is left (not at the timeout)."""
    long_drain_s = 60.0
    async with lipstream_serve(tmp_path, server=_settings(long_drain_s)) as server:
        caller = Caller(server.http)
        caller.keep_luma = False
        await caller.connect()
        try:
            await caller.wait_for_frames(5)
            server.proc.send_signal(signal.SIGINT)
            await until(_not_ready(server.http), "/ready to answer 503")
            # Draining, and the call goes on: the server waits for it.
            await caller.wait_for_frames(len(caller.received.video_times) + 25)
            state = await (await server.http.get(f"/sessions/{caller.session_id}")).json()
            assert state["state"] == "streaming"
            assert server.proc.returncode is None
        finally:
            await caller.hang_up()
        async with asyncio.timeout(long_drain_s / 2):
            code = await server.proc.wait()
        log = server.log()
        assert code == 0, log
        assert "Traceback" not in log, log
        assert "(every session ended): closing 0 live sessions" in log, log


async def test_a_cluster_front_serves_a_call_then_drains_its_workers(
    tmp_path: Path, loopback: None
) -> None:
    """``lipstream serve --workers 1``: a local Ray runtime, a worker process, a call
    through the front; SIGTERM drains the worker with its call, then everything stops."""
    async with lipstream_serve(
        tmp_path, "--workers", "1", server=_settings(DRAIN_TIMEOUT_S)
    ) as server:
        http = server.http
        # The front's listener is guarded too: half-sent heads are closed, calls go on.
        dangling = await half_heads(server.port, 50)

        async def ready() -> bool:
            return await answers(http, "/ready")

        await until(ready, "the front's worker to report", timeout_s=STARTUP_TIMEOUT_S)
        workers = (await (await http.get("/ready")).json())["workers"]
        assert workers == {"up": 1, "total": 1}
        caller = Caller(http)
        caller.keep_luma = False
        await caller.connect()
        try:
            await caller.wait_for_frames(10)
            assert caller.session_id.startswith("w0-")
            async with asyncio.timeout(TIMEOUT_S):
                closed = await asyncio.gather(*(closed_by_server(r) for r, _ in dangling))
            assert sum(closed) == len(dangling)
            frames_at_signal = len(caller.received.video_times)
            server.proc.send_signal(signal.SIGTERM)
            await until(_not_ready(http), "/ready to answer 503")
            refused = await http.post("/offer", json={"sdp": await _offer_sdp(), "type": "offer"})
            assert refused.status == 503
            await caller.wait_for_frames(frames_at_signal + 25)  # the call goes on
            async with asyncio.timeout(TIMEOUT_S):
                code = await server.proc.wait()
        finally:
            await caller.close()
            close_all(dangling)
        log = server.log()
        assert code == 0, log
        assert "Traceback" not in log, log
        assert "cluster: 1 of 1 workers up" in log, log
        assert "draining: 1 live sessions on 1 workers" in log, log
        assert "front of 1 workers stopped" in log, log
