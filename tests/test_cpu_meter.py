"""The process's CPU per frame sent, as admission reads it: a figure only once enough
frames went out, over a recent window, from counters (injected clocks, no threads)."""

from __future__ import annotations

import pytest

from streaming.live.cpu_meter import CpuMeter


class Counters:
    """A process whose clock, CPU time and frames sent the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 5.0
        self.frames = 0

    def run(self, seconds: float, *, fps: int, cpu_ms_per_frame: float) -> None:
        """``seconds`` of calls sending ``fps`` frames a second in all, sampled each second."""
        for _ in range(int(seconds)):
            self.now += 1.0
            self.frames += fps
            self.cpu += fps * cpu_ms_per_frame / 1000.0


def _meter(c: Counters, **kwargs: float) -> CpuMeter:
    return CpuMeter(lambda: c.frames, cpu=lambda: c.cpu, clock=lambda: c.now, **kwargs)  # type: ignore[arg-type]


def test_no_figure_until_enough_frames_were_sent() -> None:
    c = Counters()
    meter = _meter(c, min_frames=125)
    assert meter.ms_per_frame() is None  # nothing sent yet
    c.run(4, fps=25, cpu_ms_per_frame=20.0)
    assert meter.ms_per_frame() is None  # 100 frames: too few to mean something
    c.run(1, fps=25, cpu_ms_per_frame=20.0)
    assert meter.ms_per_frame() == pytest.approx(20.0)


def test_the_figure_follows_the_recent_window() -> None:
    c = Counters()
    meter = _meter(c, window_s=10.0, min_frames=50)
    for _ in range(30):  # an expensive spell, read every second
        c.run(1, fps=50, cpu_ms_per_frame=30.0)
        meter.ms_per_frame()
    assert meter.ms_per_frame() == pytest.approx(30.0)
    for _ in range(15):  # then frames get cheaper: the old spell leaves the window
        c.run(1, fps=50, cpu_ms_per_frame=12.0)
        meter.ms_per_frame()
    assert meter.ms_per_frame() == pytest.approx(12.0)


def test_a_long_quiet_spell_gives_no_figure_from_old_calls() -> None:
    c = Counters()
    meter = _meter(c, window_s=10.0, min_frames=50)
    c.run(20, fps=25, cpu_ms_per_frame=18.0)
    assert meter.ms_per_frame() == pytest.approx(18.0)
    c.now += 600.0  # no calls for ten minutes
    c.cpu += 3.0  # what an idle server does meanwhile
    assert meter.ms_per_frame() is None  # nothing sent lately: the estimate counts
    c.run(3, fps=25, cpu_ms_per_frame=18.0)
    c.run(1, fps=25, cpu_ms_per_frame=18.0)
    meter.ms_per_frame()
    c.run(12, fps=25, cpu_ms_per_frame=18.0)
    assert meter.ms_per_frame() == pytest.approx(18.0)


def test_everything_the_process_does_counts() -> None:
    c = Counters()
    meter = _meter(c, window_s=20.0, min_frames=50)
    c.run(10, fps=25, cpu_ms_per_frame=10.0)
    c.cpu += 2.5  # a model loaded during the calls: 2.5 s of CPU over 250 frames
    assert meter.ms_per_frame() == pytest.approx(20.0)


def test_asking_often_keeps_one_sample_a_second() -> None:
    c = Counters()
    meter = _meter(c, window_s=5.0, min_frames=1)
    for _ in range(1000):  # many offers within one second
        c.now += 0.0005
        c.frames += 1
        c.cpu += 0.01
        meter.ms_per_frame()
    assert len(meter._samples) == 1  # the one taken when made: none within its second
    assert meter.ms_per_frame() == pytest.approx(10.0)
