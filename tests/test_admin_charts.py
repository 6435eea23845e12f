"""The admin page's charts: the bounded history (web/history.py), its sampler, and the page.

Unit tests drive the ring, the series cap and the sampler with a hand-driven clock and
built snapshots. The browser test opens the admin page of the real application in
headless Debian Chromium during a real call (the demo page in another tab) and checks
that every point the charts draw is the point ``/admin/history`` serves at that time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp.test_utils import TestServer

from compositor.background_cache import CacheStats
from config.settings import Settings
from inference_core.serving.scheduler_stats import SchedulerStats, WorkerStats
from inference_core.serving.snapshot import CoreSnapshot, DeviceSnapshot
from streaming.idle_loops.cache import IdleLoopStats
from streaming.live.snapshot import AddedDelay, SessionSnapshot, SessionsSnapshot, SessionTotals
from tests.browser_page import browser_page
from tests.snapshots import link_snapshot, session_snapshot
from web.app import build_app
from web.cluster.aggregate import merged_history
from web.history import HISTORY_POINTS, MAX_SERIES, History, HistorySampler

if TYPE_CHECKING:
    from playwright.async_api import Error

# -- built snapshots ----------------------------------------------------------------------


def _device(
    name: str, *, batches: int, frames: int, busy_s: float, queue: int, workers: int = 2
) -> DeviceSnapshot:
    # The device's frames and busy time are split evenly over its workers.
    worker_list = tuple(
        WorkerStats(
            name=f"{name}/w{i}",
            batches=batches // workers,
            frames=frames // workers,
            busy_seconds=busy_s / workers,
            alive=True,
        )
        for i in range(workers)
    )
    scheduler = SchedulerStats(
        device=name,
        queue_depth=queue,
        queue_size=64,
        in_flight=0,
        submitted=frames,
        rejected=0,
        expired=0,
        failed=0,
        completed=frames,
        shut_down=0,
        dropped=0,
        batches=batches,
        mean_batch_size=frames / batches if batches else 0.0,
        batch_sizes={},
        busy_seconds=busy_s,
        busy_fraction=0.5,
        workers=worker_list,
        models={},
        workers_restarted=0,
    )
    return DeviceSnapshot(
        index=0,
        name=name,
        kind="cpu",
        models_loaded=1,
        models_loading=0,
        model_memory_bytes=0,
        max_memory_bytes=None,
        max_models=4,
        memory_used_bytes=0,
        memory_total_bytes=None,
        scheduler=scheduler,
    )


def _core(*devices: DeviceSnapshot) -> CoreSnapshot:
    return CoreSnapshot(running=True, devices=devices, models=(), evictions={})


def _live(
    sessions: list[SessionSnapshot],
    *,
    speaking: int = 0,
    shared: int = 0,
    encoded: int = 0,
    cpu: float | None = None,
) -> SessionsSnapshot:
    totals = SessionTotals(
        live=len(sessions),
        started=len(sessions),
        ended=0,
        rejected=0,
        failed=0,
        frames_sent=shared + encoded,
        frames_inferred=0,
        frames_dropped={},
        ended_by_reason={},
        frames_shared=shared,
        frames_encoded=encoded,
        cpu_ms_per_frame=cpu,
        speaking=speaking,
    )
    cache = CacheStats(hits=0, misses=0, evictions=0, bytes=0, entries=0, max_bytes=1)
    loops = IdleLoopStats(
        bytes=0, max_bytes=1, loops=0, building=0, built=0, evicted=0, failed=0, hits=0, misses=0
    )
    return SessionsSnapshot(sessions=tuple(sessions), totals=totals, cache=cache, idle_loops=loops)


def _call(session_id: str, fps: float = 25.0, p95: float = 30.0, **dropped: int) -> SessionSnapshot:
    delay = AddedDelay(p50=p95 / 2, p95=p95, mean=p95 / 2, stages={}, sending={})
    return session_snapshot(
        session_id=session_id, output_fps=fps, added_delay_ms=delay, frames_dropped=dropped
    )


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Feed:
    """Hands the sampler the snapshots a test sets, and counts its reads."""

    def __init__(self, core: CoreSnapshot, live: SessionsSnapshot) -> None:
        self.core, self.live = core, live
        self.reads = 0
        self.read_once = asyncio.Event()

    async def __call__(self) -> tuple[CoreSnapshot, SessionsSnapshot]:
        self.reads += 1
        self.read_once.set()
        return self.core, self.live


def _values(history: History, scope: str, subject: str, name: str) -> list[tuple[float, float]]:
    series = history.get((scope, subject, name))  # type: ignore[arg-type]
    assert series is not None, (scope, subject, name)
    return list(zip(series.t, series.v, strict=True))


# -- the ring and the cap -----------------------------------------------------------------


def test_a_series_keeps_its_last_points_only() -> None:
    history = History(points=HISTORY_POINTS, interval_s=2.0)
    for i in range(5000):
        history.add(("server", "server", "live_sessions"), 2.0 * i, float(i))
        history.prune(2.0 * i)
    points = _values(history, "server", "server", "live_sessions")
    assert len(points) == HISTORY_POINTS
    assert points == [(2.0 * i, float(i)) for i in range(5000 - HISTORY_POINTS, 5000)]


def test_ended_sessions_age_out_and_the_series_cap_holds() -> None:
    history = History(points=20, interval_s=2.0, max_series=60)
    # 400 sessions, each live for 30 samples, a new one every 2 samples: 15 live at once,
    # 45 live series, plus ended ones until they age out or the cap pushes them out.
    lives = {f"s{n}": range(2 * n, 2 * n + 30) for n in range(400)}
    most = 0
    for step in range(2 * 400 + 60):
        now = 2.0 * step
        live = [sid for sid, span in lives.items() if step in span]
        for sid in live:
            for name in ("fps", "delay_p95_ms", "dropped"):
                history.add(("session", sid, name), now, float(step))
        history.prune(now)
        most = max(most, len(history))
        kept = {key[1] for key, _ in history.items()}
        assert set(live) <= kept  # live sessions are never the ones dropped
        for _, series in history.items():
            assert len(series.t) <= 20
            assert now - series.last_t <= 20 * 2.0
    assert most == 60  # the cap was reached, and held
    assert len(history) == 0  # every session ended and aged out


async def test_hundreds_of_sessions_stay_within_the_cap() -> None:
    clock = Clock()
    calls = [_call(f"s{n}", late=n) for n in range(300)]  # 5 series each: 1500 wanted
    feed = Feed(_core(_device("cpu:0", batches=0, frames=0, busy_s=0, queue=0)), _live(calls))
    history = History()
    sampler = HistorySampler(history, feed, clock)
    for _ in range(HISTORY_POINTS + 50):
        await sampler.sample()
        clock.now += 2.0
    assert len(history) == MAX_SERIES
    # Past the cap the same series are kept (full rings), the device's and server's among them.
    assert all(len(series.t) == HISTORY_POINTS for _, series in history.items())
    assert {series.last_t for _, series in history.items()} == {clock.now - 2.0}
    assert history.get(("device", "cpu:0", "busy_share")) is not None
    assert history.get(("server", "server", "live_sessions")) is not None


# -- the sampler --------------------------------------------------------------------------


async def test_a_calls_link_is_charted_when_it_has_one() -> None:
    clock = Clock(1000.0)
    with_link = replace(
        _call("a"), link=link_snapshot(estimate_bps=480_000, sent_bps=455_500, loss=0.0125)
    )
    feed = Feed(
        _core(_device("cpu:0", batches=0, frames=0, busy_s=0, queue=0)),
        _live([with_link, _call("b")]),
    )
    history = History()
    await HistorySampler(history, feed, clock).sample()
    assert _values(history, "session", "a", "link_estimate_kbps") == [(1000.0, 480.0)]
    assert _values(history, "session", "a", "link_sent_kbps") == [(1000.0, 455.5)]
    assert _values(history, "session", "a", "link_loss_pct") == [(1000.0, 1.25)]
    assert history.get(("session", "a", "link_rtt_ms")) is None  # no round trip measured yet
    assert history.get(("session", "b", "link_estimate_kbps")) is None  # no link, no series


async def test_the_sampler_records_the_snapshots_figures() -> None:
    clock = Clock(1000.0)
    device = _device("cpu:0", batches=10, frames=30, busy_s=4.0, queue=3)
    feed = Feed(_core(device), _live([_call("a", fps=24.0, p95=41.25, late=2)], cpu=3.5))
    history = History()
    sampler = HistorySampler(history, feed, clock)
    assert await sampler.sample() == 1000.0
    # Two seconds later: 20 more frames in 4 batches, 1.5 more busy seconds on 2 workers.
    clock.now = 1002.0
    feed.core = _core(_device("cpu:0", batches=14, frames=50, busy_s=5.5, queue=1))
    feed.live = _live(
        [_call("a", fps=25.0, p95=38.5, late=2, not_ready=3), _call("b", fps=12.5, p95=20.0)],
        speaking=1,
        shared=50,
        encoded=10,
        cpu=4.25,
    )
    await sampler.sample()
    # The first point has no interval before it: the scheduler's own running figures.
    assert _values(history, "device", "cpu:0", "busy_share") == [(1000.0, 0.5), (1002.0, 0.375)]
    assert _values(history, "device", "cpu:0", "mean_batch") == [(1000.0, 3.0), (1002.0, 5.0)]
    assert _values(history, "device", "cpu:0", "queue_depth") == [(1000.0, 3.0), (1002.0, 1.0)]
    assert _values(history, "session", "a", "fps") == [(1000.0, 24.0), (1002.0, 25.0)]
    assert _values(history, "session", "a", "delay_p95_ms") == [(1000.0, 41.2), (1002.0, 38.5)]
    assert _values(history, "session", "a", "dropped") == [(1000.0, 2.0), (1002.0, 5.0)]
    assert _values(history, "session", "a", "dropped:late") == [(1000.0, 2.0), (1002.0, 2.0)]
    assert _values(history, "session", "a", "dropped:not_ready") == [(1002.0, 3.0)]
    assert _values(history, "session", "b", "fps") == [(1002.0, 12.5)]
    assert _values(history, "server", "server", "live_sessions") == [(1000.0, 1.0), (1002.0, 2.0)]
    assert _values(history, "server", "server", "speaking_sessions") == [
        (1000.0, 0.0),
        (1002.0, 1.0),
    ]
    assert _values(history, "server", "server", "cpu_ms_per_frame") == [
        (1000.0, 3.5),
        (1002.0, 4.25),
    ]
    assert _values(history, "server", "server", "shared_fps") == [(1002.0, 25.0)]
    assert _values(history, "server", "server", "encoded_fps") == [(1002.0, 5.0)]
    assert feed.reads == 2


async def test_the_sampler_task_starts_and_stops() -> None:
    feed = Feed(_core(), _live([]))
    sampler = HistorySampler(History(), feed, Clock())
    sampler.start()
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == "admin-history-sampler"]
    await asyncio.wait_for(feed.read_once.wait(), 10)
    await sampler.stop()
    assert task.cancelled()
    assert feed.reads >= 1
    assert sampler.history.get(("server", "server", "live_sessions")) is not None


def test_the_front_merges_the_workers_histories() -> None:
    def body(device_busy: float, live: list[tuple[float, float]], session: str) -> dict[str, Any]:
        return {
            "interval_s": 2.0,
            "points": 150,
            "max_series": 512,
            "series": [
                {
                    "scope": "device",
                    "subject": "cpu:0",
                    "name": "busy_share",
                    "t": [100.0],
                    "v": [device_busy],
                },
                {"scope": "session", "subject": session, "name": "fps", "t": [100.0], "v": [25.0]},
                {
                    "scope": "server",
                    "subject": "server",
                    "name": "live_sessions",
                    "t": [t for t, _ in live],
                    "v": [v for _, v in live],
                },
                {
                    "scope": "server",
                    "subject": "server",
                    "name": "cpu_ms_per_frame",
                    "t": [t for t, _ in live],
                    "v": [2.0 * v for _, v in live],
                },
            ],
        }

    # w1 samples 0.3 s after w0: its points fall on the same sample times.
    merged = merged_history(
        {
            "w0": body(0.25, [(100.1, 1.0), (102.1, 2.0)], "w0-a"),
            "w1": body(0.5, [(100.4, 3.0), (102.4, 1.0), (104.4, 1.0)], "w1-b"),
        }
    )
    assert (merged["interval_s"], merged["points"], merged["max_series"]) == (2.0, 150, 1024)
    got = {
        (s["scope"], s["subject"], s["name"]): list(zip(s["t"], s["v"], strict=True))
        for s in merged["series"]
    }
    assert got[("device", "w0/cpu:0", "busy_share")] == [(100.0, 0.25)]
    assert got[("device", "w1/cpu:0", "busy_share")] == [(100.0, 0.5)]
    assert got[("session", "w0-a", "fps")] == [(100.0, 25.0)]
    assert got[("session", "w1-b", "fps")] == [(100.0, 25.0)]
    assert got[("server", "w0", "live_sessions")] == [(100.1, 1.0), (102.1, 2.0)]
    assert got[("server", "server", "live_sessions")] == [(100.0, 4.0), (102.0, 3.0), (104.0, 1.0)]
    assert got[("server", "server", "cpu_ms_per_frame")] == [
        (100.0, 4.0),
        (102.0, 3.0),
        (104.0, 2.0),
    ]


# -- the page, in Chromium ----------------------------------------------------------------

# Every point the charts draw: the chart's label, the series, its time and value.
DRAWN = """() => [...document.querySelectorAll("svg.chart circle[data-value]")].map((c) => ({
  chart: c.ownerSVGElement.getAttribute("aria-label"),
  series: c.dataset.series,
  t: Number(c.dataset.t),
  v: Number(c.dataset.value),
}))"""


@pytest.fixture
async def server(tmp_path: Path, loopback: None) -> AsyncIterator[TestServer]:
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "devices": {"kind": "cpu"},
            "server": {"history_points": 600, "history_interval_s": 1.0},
        }
    )
    async with TestServer(build_app(settings), host="127.0.0.1") as test_server:
        yield test_server


@pytest.mark.slow
async def test_the_admin_page_charts_the_history_of_a_call(
    tmp_path: Path, server: TestServer
) -> None:
    from playwright.async_api import expect

    async with browser_page(tmp_path, str(server.make_url("/"))) as call:
        await call.get_by_role("button", name="Start without microphone").click()
        await call.wait_for_function(
            "() => window.lipstreamStats.state === 'connected'"
            " && window.lipstreamStats.framesDecoded > 0"
        )
        sessions = await (await call.request.get(str(server.make_url("/admin/sessions")))).json()
        [session] = sessions["sessions"]
        sid = session["id"]

        admin = await call.context.new_page()
        admin_errors: list[Error] = []
        admin.on("pageerror", lambda error: admin_errors.append(error))
        await admin.goto(str(server.make_url("/admin")))
        fps_chart = admin.get_by_role("img", name=f"session {sid} fps", exact=True)
        # Two samples of the call drawn: the call's chart has a line, not a lone point.
        await expect(fps_chart.locator("circle")).not_to_have_count(0)
        await admin.wait_for_function(
            "(label) => document.querySelector(`svg[aria-label='${label}']`)"
            ".querySelectorAll('circle').length >= 2",
            arg=f"session {sid} fps",
        )
        charts = [
            *(f"device cpu:0 {label}" for label in ("busy share", "queue depth", "mean batch")),
            *(f"session {sid} {label}" for label in ("delay p95 ms", "drops")),
            *(
                f"server server {label}"
                for label in ("sessions", "cpu ms per frame", "frames shared vs encoded")
            ),
        ]
        for chart in charts:
            await expect(admin.get_by_role("img", name=chart, exact=True)).to_be_visible()

        drawn: list[dict[str, Any]] = await admin.evaluate(DRAWN)
        history = await (await admin.request.get(str(server.make_url("/admin/history")))).json()
        assert (history["points"], history["interval_s"]) == (600, 1.0)  # the settings
        served = {
            (f"{s['scope']} {s['subject']}", s["name"]): dict(zip(s["t"], s["v"], strict=True))
            for s in history["series"]
        }
        drawn_charts = {d["chart"] for d in drawn}
        assert "device cpu:0 busy share" in drawn_charts
        assert f"session {sid} fps" in drawn_charts
        assert f"session {sid} delay p95 ms" in drawn_charts
        assert f"session {sid} link kbit/s" in drawn_charts  # Chromium's call has a link
        for point in drawn:
            subject = " ".join(point["chart"].split(" ")[:2])
            values = served[(subject, point["series"])]
            # The page drew an earlier answer: its points are still served, unchanged.
            assert values[point["t"]] == point["v"], point

        # Hovering the call's newest fps point shows its value and time.
        last = fps_chart.locator("circle").last
        await last.hover(force=True)
        tip = admin.locator("#chart-tip")
        await expect(tip).to_be_visible()
        text = await tip.text_content()
        assert text is not None
        assert text.startswith("fps "), text
        shown = float(text.split(" ")[1])
        assert shown in served[(f"session {sid}", "fps")].values()
        assert " at " in text
        await admin.close()
    assert not admin_errors, f"uncaught errors in the admin page: {admin_errors}"
