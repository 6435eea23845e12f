"""GET /metrics on the real app, and the event seam the inference core reports through."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from config.settings import Settings
from inference_core.avatars.locator import AvatarLocator
from inference_core.exceptions import ModelLoadError
from inference_core.serving.core import InferenceCore
from inference_core.serving.frame_request import FrameRequest
from inference_core.serving.scheduler import DeviceScheduler
from streaming.live.reporting import SENDING, STAGES
from streaming.live.tasks import END_REASONS
from streaming.live.tasks import STAGES as TASK_STAGES
from tests.live_calls import until
from tests.packages import make_package
from tests.snapshots import link_snapshot
from tests.test_scheduler import FakeClock, RecordingRunner, frame, settle
from tests.webrtc_client import Caller
from web.app import build_app
from web.app_keys import SESSIONS
from web.link_metrics import MODES as LINK_MODES
from web.link_metrics import STEPS as LINK_STEPS
from web.schemas.base import SessionKind

DEVICES = ("cpu:0", "cpu:1")
VISUAL = (6, 320, 320)
AUDIO = (32, 16, 16)
# Every label a family may carry, and the values it may take ("le" is a bucket bound).
DROP_REASONS = {
    "deadline",
    "queue_full",
    "shutting_down",
    "overload",
    "late",
    "not_ready",
    "error",
    "model_unloaded",
}
ALLOWED_LABELS = {
    "device": set(DEVICES),
    # frames dropped, models evicted, and sessions ended (streaming/live/tasks.py)
    "reason": DROP_REASONS
    | {"capacity", "idle", "admin", "other"}
    | set(END_REASONS)
    | {f"{stage} failed" for stage in TASK_STAGES},
    "event": {"started", "ended", "rejected", "failed"},
    "stage": set(STAGES) | set(SENDING),
    "source": {"shared", "encoded"},
    "kind": set(get_args(SessionKind)),
    # the calls' links (web/link_metrics.py)
    "step": set(LINK_STEPS),
    "mode": set(LINK_MODES),
    "outcome": {"answered", "ignored", "succeeded", "other"},
}
FAMILIES = {
    "counter": [
        "lipstream_sessions",
        "lipstream_sessions_ended",
        "lipstream_frames_served",
        "lipstream_frames_inferred",
        "lipstream_frames_dropped",
        "lipstream_device_frames_dropped",
        "lipstream_inference_frames",
        "lipstream_inference_failed_frames",
        "lipstream_inference_batches",
        "lipstream_inference_busy_seconds",
        "lipstream_model_evictions",
        "lipstream_model_loads",
        "lipstream_model_load_failures",
        "lipstream_background_cache_hits",
        "lipstream_background_cache_misses",
        "lipstream_background_cache_evictions",
        "lipstream_frames_sent_by_source",
        "lipstream_idle_loops_built",
        "lipstream_idle_loop_evictions",
        "lipstream_idle_loop_build_failures",
        "lipstream_link_nacks",
        "lipstream_link_retransmitted_packets",
        "lipstream_link_keyframe_requests",
        "lipstream_link_step_changes",
        "lipstream_link_probes",
    ],
    "gauge": [
        "lipstream_sessions_live",
        "lipstream_sessions_callerless",
        "lipstream_sessions_by_kind",
        "lipstream_viewers",
        "lipstream_outputs",
        "lipstream_queue_depth",
        "lipstream_queue_capacity",
        "lipstream_frames_in_flight",
        "lipstream_device_workers",
        "lipstream_models_registered",
        "lipstream_models_failed",
        "lipstream_models_loaded",
        "lipstream_models_loading",
        "lipstream_device_model_memory_bytes",
        "lipstream_device_memory_used_bytes",
        "lipstream_device_memory_total_bytes",
        "lipstream_background_cache_bytes",
        "lipstream_background_cache_max_bytes",
        "lipstream_background_cache_entries",
        "lipstream_idle_loop_cache_bytes",
        "lipstream_idle_loop_cache_max_bytes",
        "lipstream_idle_loops",
        "lipstream_idle_loops_building",
        "lipstream_link_calls_by_step",
        "lipstream_link_calls_by_mode",
        # the process's own (web/process_metrics.py)
        "lipstream_event_loop_tasks",
        "lipstream_threads",
        "process_resident_memory_bytes",
        "process_open_fds",
    ],
    "histogram": [
        "lipstream_queue_wait_seconds",
        "lipstream_batch_inference_seconds",
        "lipstream_frame_delay_seconds",
        "lipstream_frame_stage_seconds",
        "lipstream_model_load_seconds",
        "lipstream_inference_batch_size",
        # gauge histograms (web/link_metrics.py): the 0.0.4 text format types them
        # histogram, their samples _bucket, _gcount and _gsum
        "lipstream_link_estimate_bits_per_second",
        "lipstream_link_rtt_seconds",
        "lipstream_link_loss_ratio",
    ],
}


def _settings(root: Path) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
            "devices": {"kind": "cpu", "count": 2, "workers_per_device": 2},
            "batching": {"max_batch_size": 2, "max_wait_ms": 2},
        }
    )


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[TestClient[object, object]]:
    root = tmp_path / "avatars"
    make_package(root / "alice")
    broken = make_package(root / "broken")
    (broken / "lipsync.onnx").write_bytes(b"not an onnx model")
    async with TestClient(TestServer(build_app(_settings(root)))) as test_client:
        yield test_client


async def scrape(client: TestClient[object, object]) -> dict[str, Metric]:
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {family.name: family for family in text_string_to_metric_families(await response.text())}


def value(families: dict[str, Metric], sample: str, **labels: str) -> float:
    """The sum of the samples named ``sample`` whose labels include ``labels``."""
    return sum(
        s.value
        for family in families.values()
        for s in family.samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def infer_body(n: int) -> bytes:
    rng = np.random.default_rng(n)
    visual = rng.random((n, *VISUAL), dtype=np.float32)
    audio = rng.normal(0, 1, (n, *AUDIO)).astype(np.float32)
    return visual.astype("<f4").tobytes() + audio.astype("<f4").tobytes()


def assert_labels_bounded(families: dict[str, Metric], forbidden: Sequence[str]) -> None:
    for family in families.values():
        for sample in family.samples:
            for key, label in sample.labels.items():
                assert label not in forbidden, (sample.name, key, label)
                if key == "le":
                    float(label)  # a bucket bound, never a name
                else:
                    assert label in ALLOWED_LABELS[key], (sample.name, key, label)


async def test_every_family_is_served_before_any_traffic(
    client: TestClient[object, object],
) -> None:
    families = await scrape(client)
    for kind, names in FAMILIES.items():
        for name in names:
            assert name in families, name
            assert families[name].type == kind, name
    for device in DEVICES:
        assert value(families, "lipstream_queue_depth", device=device) == 0
        assert value(families, "lipstream_device_workers", device=device) == 2
        assert value(families, "lipstream_device_memory_used_bytes", device=device) > 0
        assert value(families, "lipstream_batch_inference_seconds_count", device=device) == 0
    assert value(families, "lipstream_models_registered") == 2
    assert value(families, "lipstream_models_loaded") == 0
    assert value(families, "lipstream_sessions_live") == 0
    assert value(families, "lipstream_sessions_total", event="started") == 0
    assert "lipstream_cpu_seconds_per_frame" not in families  # nothing sent, nothing measured
    for stage in STAGES:  # every stage's series is there, at zero, before any frame
        assert any(
            s.name == "lipstream_frame_stage_seconds_count" and s.labels == {"stage": stage}
            for s in families["lipstream_frame_stage_seconds"].samples
        ), stage
        assert value(families, "lipstream_frame_stage_seconds_count", stage=stage) == 0


async def test_the_measured_cpu_per_frame_is_served_once_there_is_one(
    client: TestClient[object, object],
) -> None:
    meter = client.app[SESSIONS].cpu_meter  # type: ignore[index]
    meter.ms_per_frame = lambda: 21.5  # type: ignore[method-assign]
    families = await scrape(client)
    assert families["lipstream_cpu_seconds_per_frame"].type == "gauge"
    assert value(families, "lipstream_cpu_seconds_per_frame") == pytest.approx(0.0215)
    stats = await (await client.get("/admin/stats")).json()
    assert stats["global"]["cpu_ms_per_frame"] == 21.5


async def test_the_process_figures_follow_its_tasks_threads_and_files(
    client: TestClient[object, object], tmp_path: Path
) -> None:
    """What a leak would make climb: each of these comes back once what it counted ends."""
    before = await scrape(client)
    assert value(before, "process_resident_memory_bytes") > 0
    released = asyncio.Event()
    tasks = [asyncio.create_task(released.wait(), name=f"parked-{n}") for n in range(5)]
    thread_go = threading.Event()
    thread = threading.Thread(target=thread_go.wait, name="parked-thread")
    thread.start()
    files = [(tmp_path / f"open-{n}").open("wb") for n in range(3)]
    try:
        during = await scrape(client)
    finally:
        released.set()
        await asyncio.gather(*tasks)
        thread_go.set()
        thread.join(timeout=10)
        for file in files:
            file.close()
    after = await scrape(client)
    # Each scrape counts its own request's task: the same in all three.
    tasks_before = value(before, "lipstream_event_loop_tasks")
    assert value(during, "lipstream_event_loop_tasks") == tasks_before + 5
    assert value(after, "lipstream_event_loop_tasks") == tasks_before
    threads_before = value(before, "lipstream_threads")
    assert value(during, "lipstream_threads") == threads_before + 1
    assert value(after, "lipstream_threads") == threads_before
    fds_before = value(before, "process_open_fds")
    assert value(during, "process_open_fds") == fds_before + 3
    assert value(after, "process_open_fds") == fds_before


async def test_raw_frames_move_the_inference_counters_and_histograms(
    client: TestClient[object, object],
) -> None:
    response = await client.post("/v1/infer/alice?batch_size=5", data=io.BytesIO(infer_body(5)))
    assert response.status == 200, await response.text()
    device = response.headers["X-Lipstream-Device"]
    families = await scrape(client)

    assert value(families, "lipstream_inference_frames_total", device=device) == 5
    assert value(families, "lipstream_inference_frames_total") == 5  # nothing on the other
    batches = value(families, "lipstream_inference_batches_total", device=device)
    assert 3 <= batches <= 5  # max_batch_size=2: at least three batches for five frames
    assert value(families, "lipstream_batch_inference_seconds_count", device=device) == batches
    assert value(families, "lipstream_batch_inference_seconds_sum", device=device) > 0
    assert value(families, "lipstream_queue_wait_seconds_count", device=device) == 5
    assert value(families, "lipstream_inference_batch_size_count", device=device) == batches
    assert value(families, "lipstream_inference_batch_size_sum", device=device) == 5
    assert value(families, "lipstream_inference_batch_size_bucket", device=device, le="+Inf") == (
        batches
    )
    assert value(families, "lipstream_inference_busy_seconds_total", device=device) > 0
    assert value(families, "lipstream_queue_depth", device=device) == 0

    assert value(families, "lipstream_model_loads_total") == 1
    assert value(families, "lipstream_model_loads_total", device=device) == 1
    assert value(families, "lipstream_model_load_seconds_count") == 1
    assert value(families, "lipstream_model_load_seconds_sum", device=device) > 0
    assert value(families, "lipstream_model_load_failures_total") == 0
    assert value(families, "lipstream_models_loaded", device=device) == 1
    assert value(families, "lipstream_device_model_memory_bytes", device=device) > 0
    assert_labels_bounded(families, forbidden=["alice", "broken"])


async def test_a_corrupt_model_counts_a_load_failure(client: TestClient[object, object]) -> None:
    response = await client.post("/v1/infer/broken?batch_size=1", data=io.BytesIO(infer_body(1)))
    assert response.status == 500
    families = await scrape(client)
    assert value(families, "lipstream_model_load_failures_total") == 1
    assert value(families, "lipstream_models_failed") == 1
    assert value(families, "lipstream_model_loads_total") == 0
    assert value(families, "lipstream_model_load_seconds_count") == 0
    assert_labels_bounded(families, forbidden=["alice", "broken"])


async def test_a_live_session_feeds_frame_delays_and_session_counters(
    tmp_path: Path, loopback: None
) -> None:
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
        }
    )
    app = build_app(settings)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        caller = Caller(client)
        await caller.connect(microphone=None)
        try:
            await caller.wait_for_frames(5)
            session_id = caller.session_id
            said = await client.post(f"/sessions/{session_id}/say", json={"text": "hello there"})
            assert said.status == 202, await said.text()

            async def lip_synced_frames() -> dict[str, Metric] | None:
                families = await scrape(client)
                composed = value(families, "lipstream_frame_delay_seconds_count")
                sent = value(families, "lipstream_frame_stage_seconds_count", stage="encode")
                return families if composed >= 5 and sent >= 1 else None

            live = await until(lip_synced_frames, "5 lip-synced frames composed, 1 sent")
            sampling = client.app[SESSIONS]._cpu_sampling  # type: ignore[index]
            assert sampling is not None
            assert not sampling.done()  # the CPU meter's window slides while the call is live
        finally:
            await caller.hang_up()
        await until(sampling.done, "the CPU meter's sampling to end with the last call")
        frames = value(live, "lipstream_frame_delay_seconds_count")
        assert frames >= 5
        assert value(live, "lipstream_frame_delay_seconds_sum") > 0
        # Every lip-synced frame is observed in every stage, and a frame's stages add up to
        # its delay (the same timestamps, docs/design/delay.md §8): the stage sums add up to
        # the total's, to float rounding, far within one frame (40 ms) per frame.
        for stage in STAGES:
            assert value(live, "lipstream_frame_stage_seconds_count", stage=stage) == frames
        assert value(live, "lipstream_frame_stage_seconds_sum", stage="inference") > 0
        stage_sums = sum(
            value(live, "lipstream_frame_stage_seconds_sum", stage=stage) for stage in STAGES
        )
        assert stage_sums == pytest.approx(
            value(live, "lipstream_frame_delay_seconds_sum"), abs=1e-6 * frames
        )
        # Once sent, each lip-synced frame's wait for its slot and its encode are observed.
        sent = value(live, "lipstream_frame_stage_seconds_count", stage="encode")
        assert 0 < sent <= frames
        assert value(live, "lipstream_frame_stage_seconds_count", stage="slot_wait") == sent
        assert value(live, "lipstream_frame_stage_seconds_sum", stage="encode") > 0
        assert value(live, "lipstream_sessions_live") == 1
        assert value(live, "lipstream_sessions_by_kind", kind="call") == 1
        assert value(live, "lipstream_sessions_by_kind", kind="livekit") == 0
        assert value(live, "lipstream_frames_served_total") > 0
        assert value(live, "lipstream_frames_inferred_total") > 0
        assert value(live, "lipstream_background_cache_entries") > 0
        # The demo model was loaded by the session, after the metrics were attached.
        assert value(live, "lipstream_model_loads_total") == 1
        # The call's link: one call at some ladder step and mode, its estimate in the spread.
        assert value(live, "lipstream_link_calls_by_step") == 1
        assert value(live, "lipstream_link_calls_by_mode") == 1
        assert value(live, "lipstream_link_estimate_bits_per_second_gcount") == 1
        assert value(live, "lipstream_link_estimate_bits_per_second_gsum") > 0
        assert_labels_bounded(live, forbidden=[session_id, "demo"])

        ended = await scrape(client)
        assert value(ended, "lipstream_sessions_live") == 0
        assert value(ended, "lipstream_sessions_total", event="started") == 1
        assert value(ended, "lipstream_sessions_total", event="ended") == 1
        assert value(ended, "lipstream_sessions_ended_total", reason="hung up by API") == 1
        assert value(ended, "lipstream_link_calls_by_step") == 0
        assert value(ended, "lipstream_link_estimate_bits_per_second_gcount") == 0
        assert_labels_bounded(ended, forbidden=[session_id, "demo"])


# -- the event seam, without prometheus ------------------------------------------------


class RecordingEvents:
    """A :class:`~inference_core.serving.events.CoreEvents` that keeps everything it hears."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[tuple[str, int, list[float], float]] = []
        self.loads: list[tuple[str, float]] = []
        self.load_failures = 0

    def batch_done(
        self, device: str, batch_size: int, queue_waits_s: Sequence[float], run_s: float
    ) -> None:
        with self.lock:
            self.batches.append((device, batch_size, list(queue_waits_s), run_s))

    def model_loaded(self, device: str, seconds: float) -> None:
        with self.lock:
            self.loads.append((device, seconds))

    def model_load_failed(self) -> None:
        with self.lock:
            self.load_failures += 1


@pytest.fixture
def stopped_after() -> Iterator[list[DeviceScheduler]]:
    schedulers: list[DeviceScheduler] = []
    yield schedulers
    for scheduler in schedulers:
        scheduler.stop(timeout=10)


async def test_scheduler_reports_each_batch_with_its_queue_waits(
    stopped_after: list[DeviceScheduler],
) -> None:
    clock = FakeClock()
    events = RecordingEvents()
    scheduler = DeviceScheduler(
        "cpu:7",
        workers=1,
        queue_size=8,
        max_batch_size=2,
        max_wait_ms=0,
        clock=clock,
        events=events,
    )
    stopped_after.append(scheduler)
    runner = RecordingRunner("m")
    requests: list[FrameRequest] = []
    for i in range(3):  # queued before the worker starts: waits are exact on the fake clock
        requests.append(frame("m", clock.now + 100, value=i))
        scheduler.submit(requests[-1], runner)
        clock.advance(0.010)
    scheduler.start()
    await settle(requests)
    scheduler.stop(timeout=10)  # joins the worker: every batch_done call has happened

    assert [(device, size) for device, size, _, _ in events.batches] == [("cpu:7", 2), ("cpu:7", 1)]
    waits = [w for _, _, batch_waits, _ in events.batches for w in batch_waits]
    assert waits == pytest.approx([0.030, 0.020, 0.010])
    assert [run_s for *_, run_s in events.batches] == [0.0, 0.0]  # the fake clock stood still
    stats = scheduler.stats()
    assert stats.batches == len(events.batches)
    assert stats.completed == sum(size for _, size, _, _ in events.batches)


async def test_scheduler_reports_failed_batches_too(stopped_after: list[DeviceScheduler]) -> None:
    events = RecordingEvents()
    scheduler = DeviceScheduler(
        "cpu:7", workers=1, queue_size=8, max_batch_size=4, max_wait_ms=0, events=events
    )
    stopped_after.append(scheduler)
    scheduler.start()
    runner = RecordingRunner("m", errors=[RuntimeError("boom")])
    request = frame("m", time.monotonic() + 100)
    scheduler.submit(request, runner)
    [outcome] = await settle([request])
    assert isinstance(outcome, Exception)
    scheduler.stop(timeout=10)
    assert [(d, n, len(w)) for d, n, w, _ in events.batches] == [("cpu:7", 1, 1)]


async def test_core_reports_loads_failures_and_batches_to_its_events(tmp_path: Path) -> None:
    make_package(tmp_path / "alice")
    (make_package(tmp_path / "broken") / "lipsync.onnx").write_bytes(b"corrupt")
    events = RecordingEvents()
    core = InferenceCore(_settings(tmp_path), AvatarLocator(tmp_path), events=events)
    await core.start()
    try:
        with pytest.raises(ModelLoadError):
            await core.open("broken")
        async with await core.open("alice") as alice:
            rng = np.random.default_rng(0)
            visual = rng.random((3, *VISUAL), dtype=np.float32)
            audio = rng.normal(0, 1, (3, *AUDIO)).astype(np.float32)
            await alice.infer(visual, audio, timeout_s=10)
            device = alice.device.name
    finally:
        await core.stop()  # joins the workers: every hook has been called
    assert events.load_failures == 1
    assert [d for d, _ in events.loads] == [device]
    assert all(seconds > 0 for _, seconds in events.loads)
    assert {d for d, *_ in events.batches} == {device}
    assert sum(n for _, n, _, _ in events.batches) == 3
    assert all(len(waits) == n for _, n, waits, _ in events.batches)


# -- the calls' links ------------------------------------------------------------------


def _link(step_index: int, mode: str, estimate_bps: int, rtt_ms: float | None, loss: float) -> Any:
    return link_snapshot(
        mode=mode,
        estimate_bps=estimate_bps,
        rtt_ms=rtt_ms,
        loss=loss,
        step_index=step_index,
        step_changes=step_index,
    )


def test_link_metrics_spread_the_live_calls_and_count_ended_ones() -> None:
    from streaming.live.snapshot import LinkTotals
    from web.link_metrics import link_metrics

    live = [
        _link(0, "transport-cc", 2_000_000, 40.0, 0.0),
        _link(2, "transport-cc", 500_000, 150.0, 0.03),
        _link(4, "remb", 200_000, None, 0.15),
    ]
    ended = LinkTotals()
    ended.add(_link(1, "loss", 1_000_000, 20.0, 0.0))
    totals = ended.plus([*live, None])
    assert ended.nacks == 10  # plus() left the ended calls' totals alone
    families = {m.name: m for m in link_metrics(live, totals)}

    def sample(name: str, suffix: str = "", **labels: str) -> float:
        return sum(
            s.value
            for s in families[name].samples
            if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
        )

    assert [sample("lipstream_link_calls_by_step", step=s) for s in LINK_STEPS] == [1, 0, 1, 0, 1]
    assert sample("lipstream_link_calls_by_mode", mode="transport-cc") == 2
    assert sample("lipstream_link_calls_by_mode", mode="loss") == 0
    estimate = "lipstream_link_estimate_bits_per_second"
    assert sample(estimate, "_bucket", le="300000.0") == 1
    assert sample(estimate, "_bucket", le="600000.0") == 2
    assert sample(estimate, "_bucket", le="+Inf") == 3
    assert sample(estimate, "_gsum") == 2_700_000
    rtt = "lipstream_link_rtt_seconds"
    assert sample(rtt, "_bucket", le="+Inf") == 2  # the call without a round trip yet is left out
    assert sample(rtt, "_bucket", le="0.05") == 1
    assert sample("lipstream_link_loss_ratio", "_bucket", le="0.05") == 2
    assert sample("lipstream_link_nacks", "_total") == 40
    assert sample("lipstream_link_keyframe_requests", "_total", outcome="answered") == 8
    assert sample("lipstream_link_keyframe_requests", "_total", outcome="ignored") == 4
    assert sample("lipstream_link_probes", "_total", outcome="succeeded") == 12
    assert sample("lipstream_link_step_changes", "_total") == 7
