"""What a receiving Chromium says about a call over a window: fps, freezes, jitter buffer.

:data:`SAMPLER_JS` runs in a page and samples one ``RTCPeerConnection``'s ``getStats()``
every :data:`SAMPLE_INTERVAL_MS` into ``window.linkSamples``: the inbound video and audio
streams' running counters and the candidate pair's round trip, each sample stamped with
``performance.now()``. :func:`window_figures` turns the samples between two times into
the figures the shaped-link tests assert and ``benchmarks/network.py`` prints, from the
counters' differences, so a window is measured the way Chromium counts it:

- frames per second: frames decoded over the window's time;
- freezes and their duration: Chromium's own ``freezeCount`` (a frame gap of at least
  max(3 × the mean gap, mean + 150 ms)) and ``totalFreezesDuration``; pauses (gaps over
  5 s) are counted apart by Chromium and added here, since a 0 fps window is no better
  than a freeze;
- jitter-buffer delay: ``jitterBufferDelay`` / ``jitterBufferEmittedCount``, the mean
  time a frame waited in the buffer over the window;
- received kbit/s (RTP payload and headers), video packets lost, keyframes decoded,
  PLIs and NACKs sent;
- audio concealed: ``concealedSamples`` / ``totalSamplesReceived`` (samples the jitter
  buffer had to make up because their packet was missing or late);
- the round trip (median and largest sample) and the frame heights seen.

Used by ``tests/test_shaped_links.py`` and ``benchmarks/network.py``; the analysis is
tested without a browser (``tests/test_link_stats.py``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

SAMPLE_INTERVAL_MS = 250

#: Installs the sampler on ``window[name]`` (an RTCPeerConnection) and returns at once.
SAMPLER_JS = """
(name) => {
  const pc = window[name];
  window.linkSamples = [];
  const pick = (report) => {
    const s = {t: performance.now()};
    let pairId = null;
    const pairs = new Map();
    for (const r of report.values()) {
      if (r.type === "inbound-rtp" && (r.kind ?? r.mediaType) === "video") {
        Object.assign(s, {
          v_frames: r.framesDecoded ?? 0, v_keyframes: r.keyFramesDecoded ?? 0,
          v_freezes: r.freezeCount ?? 0, v_freeze_s: r.totalFreezesDuration ?? 0,
          v_pauses: r.pauseCount ?? 0, v_pause_s: r.totalPausesDuration ?? 0,
          v_jb_delay: r.jitterBufferDelay ?? 0, v_jb_count: r.jitterBufferEmittedCount ?? 0,
          v_bytes: (r.bytesReceived ?? 0) + (r.headerBytesReceived ?? 0),
          v_packets: r.packetsReceived ?? 0, v_lost: r.packetsLost ?? 0,
          v_nacks: r.nackCount ?? 0, v_plis: r.pliCount ?? 0, v_firs: r.firCount ?? 0,
          v_width: r.frameWidth ?? 0, v_height: r.frameHeight ?? 0,
          v_dropped: r.framesDropped ?? 0,
          v_jb_target: r.jitterBufferTargetDelay ?? 0,
          v_jb_minimum: r.jitterBufferMinimumDelay ?? 0,
          v_interframe: r.totalInterFrameDelay ?? 0,
          v_interframe_sq: r.totalSquaredInterFrameDelay ?? 0,
        });
      } else if (r.type === "inbound-rtp" && (r.kind ?? r.mediaType) === "audio") {
        Object.assign(s, {
          a_concealed: r.concealedSamples ?? 0, a_total: r.totalSamplesReceived ?? 0,
          a_lost: r.packetsLost ?? 0, a_packets: r.packetsReceived ?? 0,
          a_bytes: (r.bytesReceived ?? 0) + (r.headerBytesReceived ?? 0),
          a_jb_delay: r.jitterBufferDelay ?? 0, a_jb_count: r.jitterBufferEmittedCount ?? 0,
          a_fec: r.fecPacketsReceived ?? 0,
          a_jb_target: r.jitterBufferTargetDelay ?? 0,
          a_jb_minimum: r.jitterBufferMinimumDelay ?? 0,
        });
      } else if (r.type === "transport" && r.selectedCandidatePairId) {
        pairId = r.selectedCandidatePairId;
      } else if (r.type === "candidate-pair") {
        pairs.set(r.id, r);
      }
    }
    const pair = pairs.get(pairId);
    if (pair && pair.currentRoundTripTime != null) s.rtt = pair.currentRoundTripTime;
    return s;
  };
  window.linkSampler = setInterval(async () => {
    try { window.linkSamples.push(pick(await pc.getStats())); } catch (e) { /* closed */ }
  }, INTERVAL);
}
""".replace("INTERVAL", str(SAMPLE_INTERVAL_MS))

Sample = Mapping[str, float]


@dataclass(frozen=True)
class WindowFigures:
    """What the receiver saw between two times (see the module doc)."""

    seconds: float
    fps: float
    freezes: int
    freeze_s: float
    jitter_ms: float
    kbps: float
    video_loss: float
    keyframes: int
    plis: int
    nacks: int
    audio_concealed: float
    audio_kbps: float
    rtt_ms: float
    rtt_max_ms: float
    heights: tuple[int, ...]  # frame heights seen, smallest first

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _at(samples: Sequence[Sample], t_ms: float, *, after: bool) -> Sample:
    """The first sample at or after ``t_ms`` (``after``), else the last at or before it."""
    if after:
        for sample in samples:
            if sample["t"] >= t_ms:
                return sample
        return samples[-1]
    for sample in reversed(samples):
        if sample["t"] <= t_ms:
            return sample
    return samples[0]


def _delta(first: Sample, last: Sample, key: str) -> float:
    return float(last.get(key, 0.0)) - float(first.get(key, 0.0))


def window_figures(samples: Sequence[Sample], start_ms: float, end_ms: float) -> WindowFigures:
    """The figures of the samples from ``start_ms`` to ``end_ms`` (``performance.now()``).

    Raises ``ValueError`` when fewer than two samples fall in the window (the page did
    not sample: nothing to measure).
    """
    inside = [s for s in samples if start_ms <= s["t"] <= end_ms and "v_frames" in s]
    if len(inside) < 2:
        raise ValueError(f"{len(inside)} stats samples between {start_ms} and {end_ms} ms")
    first, last = _at(inside, start_ms, after=True), _at(inside, end_ms, after=False)
    seconds = (last["t"] - first["t"]) / 1000
    if seconds <= 0:
        raise ValueError("the window holds one sample time only")

    def d(key: str) -> float:
        return _delta(first, last, key)

    jitter_count = d("v_jb_count")
    audio_total = d("a_total")
    received, lost = d("v_packets"), d("v_lost")
    rtts = [s["rtt"] * 1000 for s in inside if "rtt" in s]
    return WindowFigures(
        seconds=seconds,
        fps=d("v_frames") / seconds,
        freezes=round(d("v_freezes") + d("v_pauses")),
        freeze_s=d("v_freeze_s") + d("v_pause_s"),
        jitter_ms=1000 * d("v_jb_delay") / jitter_count if jitter_count > 0 else math.nan,
        kbps=8 * d("v_bytes") / seconds / 1000,
        video_loss=lost / (received + lost) if received + lost > 0 else 0.0,
        keyframes=round(d("v_keyframes")),
        plis=round(d("v_plis") + d("v_firs")),
        nacks=round(d("v_nacks")),
        audio_concealed=d("a_concealed") / audio_total if audio_total > 0 else math.nan,
        audio_kbps=8 * d("a_bytes") / seconds / 1000,
        rtt_ms=statistics.median(rtts) if rtts else math.nan,
        rtt_max_ms=max(rtts) if rtts else math.nan,
        heights=tuple(sorted({int(s["v_height"]) for s in inside if s.get("v_height")})),
    )


def rate_series(
    samples: Sequence[Sample], key: str, step_ms: float = 1000.0, scale: float = 1.0
) -> list[tuple[float, float]]:
    """(time, ``scale`` × the change of ``key`` per second over the ``step_ms`` before
    it), for samples ``step_ms`` apart or more: e.g. fps from ``v_frames``, kbit/s from
    ``v_bytes`` with ``scale`` 0.008."""
    series: list[tuple[float, float]] = []
    previous: Sample | None = None
    for sample in (s for s in samples if key in s):
        if previous is None or sample["t"] - previous["t"] >= step_ms:
            if previous is not None:
                seconds = (sample["t"] - previous["t"]) / 1000
                series.append((sample["t"], scale * _delta(previous, sample, key) / seconds))
            previous = sample
    return series


def first_time_at_least(
    series: Sequence[tuple[float, float]], value: float, after_ms: float
) -> float | None:
    """The first time after ``after_ms`` at which the series is at least ``value``; None
    if it never is."""
    return next((t for t, v in series if t > after_ms and v >= value), None)
