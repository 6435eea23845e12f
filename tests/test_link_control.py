"""The link controller on a simulated link (``tests/link_sim.py``): each decision by value.

Virtual time, seeded loss: what these assert holds however loaded the machine is.
"""

from __future__ import annotations

import statistics

import pytest

from streaming.link import Mode
from tests.link_sim import Bottleneck, SimulatedCall

MAX_BPS = 2_631_579  # 2.5 Mbit/s of video and its headers (no audio in these calls)


async def test_a_clean_link_climbs_from_the_start_rate_to_the_full_picture() -> None:
    call = SimulatedCall(Bottleneck(10e6))
    estimator = call.controller.estimator
    assert estimator.estimate_bps == 300_000  # where every call starts
    assert call.encoder.estimate_measured is False  # a start value, not a measurement
    await call.run(8)
    assert call.encoder.estimate_measured is True
    assert estimator.mode is Mode.TRANSPORT_CC
    assert call.encoder.steady_idle is True  # our own estimate: steady idle loops allowed
    assert estimator.estimate_bps == MAX_BPS
    assert call.encoder.target_bitrate == 2_500_000
    assert estimator.probes.succeeded >= 2  # probes did the climbing
    assert call.link.dropped == 0
    await call.close()


@pytest.mark.parametrize("capacity", [300e3, 600e3, 1.5e6])
async def test_a_capped_link_is_used_without_a_standing_queue(capacity: float) -> None:
    call = SimulatedCall(Bottleneck(capacity, queue_s=0.3))
    await call.run(12)
    dropped = call.link.dropped
    call.link.max_delay_s = 0.0
    await call.run(18)
    estimates = []  # a sawtooth (grow to the queue, back off; a probe's lift on trial)
    for second in range(19, 31):
        await call.run(second)
        estimates.append(call.controller.estimator.estimate_bps)
    assert 0.6 * capacity <= statistics.median(estimates) <= 1.05 * capacity, estimates
    assert call.received_bps(20, 30) >= 0.6 * capacity
    assert call.link.dropped == dropped  # once settled, nothing overflows the queue
    assert call.link.max_delay_s < 0.2
    assert call.encoder.steady_idle is False  # the link limits the call: joining loops
    await call.close()


async def test_a_dip_is_followed_down_at_once_and_up_within_ten_seconds() -> None:
    call = SimulatedCall(Bottleneck(2.5e6))
    await call.run(10)
    assert call.controller.estimator.estimate_bps > 1.5e6
    call.link.rate_bps = 0.5e6
    await call.run(12)
    assert call.controller.estimator.estimate_bps <= 0.55e6
    probes = call.controller.estimator.probes.sent
    await call.run(30)
    # the link carried 2.5 Mbit/s when it last congested: a drop this far is probed
    # every few seconds (RECOVER_INTERVAL_S), not ever more rarely (3 in 18 s before)
    assert call.controller.estimator.probes.sent - probes >= 4
    call.link.rate_bps = 2.5e6
    recovered = None
    for second in range(31, 41):
        await call.run(second)
        if recovered is None and call.received_bps(second - 1, second) >= 1.5e6:
            recovered = second - 30
    assert recovered is not None
    assert recovered <= 10
    await call.close()


async def test_a_keyframe_after_a_pause_backs_off_from_the_estimate_not_to_the_pause() -> None:
    # A pause in the avatar's speech sends a small idle loop; the keyframe that ends it
    # queues on the link. What arrived over the pause measured the sender, not the link:
    # the estimate backs off from itself (0.85 at most once per response time), where it
    # was cut to 0.85 x the pause's rate before (2.7 -> 0.9 Mbit/s in a dip's recovery).
    call = SimulatedCall(Bottleneck(2.5e6))
    await call.run(12)
    estimator = call.controller.estimator
    before = estimator.estimate_bps
    assert before >= 2.0e6
    call.frame_bytes = 1_500  # 300 kbit/s of idle loop
    await call.run(14)
    call.frame_bytes = None
    call.keyframe_bytes = 90_000  # 290 ms of the link
    lowest = before
    for tenth in range(141, 171):
        await call.run(tenth / 10)
        lowest = min(lowest, estimator.estimate_bps)
    assert lowest < before, (lowest, before)  # the keyframe's queue was seen
    assert lowest >= 0.85**2 * before, (lowest, before)
    await call.close()


async def test_random_loss_that_nacks_repair_does_not_shrink_the_picture() -> None:
    call = SimulatedCall(Bottleneck(10e6, loss=0.05, seed=7))
    await call.run(20)
    estimator = call.controller.estimator
    assert 0.02 < estimator.last_loss < 0.10  # GCC's hold zone
    assert estimator.estimate_bps >= 0.7 * MAX_BPS
    await call.close()


async def test_heavy_loss_cuts_the_rate() -> None:
    call = SimulatedCall(Bottleneck(10e6, loss=0.2, seed=7))
    await call.run(20)
    assert call.controller.estimator.estimate_bps <= 0.3 * MAX_BPS
    await call.close()


async def test_a_caller_that_sends_only_remb_is_followed() -> None:
    call = SimulatedCall(Bottleneck(600e3), remb=True)
    await call.run(10)
    estimator = call.controller.estimator
    assert estimator.mode is Mode.REMB
    assert estimator.remb_bps is not None
    assert estimator.estimate_bps <= 600e3
    assert estimator.probes.sent == 0  # nothing would show a probe's arrivals
    await call.close()
