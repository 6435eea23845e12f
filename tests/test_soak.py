"""Nothing leaks: the soak's short version, and what it found, on ``lipstream serve``.

``benchmarks/soak.py`` at 3 minutes (one call replaced every minute) on the server at its
default settings: the bounds it holds each slice to are ``benchmarks.soak.BOUNDS`` (each
says there why a leak exceeds it); the test asserts every one, and that the server had
its four calls and its viewer throughout, drained and exited cleanly. The soak's own
schedule (a speaker's words every half minute, a sample every 5 s) is its workload; what
it waits for (a call's first frame, the sessions' ends) it waits for as conditions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import ClientSession
from prometheus_client.parser import text_string_to_metric_families

import lipstream_client as lc
from benchmarks.soak import HEADER, slice_row, soak, targets
from tests.live_calls import TIMEOUT_S, until
from tests.server_process import lipstream_serve

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("loopback")
async def test_three_minutes_of_calls_leave_nothing_behind(tmp_path: Path) -> None:
    run = await soak(tmp_path, minutes=3, slice_minutes=1)
    table = "\n".join(
        [" | ".join(HEADER), *(" | ".join(map(str, slice_row(s))) for s in run.slices)]
    )
    missed = [t.line() for t in targets(run) if not t.ok]
    assert not missed, "\n".join([*missed, table])
    assert len(run.slices) == 3
    for s in run.slices:  # the cast was whole whenever it was counted
        assert {(r.sessions, r.viewers) for r in s.settled} == {(4, 1)}, table
    assert run.exit_status == 0, "the server did not drain and exit cleanly"
    assert run.after is not None
    assert run.after.tasks <= run.before.tasks + 2, (run.before, run.after)
    assert run.after.fds <= run.before.fds + 1, (run.before, run.after)


async def _threads(http: ClientSession) -> float | None:
    """``lipstream_threads`` once the server has no session left, else None."""
    async with http.get("/metrics") as response:
        text = await response.text()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return None if values["lipstream_sessions_live"] else values["lipstream_threads"]


@pytest.mark.usefixtures("loopback")
async def test_calls_that_end_give_their_threads_back(tmp_path: Path) -> None:
    """What the soak found: an ended call's codecs (two FFmpeg filter graphs, two threads
    each) stayed until Python's next full collection, four threads more per call."""
    async with lipstream_serve(tmp_path, server={"ice_loopback_only": "true"}) as server:
        base_url = f"http://127.0.0.1:{server.port}"
        after: list[float] = []
        for _ in range(3):
            call = await lc.connect(base_url, "demo", data_channel=False, timeout_s=TIMEOUT_S)
            try:
                await until(lambda c=call: c.stats.video_frames > 0, "the call's first frame")
            finally:
                await call.hang_up()
            after.append(await until(lambda: _threads(server.http), "the session's end"))
        # A pool may start a thread late (the slack of one); each call's codecs were four.
        assert after[2] <= after[0] + 1, after
