"""Which sessions a waiting batch can still expect (inference_core.serving.arrivals)."""

from __future__ import annotations

from inference_core.serving.arrivals import JITTER_S, STALE_S, Arrivals


def test_a_session_is_expected_one_interval_after_its_last_frame() -> None:
    arrivals = Arrivals()
    arrivals.note("m", "a", 10.00)
    assert not arrivals.partner_expected("m", set(), until=10.5, now=10.01)  # no rhythm yet
    arrivals.note("m", "a", 10.04)  # 25 fps
    assert arrivals.partner_expected("m", set(), until=10.08, now=10.05)
    assert not arrivals.partner_expected("m", set(), until=10.07, now=10.05)
    assert arrivals.partner_expected("m", set(), until=10.08 - JITTER_S / 2, now=10.05)
    assert not arrivals.partner_expected("m", {"a"}, until=10.08, now=10.05)  # already in
    assert not arrivals.partner_expected("other", set(), until=11.0, now=10.05)


def test_silent_sessions_are_forgotten() -> None:
    arrivals = Arrivals()
    for i in range(100):
        arrivals.note(f"m{i % 10}", f"s{i}", 1.0)
        arrivals.note(f"m{i % 10}", f"s{i}", 1.04)
    assert len(arrivals) == 100
    arrivals.note("m0", "fresh", 1.04 + STALE_S)
    assert not arrivals.partner_expected("m1", set(), until=2.0, now=1.05 + STALE_S)
    arrivals.forget_stale(now=1.05 + STALE_S)
    assert len(arrivals) == 1  # only the session that spoke recently
