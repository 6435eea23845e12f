"""The parts of a call's link, each decision by value: ladder, pacer, probes, rates."""

from __future__ import annotations

import itertools
import math

import pytest

from streaming.link.bandwidth import BandwidthEstimator
from streaming.link.delay_based import DelayDetector, QueueGuard, Usage
from streaming.link.estimate import LossBasedRate, RateControl, RateLimits, RembRate
from streaming.link.feedback import FeedbackResult, SentPackets
from streaming.link.history import SendHistory
from streaming.link.ladder import (
    DOWN_HOLD_S,
    QP_FRAMES,
    UP_HOLD_S,
    Ladder,
    steps_for,
)
from streaming.link.pacer import BURST_S, MAX_WAIT_S, Pacer
from streaming.link.probes import (
    FIRST_INTERVAL_S,
    MAX_INTERVAL_S,
    QUIET_S,
    RECOVER_INTERVAL_S,
    ProbePlanner,
)
from streaming.link.rtcp_bytes import TransportFeedback

LIMITS = RateLimits(min_bps=50_000, max_bps=2_000_000, start_bps=1_000_000)

# -- the ladder ------------------------------------------------------------------------


def test_the_ladder_of_a_720p_avatar() -> None:
    steps = steps_for(1280, 720, 25, 2_500_000)
    assert [(s.width, s.height, s.fps) for s in steps] == [
        (1280, 720, 25),
        (960, 540, 25),
        (640, 360, 25),
        (480, 270, 25),
        (480, 270, 15),
    ]
    assert [s.name for s in steps] == ["720p25", "540p25", "360p25", "270p25", "270p15"]
    assert steps[0].ceiling_bps == 2_500_000
    assert steps[1].ceiling_bps == round(2_500_000 * 0.75**2)  # by pixel rate
    assert steps[0].floor_bps == round(0.006 * 1280 * 720 * 25)
    assert all(a.floor_bps > b.floor_bps for a, b in itertools.pairwise(steps))


def test_a_small_avatar_keeps_only_sizes_of_90_lines_or_more() -> None:
    assert [s.height for s in steps_for(320, 180, 25, 400_000)] == [180, 136, 90, 90]


def fill_qp(ladder: Ladder, qp: float) -> None:
    for _ in range(QP_FRAMES):
        ladder.frame_qp(qp)


def test_the_ladder_steps_down_at_once_on_its_floor_and_on_a_coarse_picture() -> None:
    ladder = Ladder(steps_for(1280, 720, 25, 2_500_000))
    assert ladder.decide(2_000_000, 0.0).name == "720p25"
    assert ladder.decide(100_000, 1.0).name == "540p25"  # under 720p's floor (138k)
    fill_qp(ladder, 38.0)  # the budget buys a coarse 540p
    assert ladder.decide(500_000, 2.0).name == "360p25"
    assert ladder.qp is None  # a new step judges its own frames
    assert ladder.bitrate(900_000) == steps_for(1280, 720, 25, 2_500_000)[2].ceiling_bps


def test_the_ladder_steps_up_only_after_a_hold_with_a_fine_picture() -> None:
    ladder = Ladder(steps_for(1280, 720, 25, 2_500_000))
    ladder.decide(100_000, 0.0)  # down to 540p
    fill_qp(ladder, 20.0)
    assert ladder.decide(2_000_000, 1.0).name == "540p25"  # starts the hold
    assert ladder.decide(2_000_000, DOWN_HOLD_S - 0.1).name == "540p25"  # a down is recent
    assert ladder.decide(2_000_000, DOWN_HOLD_S + UP_HOLD_S).name == "720p25"
    # coarse pictures (QP over QP_LOW) do not go up, whatever the budget
    ladder = Ladder(steps_for(1280, 720, 25, 2_500_000))
    ladder.decide(100_000, 0.0)
    fill_qp(ladder, 30.0)
    for t in range(1, 30):
        assert ladder.decide(2_000_000, float(t)).name == "540p25"


def test_a_fine_picture_steps_up_during_a_climb_but_a_coarse_one_waits_for_it_to_settle() -> None:
    # After a dip, probes climb in a chain, each lift on trial: the estimate is not
    # settled for the whole climb. 540p at its ceiling with a QP of 11 went on for 7 s
    # while the budget had room for 720p (docs/performance/networks.md).
    ladder = Ladder(steps_for(1280, 720, 25, 2_500_000))
    ladder.decide(100_000, 0.0)  # down to 540p
    fill_qp(ladder, 11.0)
    assert ladder.decide(2_000_000, DOWN_HOLD_S, settled=False).name == "540p25"  # the hold
    assert ladder.decide(2_000_000, DOWN_HOLD_S + UP_HOLD_S, settled=False).name == "720p25"
    # a coarse picture made at a budget still climbing does not step down
    fill_qp(ladder, 45.0)
    assert ladder.decide(2_000_000, 20.0, settled=False).name == "720p25"
    assert ladder.decide(2_000_000, 21.0, settled=True).name == "540p25"


def test_a_step_lost_soon_after_it_was_reached_holds_longer_next_time() -> None:
    ladder = Ladder(steps_for(1280, 720, 25, 2_500_000))
    ladder.decide(100_000, 0.0)
    fill_qp(ladder, 20.0)
    ladder.decide(2_000_000, 10.0)
    assert ladder.decide(2_000_000, 10.0 + UP_HOLD_S).name == "720p25"
    ladder.decide(100_000, 12.0)  # 720p lost 0.5 s after it came back: a bounce
    fill_qp(ladder, 20.0)
    ladder.decide(2_000_000, 20.0)
    assert ladder.decide(2_000_000, 20.0 + UP_HOLD_S).name == "540p25"
    assert ladder.decide(2_000_000, 20.0 + 2 * UP_HOLD_S).name == "720p25"
    assert ladder.changes == 4


# -- the pacer -------------------------------------------------------------------------


def test_the_pacer_spreads_a_frame_at_its_rate() -> None:
    pacer = Pacer(400_000, factor=2.5)  # 1 Mbit/s: a 1250-byte packet every 10 ms
    waits = [pacer.wait_s(1250, 0.0) for _ in range(5)]
    assert waits[0] == 0.0  # within the burst allowance
    assert waits[1:] == pytest.approx(
        [0.01 - BURST_S, 0.02 - BURST_S, 0.03 - BURST_S, 0.04 - BURST_S]
    )
    assert pacer.backlog_s(0.0) == pytest.approx(0.05)
    assert pacer.wait_s(1250, 1.0) == 0.0  # an idle link sends at once again


def test_the_pacer_never_holds_a_packet_longer_than_its_cap() -> None:
    pacer = Pacer(100_000)
    waits = [pacer.wait_s(1200, 0.0) for _ in range(200)]
    assert max(waits) == MAX_WAIT_S
    pacer.spend(100_000, 0.0)  # a retransmission burst pushes the media back
    assert pacer.wait_s(1200, 0.0) == MAX_WAIT_S


# -- probes ----------------------------------------------------------------------------


def test_probes_wait_for_quiet_and_back_off_when_they_find_nothing() -> None:
    planner = ProbePlanner(2_000_000)
    assert planner.starting
    planner.congested(0.0)
    assert planner.due(500_000, QUIET_S - 0.1) is None
    cluster = planner.due(500_000, QUIET_S + 0.1)
    assert cluster is not None
    assert (cluster.rate_bps, cluster.base_bps) == (500_000, 500_000)  # 2x in all
    assert planner.due(500_000, QUIET_S + 5) is None  # one at a time
    planner.abandon(cluster.ident)
    planner.measured(None, 500_000, 3.0)  # found the link full
    sent_at = QUIET_S + 0.1
    again = planner.due(500_000, sent_at + 2 * FIRST_INTERVAL_S - 0.1)
    assert again is None  # the interval doubled ...
    smaller = planner.due(500_000, sent_at + 2 * FIRST_INTERVAL_S + 0.1)
    assert smaller is not None
    assert smaller.rate_bps == 250_000  # ... and the next asks for less (1.5x)
    assert planner.due(1_950_000, 100.0) is None  # at the ceiling: nothing to find


def test_a_probes_lift_that_congests_counts_as_failed() -> None:
    planner = ProbePlanner(2_000_000)
    cluster = planner.due(500_000, 0.0)
    assert cluster is not None
    planner.abandon(cluster.ident)
    planner.measured(1_000_000, 500_000, 1.0)
    assert planner.succeeded == 1
    planner.congested(2.0)  # within FOOLED_WITHIN_S of the lift
    assert planner.succeeded == 0
    assert not planner.starting
    # and fooled again and again, the probes back off as if they had found nothing
    sent = []
    for tenth in range(30, 600):
        now = tenth / 10
        probe = planner.due(500_000, now)
        if probe is not None:
            sent.append(now)
            planner.abandon(probe.ident)
            planner.measured(1_000_000, 500_000, now)  # a token bucket let it through
            planner.congested(now + 1.0)  # and the lift then congested the link
    assert max(b - a for a, b in itertools.pairwise(sent)) >= MAX_INTERVAL_S - 0.2


def _failures(planner: ProbePlanner, estimate_bps: int, start: float) -> list[float]:
    """Probes sent over 60 s from ``start`` that each find the link full: when."""
    sent = []
    for tenth in range(600):
        now = start + tenth / 10
        cluster = planner.due(estimate_bps, now)
        if cluster is not None:
            sent.append(now)
            planner.abandon(cluster.ident)
            planner.measured(None, estimate_bps, now)
    return sent


def test_a_link_capped_where_it_held_is_probed_rarely_a_dropped_one_often() -> None:
    capped = ProbePlanner(2_500_000)
    capped.held(600_000, 0.0)  # the link carried 600 kbit/s, and nothing more since
    rarely = _failures(capped, 580_000, 0.0)
    assert max(b - a for a, b in itertools.pairwise(rarely)) >= MAX_INTERVAL_S - 0.2
    assert len(rarely) <= 8  # 1, 2, 4, 8, 16, 16 ... s apart
    dropped = ProbePlanner(2_500_000)
    dropped.held(2_400_000, 0.0)  # it carried 2.4 Mbit/s a moment ago, 500 kbit/s now
    often = _failures(dropped, 500_000, 0.0)
    gaps = [b - a for a, b in itertools.pairwise(often)]
    assert max(gaps[: len(gaps) // 2]) <= RECOVER_INTERVAL_S + 0.2  # while that is recent
    late = _failures(dropped, 500_000, 60.0)  # a minute on, the drop is what the link is
    assert len(late) <= 8


def test_a_link_that_loses_everything_keeps_only_the_last_half_second_of_losses() -> None:
    estimator = BandwidthEstimator(LIMITS, transport_cc=True)
    sent_at = 0.0
    for tenth in range(600):  # 60 s of feedback, each reporting 20 packets lost
        lost = [(sent_at + i / 200, 1200) for i in range(20)]
        sent_at += 0.1
        estimator.transport_feedback(FeedbackResult([], 20, {}, lost), tenth / 10)
    assert len(estimator._recent_lost) <= 0.5 * 200 + 20  # TRIAL_WINDOW_S of them


# -- rates -----------------------------------------------------------------------------


def test_overuse_cuts_to_085_of_what_was_received_and_holds() -> None:
    control = RateControl(LIMITS)
    assert control.update(Usage.OVERUSE, 800_000, 0.05, 0.0) == 680_000
    assert control.update(Usage.UNDERUSE, 800_000, 0.05, 0.1) == 680_000  # draining: hold
    grown = control.update(Usage.NORMAL, 800_000, 0.05, 1.1)  # back to increase, for 1 s
    assert 680_000 < grown < 700_000  # near the capacity: slow additive growth


def test_an_application_limited_overuse_backs_off_from_the_estimate_once_per_response() -> None:
    # what arrived while the avatar listened measured the sender: 0.85 x the 200 kbit/s
    # it sent would be no estimate of the link
    control = RateControl(LIMITS)
    assert control.update(Usage.OVERUSE, 200_000, 0.05, 0.0, app_limited=True) == 850_000
    assert control.update(Usage.OVERUSE, 200_000, 0.05, 0.2, app_limited=True) == 850_000
    assert control.update(Usage.OVERUSE, 200_000, 0.05, 0.35, app_limited=True) == 722_500
    assert control.update(Usage.OVERUSE, 800_000, 0.05, 0.4) == 680_000  # a measured cut


def test_growth_stops_at_a_margin_over_what_was_received() -> None:
    control = RateControl(LIMITS)
    for second in range(1, 30):
        rate = control.update(Usage.NORMAL, 400_000, 0.05, float(second))
    assert rate == max(1_000_000, round(1.25 * 400_000 + 10_000))  # never below its start


@pytest.mark.parametrize(
    ("loss", "expected"), [(0.01, 2_000_000), (0.05, 2_000_000), (0.20, 900_000)]
)
def test_loss_holds_between_2_and_10_percent_and_cuts_above(loss: float, expected: int) -> None:
    rate = LossBasedRate(LIMITS)
    assert rate.update(loss, 1_000_000, 0.05, 0.0) == expected


def test_a_remb_is_followed_down_when_it_drops_or_stays_under_what_is_sent() -> None:
    remb = RembRate(LIMITS)
    assert remb.rate == 2_000_000  # a full start, as without any REMB
    assert remb.update(300_000, 250_000, 0.0) == 2_000_000  # lagging: above what we send
    assert remb.update(320_000, 250_000, 0.2) == 2_000_000
    assert remb.update(200_000, 250_000, 0.4) == 200_000  # a drop: the caller's overuse
    assert remb.update(900_000, 200_000, 0.6) == 900_000  # above ours: taken
    assert remb.update(890_000, 1_000_000, 0.8) == 900_000  # not a drop; under what we send
    assert remb.update(890_000, 1_000_000, 1.5) == 900_000
    assert remb.update(890_000, 1_000_000, 1.9) == 890_000  # ... for a second: followed


# -- delay -----------------------------------------------------------------------------


def feed(detector: DelayDetector, extra_per_group_ms: float, groups: int = 60) -> Usage:
    usage = Usage.NORMAL
    for g in range(groups):
        send = g * 0.02
        usage = detector.add(send, 1.0 + send + g * extra_per_group_ms / 1000, 1200)
    return usage


def test_a_growing_queue_is_overuse_and_a_steady_path_is_normal() -> None:
    assert feed(DelayDetector(), 0.0) is Usage.NORMAL
    assert feed(DelayDetector(), 2.0) is Usage.OVERUSE  # 2 ms more queue every 20 ms
    assert feed(DelayDetector(), -2.0) is Usage.UNDERUSE


def test_a_standing_queue_is_seen_without_a_trend() -> None:
    guard = QueueGuard()
    for i in range(100):
        guard.add(i * 0.01, 5.0 + i * 0.01)  # the path's own delay
    assert guard.queue_s == pytest.approx(0.0)
    for i in range(100, 200):
        guard.add(i * 0.01, 5.1 + i * 0.01)  # 100 ms more, steady
    assert guard.queue_s == pytest.approx(0.1, abs=0.001)
    assert not guard.standing(0.0)
    assert guard.standing(0.6)


# -- what was sent ---------------------------------------------------------------------


def test_feedback_names_each_packet_once_and_the_lost_ones() -> None:
    sent = SentPackets()
    for i in range(10):
        assert sent.sent(i * 0.01, 1000, cluster=7 if i >= 8 else None) == i
    first = sent.resolve(TransportFeedback(0, 0, (1.0, 1.01, None, 1.03)))
    assert [a.sequence for a in first.arrivals] == [0, 1, 3]
    assert (first.lost, first.lost_clusters) == (1, {})
    again = sent.resolve(TransportFeedback(3, 1, (1.03, 1.04, None, None, None, 1.08, None)))
    assert [a.sequence for a in again.arrivals] == [4, 8]  # 3 was reported already
    assert (again.lost, again.lost_clusters) == (3, {})  # 5, 6, 7; 9 not yet known


def test_transport_sequence_numbers_wrap() -> None:
    sent = SentPackets()
    for i in range(70_000):
        sent.sent(i * 0.001, 100)
    assert sent.next_sequence() == 70_000 % 65536
    result = sent.resolve(TransportFeedback((69_990) % 65536, 0, (70.0,) * 10))
    assert [a.sequence for a in result.arrivals] == list(range(69_990, 70_000))


def test_a_packet_is_resent_at_most_once_a_round_trip_and_within_budget() -> None:
    history = SendHistory()
    for sequence in range(100):
        history.add(sequence, bytes(1000), 0.0)
    assert history.for_resend(5, 0.1, 0.05, 1_000_000) is not None
    assert history.for_resend(5, 0.12, 0.05, 1_000_000) is None  # on its way
    assert history.for_resend(5, 0.2, 0.05, 1_000_000) is not None
    assert history.for_resend(500, 0.2, 0.05, 1_000_000) is None  # never sent
    resent = [history.for_resend(s, 0.3, 0.05, 80_000) for s in range(10, 30)]
    assert sum(r is not None for r in resent) == 8  # 80 kbit in a second, less 2 sent
    history.add(100, bytes(1000), 10.0)  # 1.5 s later the old ones are gone
    assert len(history) == 1
    assert math.isclose(history.resent, 10)


def test_the_history_is_bounded_by_time_and_count_as_packets_come() -> None:
    history = SendHistory()
    for sequence in range(5000):  # all within KEEP_S: the count bounds it
        history.add(sequence, bytes(10), sequence * 0.0001)
    assert len(history) == 4096
    assert history.latest(1) == [bytes(10)]
    for step in range(40):  # 25 packets a second: time bounds it, oldest first
        history.add(5000 + step, bytes([step]), 1.0 + step * 0.04)
    assert len(history) == sum(1.0 + s * 0.04 >= 2.56 - 1.5 for s in range(40))  # the last 1.5 s
    assert history.latest(1) == [bytes([39])]
    history.add(5000 + 39, b"again", 2.6)  # a number that came round again: the new one
    assert history.latest(1) == [b"again"]
