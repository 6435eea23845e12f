"""The calls' links in ``GET /metrics`` (``docs/design/link.md`` §19).

What an operator asks of a fleet of calls on real networks: how many callers are on a
constrained link and at which quality ladder step, how their estimates, round trips and
losses are spread, and how much repairing the links take. From the sessions' snapshot
of one scrape, like the rest of :mod:`web.metrics`; labels stay bounded (the ladder
step's index, 0 being the avatar's own size; the estimate's mode), and the spreads over
the live calls are gauge histograms with fixed buckets, so a thousand calls are still
a handful of series.

==============================================  ===============  ==========
metric                                          type             labels
==============================================  ===============  ==========
lipstream_link_calls_by_step                    gauge            step
lipstream_link_calls_by_mode                    gauge            mode
lipstream_link_estimate_bits_per_second         gauge histogram
lipstream_link_rtt_seconds                      gauge histogram
lipstream_link_loss_ratio                       gauge histogram
lipstream_link_nacks_total                      counter
lipstream_link_retransmitted_packets_total      counter
lipstream_link_keyframe_requests_total          counter          outcome
lipstream_link_step_changes_total               counter
lipstream_link_probes_total                     counter          outcome
==============================================  ===============  ==========
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)

from streaming.link import LinkSnapshot, Mode
from streaming.link.ladder import SCALES
from streaming.live.snapshot import LinkTotals

#: Every ladder step's index (the avatar's own size is 0; the last is the low frame rate).
STEPS = tuple(str(index) for index in range(len(SCALES) + 1))
MODES = tuple(mode.value for mode in Mode)
ESTIMATE_BUCKETS = (150e3, 300e3, 600e3, 1e6, 1.5e6, 2.5e6, 4e6)
RTT_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.4, 0.8)
LOSS_BUCKETS = (0.001, 0.01, 0.02, 0.05, 0.1, 0.2)


def link_metrics(links: Sequence[LinkSnapshot], totals: LinkTotals) -> Iterator[Metric]:
    """The families above: ``links`` are the live calls', ``totals`` since start-up."""
    by_step = GaugeMetricFamily(
        "lipstream_link_calls_by_step",
        "Live calls at each quality ladder step (0: the avatar's own size and frame rate).",
        labels=["step"],
    )
    steps = dict.fromkeys(STEPS, 0)
    for link in links:
        steps[STEPS[min(link.step_index, len(STEPS) - 1)]] += 1
    for step, count in steps.items():
        by_step.add_metric([step], count)
    yield by_step
    by_mode = GaugeMetricFamily(
        "lipstream_link_calls_by_mode",
        "Live calls by what their estimate is made from (transport-cc, remb, loss).",
        labels=["mode"],
    )
    modes = dict.fromkeys(MODES, 0)
    for link in links:
        modes[link.mode] = modes.get(link.mode, 0) + 1
    for mode in MODES:
        by_mode.add_metric([mode], modes[mode])
    yield by_mode
    yield _spread(
        "lipstream_link_estimate_bits_per_second",
        "The live calls' bandwidth estimates.",
        [link.estimate_bps for link in links],
        ESTIMATE_BUCKETS,
    )
    yield _spread(
        "lipstream_link_rtt_seconds",
        "The live calls' round trips (calls with one measured).",
        [link.rtt_ms / 1000 for link in links if link.rtt_ms is not None],
        RTT_BUCKETS,
    )
    yield _spread(
        "lipstream_link_loss_ratio",
        "The live calls' packet loss over their last loss window.",
        [link.loss for link in links],
        LOSS_BUCKETS,
    )
    yield CounterMetricFamily(
        "lipstream_link_nacks",
        "Packets callers asked for again (NACK).",
        value=totals.nacks,
    )
    yield CounterMetricFamily(
        "lipstream_link_retransmitted_packets",
        "Packets resent for callers' NACKs.",
        value=totals.retransmitted,
    )
    requests = CounterMetricFamily(
        "lipstream_link_keyframe_requests",
        "Callers' keyframe requests (PLI/FIR): answered with an IDR, or ignored (within "
        "a round trip of the last one answered).",
        labels=["outcome"],
    )
    requests.add_metric(["answered"], totals.keyframe_requests - totals.keyframe_requests_ignored)
    requests.add_metric(["ignored"], totals.keyframe_requests_ignored)
    yield requests
    yield CounterMetricFamily(
        "lipstream_link_step_changes",
        "Quality ladder steps taken, up or down.",
        value=totals.step_changes,
    )
    probes = CounterMetricFamily(
        "lipstream_link_probes",
        "Bandwidth probes sent: succeeded (found room) or not.",
        labels=["outcome"],
    )
    probes.add_metric(["succeeded"], totals.probes_succeeded)
    probes.add_metric(["other"], totals.probes - totals.probes_succeeded)
    yield probes


def _spread(
    name: str, doc: str, values: Sequence[float], bounds: Sequence[float]
) -> GaugeHistogramMetricFamily:
    buckets = [(str(bound), float(sum(v <= bound for v in values))) for bound in bounds]
    buckets.append(("+Inf", float(len(values))))
    return GaugeHistogramMetricFamily(name, doc, buckets=buckets, gsum_value=float(sum(values)))
