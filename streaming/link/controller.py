"""One call's link: the estimate, what the encoder is asked for, the pacer, the ladder.

A :class:`LinkController` is made per call once the answer is set
(``webrtc/peer.py``), holds the call's :class:`~.sender.MediaSender` (every packet out
passes through it) and reads every RTCP packet the caller sends (:meth:`rtcp`) before
aiortc does, keeping from aiortc what it now does itself: NACKs (retransmitted here,
from a longer history), REMB and transport-cc feedback (the estimate). From the
estimate it sets, each time it changes (``docs/design/link.md`` §19):

- the **video budget**: the estimate less the audio (:data:`AUDIO_BPS`: the voice is
  never starved for the picture) and the packets' headers;
- the **ladder step** and the encoder's bitrate within it (:mod:`.ladder`), from the
  budget and the QPs the encoder reports;
- the **pacing rate** (:mod:`.pacer`) and how often a caller's keyframe request is
  answered (once per :data:`KEYFRAME_RTTS` round trips, at least
  :data:`KEYFRAME_MIN_INTERVAL_S` apart);
- the caller's **audio loss**, for the Opus encoder to add in-band FEC.

:meth:`run` is the call's ``link`` task: every :data:`TICK_S` it takes the encoder's
QPs to the ladder, lets a hold expire, and sends a probe when one is due. Clocks and
sleep are passed in; nothing here imports aiortc.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from streaming.link.bandwidth import BandwidthEstimator, Mode
from streaming.link.estimate import RateLimits
from streaming.link.ladder import Ladder, Step, steps_for
from streaming.link.probes import Cluster
from streaming.link.rtcp_bytes import (
    APP_FMT,
    NACK_FMT,
    PSFB,
    RR,
    RTPFB,
    SR,
    TRANSPORT_CC_FMT,
    RtcpPart,
    media_ssrc,
    nacked_sequences,
    remb,
    report_blocks,
    split_compound,
    transport_feedback,
)
from streaming.link.sender import MediaSender

logger = logging.getLogger(__name__)

#: What the audio takes of the estimate: 48 kbit/s of Opus and its packets' headers.
AUDIO_BPS = 72_000
#: Where the estimate starts (bits per second, video and audio): a call on a slow link
#: would otherwise open with an IDR sized for a fast one; probes find a fast link's room
#: within seconds.
START_BPS = 300_000
#: Share of the video budget left for RTP, SRTP, UDP and IP headers.
VIDEO_HEADERS = 0.05
KEYFRAME_RTTS = 1.5
KEYFRAME_MIN_INTERVAL_S = 0.1
TICK_S = 0.2
#: A call on the steady idle loops keeps to them while its estimate stays above this
#: share of the full rate (it moves there only at the full rate: :func:`steady_idle`).
STEADY_KEEP = 0.85


class LinkedEncoder(Protocol):
    """What the controller steers (the call's H.264 encoder, ``webrtc/video_encoder.py``)."""

    keyframe_interval_s: float
    steady_idle: bool
    estimate_measured: bool
    keyframe_requests: int
    keyframe_requests_ignored: int
    qps: deque[float]

    @property
    def source_size(self) -> tuple[int, int]: ...

    @property
    def target_bitrate(self) -> int: ...

    def set_link(self, scale: float, fps: int, bitrate: int) -> None: ...


def steady_idle(mode: Mode, estimate_bps: int, full_bps: int, *, was: bool) -> bool:
    """Whether a listening call may settle on the steady idle loops
    (``streaming/live/idle_sharing.py``).

    Only on an estimate of our own, and only at the full rate: a REMB grows with what
    the caller receives and swings with it, so a steady idle loop's rare keyframes walked
    it, and the call, down; and below the full rate the link is what limits the call,
    which a call sending less would stop finding out. Once there, a call stays while its
    estimate holds above :data:`STEADY_KEEP` of the full rate: an estimate at the top
    wavers by a few percent, and each move between the loops costs a keyframe.
    """
    if mode is not Mode.TRANSPORT_CC:
        return False
    return estimate_bps >= (STEADY_KEEP * full_bps if was else full_bps)


@dataclass(frozen=True)
class LinkSnapshot:
    """One call's link now (``GET /sessions/{id}`` ``link``)."""

    mode: str  # transport-cc, remb or loss: what the estimate is made from
    estimate_bps: int
    target_bps: int  # the video encoder's
    sent_bps: int  # everything sent over the last second
    loss: float  # fraction lost over the last loss window
    rtt_ms: float | None
    queue_ms: float  # the queue on the path the one-way delays show (transport-cc)
    step: str  # the ladder step, e.g. 720p25
    step_index: int
    step_changes: int
    qp: float | None
    delay_state: str  # the delay detector: normal, overuse, underuse
    remb_bps: int | None
    nacks: int
    retransmitted: int
    keyframe_requests: int
    keyframe_requests_ignored: int
    probes: int
    probes_succeeded: int
    paced_packets: int
    pacing_wait_ms: float


class LinkController:
    """A call's link (module doc)."""

    def __init__(
        self,
        sender: MediaSender,
        encoder: LinkedEncoder,
        *,
        top_bps: int,
        fps: int,
        audio: bool,
        on_audio_loss: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.sender = sender
        self._encoder = encoder
        self._fps = fps
        self._audio_bps = AUDIO_BPS if audio else 0
        self._top_bps = top_bps
        self._clock = clock
        self._sleep = sleep
        self._on_audio_loss = on_audio_loss
        total = self._total_for(top_bps)
        limits = RateLimits(
            min_bps=self._total_for(steps_min(top_bps)),
            max_bps=total,
            start_bps=min(total, START_BPS),
        )
        self.estimator = BandwidthEstimator(
            limits, transport_cc=sender.streams.transport_cc_id is not None
        )
        self._source = encoder.source_size
        self.ladder = Ladder(steps_for(*self._source, fps, top_bps))
        self._target = top_bps
        self.nacks = 0
        self.retransmitted = 0
        self._video_sent_at_report = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._apply()

    # -- the estimate → what is sent ---------------------------------------------------

    def _total_for(self, video_bps: int) -> int:
        return round(video_bps / (1 - VIDEO_HEADERS)) + self._audio_bps

    def budget_bps(self) -> int:
        """The video encoder's share of the estimate (module doc)."""
        estimate = self.estimator.estimate_bps
        return max(0, round((estimate - self._audio_bps) * (1 - VIDEO_HEADERS)))

    def _apply(self) -> None:
        now = self._clock()
        source = self._encoder.source_size
        if source != self._source:  # the call switched to an avatar of another size
            self._source = source
            current = self.ladder.current
            self.ladder = Ladder(steps_for(*source, self._fps, self._top_bps))
            self.ladder.current = min(current, len(self.ladder.steps) - 1)
        budget = self.budget_bps()
        before = self.ladder.step
        estimator = self.estimator
        settled = not (estimator.on_trial or estimator.probes.starting) or (
            estimator.mode is not Mode.TRANSPORT_CC
        )
        step = self.ladder.decide(budget, now, settled=settled)
        if step is not before:
            logger.info(
                "link: step %s → %s (budget %d kbit/s, QP %s)",
                before.name,
                step.name,
                budget // 1000,
                "-" if self.ladder.qp is None else f"{self.ladder.qp:.1f}",
            )
        self._set(step, self.ladder.bitrate(budget))
        rtt = self.estimator.rtt_s
        self._encoder.keyframe_interval_s = max(KEYFRAME_MIN_INTERVAL_S, KEYFRAME_RTTS * rtt)
        self._encoder.estimate_measured = estimator.measured
        self._encoder.steady_idle = steady_idle(
            estimator.mode, estimator.estimate_bps, estimator.limits.max_bps,
            was=self._encoder.steady_idle,
        )  # fmt: skip

    def _set(self, step: Step, bitrate: int) -> None:
        top = self.ladder.steps[0]
        self._encoder.set_link(step.width / top.width, step.fps, bitrate)
        self._target = self._encoder.target_bitrate
        self.sender.pacer.set_target(self._target)

    # -- what the caller says ----------------------------------------------------------

    def rtcp(self, data: bytes) -> bytes:
        """Read the caller's compound RTCP ``data``; returns what aiortc should still
        get (the parts the link does not take over)."""
        kept: list[RtcpPart] = []
        changed = False
        for part in split_compound(data):
            try:
                handled = self._handle(part)
            except (ValueError, IndexError) as exc:  # a malformed part: aiortc's to judge
                logger.debug("link: unreadable RTCP %d/%d: %s", part.packet_type, part.fmt, exc)
                handled = False
            changed = changed or handled
            if not handled:
                kept.append(part)
        if changed:
            self._apply()
        return b"".join(part.data for part in kept)

    def _handle(self, part: RtcpPart) -> bool:
        """Take ``part`` into account; True if aiortc should not see it."""
        now = self._clock()
        kind, fmt = part.packet_type, part.fmt
        if kind == RTPFB and fmt == TRANSPORT_CC_FMT:
            result = self.sender.sent.resolve(transport_feedback(part))
            self.estimator.transport_feedback(result, now)
            return True
        if kind == RTPFB and fmt == NACK_FMT and media_ssrc(part) == self.sender.streams.video_ssrc:
            sequences = nacked_sequences(part)
            self.nacks += len(sequences)
            self._spawn(self._retransmit(sequences))
            return True
        if kind == PSFB and fmt == APP_FMT:
            value = remb(part)
            if value is not None:
                self.estimator.remb(value[0], now, self.sender.rate.bps(now) or 0.0)
                return True
            return False
        if kind in (SR, RR):
            self._reports(part, now)
        return False  # PLI/FIR (aiortc forwards them to our encoder), SR/RR, SDES, BYE

    def _reports(self, part: RtcpPart, now: float) -> None:
        streams = self.sender.streams
        for block in report_blocks(part):
            if block.ssrc == streams.video_ssrc:
                rtt = self.sender.round_trip_s(block.lsr, block.dlsr_s)
                if rtt is not None:
                    self.estimator.round_trip(rtt)
                sent = self.sender.video_packets - self._video_sent_at_report
                self._video_sent_at_report = self.sender.video_packets
                self.estimator.report_loss(block.fraction_lost, max(sent, 1), now)
            elif self._on_audio_loss is not None:
                self._on_audio_loss(block.fraction_lost)

    async def _retransmit(self, sequences: list[int]) -> None:
        with contextlib.suppress(ConnectionError):  # the call is closing
            self.retransmitted += await self.sender.retransmit(
                sequences, self.estimator.rtt_s, self.estimator.estimate_bps
            )

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the call's link task ----------------------------------------------------------

    async def run(self) -> None:
        """The ``link`` task: QPs to the ladder, holds, probes (module doc). Runs until
        cancelled with the call; retransmissions still running are cancelled with it."""
        try:
            while True:
                await self._sleep(TICK_S)
                self.tick()
        finally:
            for task in list(self._tasks):
                task.cancel()

    def tick(self) -> None:
        """One step of the link task: QPs to the ladder, holds, probes (module doc)."""
        now = self._clock()
        qps = self._encoder.qps
        while qps:
            self.ladder.frame_qp(qps.popleft())
        self._apply()
        estimator = self.estimator
        estimator.probes.expire(now)
        if estimator.mode is not Mode.TRANSPORT_CC or not self.sender.can_probe:
            return
        if not estimator.may_probe(now):
            return
        cluster = estimator.probes.due(estimator.estimate_bps, now)
        if cluster is not None:
            self._spawn(self._probe(cluster))

    async def _probe(self, cluster: Cluster) -> None:
        try:
            sent = await self.sender.probe(cluster)
        except ConnectionError:
            sent = False
        if not sent:
            self.estimator.probes.abandon(cluster.ident)

    def snapshot(self) -> LinkSnapshot:
        estimator, sender, encoder = self.estimator, self.sender, self._encoder
        now = self._clock()
        sent = sender.rate.bps(now)
        qp = self.ladder.qp
        return LinkSnapshot(
            mode=str(estimator.mode),
            estimate_bps=estimator.estimate_bps,
            target_bps=self._target,
            sent_bps=round(sent or 0),
            loss=round(estimator.last_loss, 4),
            rtt_ms=round(estimator.rtt_s * 1000, 1) if estimator.rtt_measured else None,
            queue_ms=round(estimator.queue_s * 1000, 1),
            step=self.ladder.step.name,
            step_index=self.ladder.current,
            step_changes=self.ladder.changes,
            qp=None if qp is None else round(qp, 1),
            delay_state=estimator.usage.value,
            remb_bps=estimator.remb_bps,
            nacks=self.nacks,
            retransmitted=self.retransmitted,
            keyframe_requests=encoder.keyframe_requests,
            keyframe_requests_ignored=encoder.keyframe_requests_ignored,
            probes=estimator.probes.sent,
            probes_succeeded=estimator.probes.succeeded,
            paced_packets=sender.pacer.waits,
            pacing_wait_ms=round(1000 * sender.pacer.waited_s / max(1, sender.pacer.waits), 2),
        )


def steps_min(top_bps: int) -> int:
    """The least video bitrate the estimate goes down to."""
    return min(top_bps, 30_000)
