"""Session reporting: counters, the recent output rate and the snapshot's fields."""

from __future__ import annotations

import pytest

from config.settings import Settings
from streaming.live.reporting import (
    FrameSending,
    FrameStages,
    RecentRate,
    SessionReport,
    SessionStats,
    av_offset_ms,
    delay_budget,
)
from streaming.live.snapshot import AddedDelay, AppAudioState, BufferedMedia, SessionSnapshot


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_drops_are_counted_by_reason() -> None:
    stats = SessionStats()
    for reason in ("late", "overload", "late", "DeadlineExceededError"):
        stats.drop(reason)
    assert stats.frames_dropped == {"late": 2, "overload": 1, "DeadlineExceededError": 1}


def test_the_delay_budget_is_lookahead_plus_a_tick_plus_the_margin() -> None:
    budget = delay_budget(Settings())
    assert (budget.lookahead_ms, budget.tick_ms, budget.margin_ms) == (452.5, 20.0, 40.0)
    assert budget.server_ms == 512.5  # docs/design/delay.md §8
    low, high = budget.browser_extra_ms
    assert 0 < low < high
    shorter = Settings.model_validate(
        {"audio": {"right_context": 5}, "session": {"pipeline_margin_ms": 45}}
    )
    assert delay_budget(shorter).server_ms == 452.5 - 2 * 40 + 20 + 45
    assert delay_budget(Settings(), kind="mel").lookahead_ms == 212.5  # Wav2Lip's features


def test_processing_percentiles_over_the_last_500_frames() -> None:
    stats = SessionStats()
    assert stats.processing_percentiles() == (0.0, 0.0)
    for ms in range(1, 101):
        stats.processing_ms.append(float(ms))
    assert stats.processing_percentiles() == pytest.approx((50.5, 95.05))
    for _ in range(500):  # the 100 older ones fall out
        stats.processing_ms.append(200.0)
    assert stats.processing_percentiles() == (200.0, 200.0)


def test_recent_rate_is_the_average_since_start_at_first() -> None:
    rate = RecentRate()
    assert rate.update(10.0, 0, start=None) == 0.0  # no media yet
    assert rate.update(10.2, 0, start=10.2) == 0.0  # started just now
    assert rate.update(12.0, 45, start=10.0) == 22.5  # one read 2 s before: 45 in 2 s
    fresh = RecentRate()
    assert fresh.update(12.0, 45, start=10.0) == 22.5  # first read: since start


def test_recent_rate_follows_the_last_window() -> None:
    rate = RecentRate(window_s=5.0, min_span_s=0.5)
    total = 0
    for second in range(1, 21):  # 25 frames per second for 20 s
        total += 25
        assert rate.update(float(second), total, start=0.0) == 25.0
    for second in range(21, 31):  # then 10 per second
        total += 10
        value = rate.update(float(second), total, start=0.0)
    # The window reaches back to the newest sample at least 5 s old: t=25, all at 10/s.
    assert value == 10.0
    # A read 0.1 s later still measures over the window (from t=25), not over 0.1 s.
    assert rate.update(30.1, total + 1, start=0.0) == pytest.approx((10 * 5 + 1) / 5.1)


def test_recent_rate_never_measures_over_a_tiny_span() -> None:
    rate = RecentRate(window_s=5.0, min_span_s=0.5)
    assert rate.update(1.0, 25, start=0.0) == 25.0
    # 5 frames 0.1 s later would be 50/s; under min_span_s it is the average since start.
    assert rate.update(1.1, 30, start=0.0) == pytest.approx(30 / 1.1)
    assert rate.update(1.5, 35, start=0.0) == pytest.approx(10 / 0.5)


def test_av_offset_is_audio_time_minus_video_time() -> None:
    assert av_offset_ms(50, 25, fps=25) == 0.0  # both at 1.00 s
    assert av_offset_ms(50, 24, fps=25) == 40.0  # video's next frame is at 0.96 s
    assert av_offset_ms(49, 25, fps=25) == -20.0


def _report(clock: Clock, wall: Clock) -> SessionReport:
    return SessionReport(
        "s-1",
        "demo",
        "127.0.0.1",
        delay_s=0.48251,
        lookahead_ms=212.5,
        fps=25,
        clock=clock,
        wall_clock=wall,
    )


IDLE = AppAudioState(speaking=False, utterances=0, audio_stream=False, event_listeners=0)


def _snapshot(report: SessionReport, **changes: object) -> SessionSnapshot:
    values: dict[str, object] = {
        "state": "streaming",
        "frames_sent": 250,
        "frames_skipped": 2,
        "started_at": 50.0,
        "video_next_index": 252,
        "audio_next_index": 505,
        "queued_audio_s": 1.23456,
        "buffered": BufferedMedia(audio_chunks=24, frames=9, inbound_audio_ms=20.0),
        "inbound_skipped_ms": 140.04,
        "bitrate_bps": 900_000,
        "app_audio": IDLE,
        "idle_clip": "thinking",
        "clips": ["idle", "thinking"],
        "audio_skipped": 3,
    }
    values.update(changes)
    return report.snapshot(**values)  # type: ignore[arg-type]


def test_snapshot_fields() -> None:
    clock, wall = Clock(60.0), Clock(1_700_000_000.0)
    report = _report(clock, wall)
    assert report.created_at == 1_700_000_000.0
    for _ in range(3):
        report.stats.drop("late")
    report.stats.frames_inferred = 200
    for ms in ((1.0, 2.0, 5.04, 2.0), (2.0, 3.0, 10.0, 5.0), (3.0, 4.0, 20.0, 3.0)):
        report.stats.record_frame(FrameStages(*(t / 1000 for t in ms)))  # 10.04, 20 and 30 ms
    for wait_ms, encode_ms in ((60.0, 4.0), (50.0, 5.0)):  # two of them sent so far
        report.stats.record_sending(FrameSending(wait_ms / 1000, encode_ms / 1000))
    wall.now += 12.34
    snap = _snapshot(report)
    assert snap == SessionSnapshot(
        session_id="s-1",
        avatar="demo",
        state="streaming",
        uptime_s=12.3,
        frames_sent=250,
        frames_inferred=200,
        frames_shared=0,
        frames_encoded=0,
        frames_skipped=2,
        frames_dropped={"late": 3},
        delay_ms=482.5,
        lookahead_ms=212.5,
        added_delay_ms=AddedDelay(
            p50=20.0,
            p95=29.0,
            mean=20.0,
            stages={"features": 2.0, "prepare": 3.0, "inference": 11.7, "compose": 3.3},
            sending={"slot_wait": 55.0, "encode": 4.5},
        ),
        queued_audio_s=1.23,
        buffered=BufferedMedia(audio_chunks=24, frames=9, inbound_audio_ms=20.0),
        inbound_skipped_ms=140.0,
        remote="127.0.0.1",
        output_fps=25.0,  # 250 frames in the 10 s since start
        av_offset_ms=20.0,  # audio at 10.10 s, video at 10.08 s
        bitrate_bps=900_000,
        app_audio=IDLE,
        idle_clip="thinking",
        clips=["idle", "thinking"],
        audio_skipped=3,
    )
    report.stats.drop("late")
    assert snap.frames_dropped == {"late": 3}  # a copy, not the live counters


def test_snapshot_before_media_and_without_audio() -> None:
    report = _report(Clock(60.0), Clock(0.0))
    before = _snapshot(report, state="new", frames_sent=0, started_at=None, bitrate_bps=None)
    assert before.av_offset_ms is None
    assert before.output_fps == 0.0
    assert before.added_delay_ms == AddedDelay(
        p50=0.0,
        p95=0.0,
        mean=0.0,
        stages={"features": 0.0, "prepare": 0.0, "inference": 0.0, "compose": 0.0},
        sending={"slot_wait": 0.0, "encode": 0.0},
    )
    assert _snapshot(report, audio_next_index=None).av_offset_ms is None
