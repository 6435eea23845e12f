"""What one session tells operators: its counters, and snapshots of them.

:class:`SessionStats` holds the counters the render path bumps (frames inferred, frames
dropped by reason, the added delay of the last 500 frames); :class:`SessionReport` turns
them and the live values the session hands in into a
:class:`~streaming.live.snapshot.SessionSnapshot`, the one view the admin API, ``/metrics``
and ``/ready`` read (``docs/design/failure.md`` §13). Rates are sampled when a snapshot is
taken, so the hot path pays nothing for them.

:func:`delay_budget` is the one place the configured delay is computed from the settings
(§8): the session sends at it, and the start-up log, ``GET /webrtc-config`` and the
``/offer`` answer state it, with what a browser adds on top.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from config.settings import Settings
from inference_core.features.timing import FeatureKind, lookahead_ms
from streaming.audio_rates import AUDIO_CHUNK_S
from streaming.link import LinkSnapshot
from streaming.live.snapshot import AddedDelay, AppAudioState, BufferedMedia, SessionSnapshot

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


class FrameStages(NamedTuple):
    """Where one frame's added delay went, in seconds, stage by stage in pipeline order.

    Taken from the same timestamps, so the stages add up to :attr:`total`, the time from
    the frame's audio being complete to the frame being ready (``docs/design/delay.md``
    §8; the stages are those of :class:`~streaming.live.snapshot.AddedDelay`). One value
    for the session's counters and the ``on_frame_ready`` hook, so they cannot disagree.
    """

    features: float
    prepare: float
    inference: float
    compose: float

    @property
    def total(self) -> float:
        """The frame's added delay: its stages together."""
        return self.features + self.prepare + self.inference + self.compose


#: Where a frame's added delay goes, in order (see :class:`~streaming.live.snapshot.AddedDelay`).
STAGES: tuple[str, ...] = FrameStages._fields


class FrameSending(NamedTuple):
    """A ready frame on its way out, in seconds: waiting for its send slot, then encoded
    and packetised (see :class:`~streaming.live.snapshot.AddedDelay`)."""

    slot_wait: float
    encode: float


#: After a frame is ready, in order.
SENDING: tuple[str, ...] = FrameSending._fields
_KEPT = 500  # frames whose delays are kept

#: What a caller adds to :attr:`DelayBudget.server_ms`, typically. Mic → heard measured in
#: headless Chromium on loopback (``docs/performance/live-calls.md``): per-run medians 57–89 ms
#: above the configured delay, 67 ms over all runs (per-run p95 up to 129 ms). It is the
#: browser's capture, Opus packetisation and send, its jitter buffer and decoder, and the
#: server's inbound slack (at most 40 ms, ``docs/design/audio-in.md`` §2). A real network
#: adds its own one-way delay and jitter on top.
BROWSER_EXTRA_MS_TYPICAL = (60.0, 80.0)


@dataclass(frozen=True)
class DelayBudget:
    """The delay a live session adds between a caller's audio and its frame and sound.

    Every frame and audio chunk goes out :attr:`server_ms` after its audio time: the
    model's lookahead, one timeline tick (the 20 ms chunk that completes the audio), and
    ``session.pipeline_margin_ms`` for features, inference and compositing
    (``docs/design/delay.md`` §8). It starts once the caller's audio is on the session's
    timeline, so what a caller measures mic → heard is this plus its own path
    (:data:`BROWSER_EXTRA_MS_TYPICAL`).
    """

    lookahead_ms: float
    tick_ms: float
    margin_ms: float

    @property
    def server_ms(self) -> float:
        """The configured delay (``Session.delay_s`` in ms)."""
        return self.lookahead_ms + self.tick_ms + self.margin_ms

    @property
    def browser_extra_ms(self) -> tuple[float, float]:
        """What a browser caller typically adds on top of :attr:`server_ms` (low, high)."""
        return BROWSER_EXTRA_MS_TYPICAL


def delay_budget(settings: Settings, *, fps: int = 25, kind: FeatureKind = "ave") -> DelayBudget:
    """The configured delay for an avatar at ``fps`` whose model takes ``kind`` features.

    The lookahead is the model's (``audio.right_context``, the avatar's fps and feature
    kind); the defaults are those of ``unet_328`` and the demo avatar, the figure stated
    before any avatar is chosen.
    """
    return DelayBudget(
        lookahead_ms=lookahead_ms(settings.audio.right_context, fps, kind=kind),
        tick_ms=AUDIO_CHUNK_S * 1000,
        margin_ms=settings.session.pipeline_margin_ms,
    )


@dataclass
class SessionStats:
    """Counters of one session (read by the admin API)."""

    frames_inferred: int = 0
    #: Video frames sent from a shared encoded idle loop, and encoded by the call's own
    #: encoder (``docs/design/idle-loops.md`` §16).
    frames_shared: int = 0
    frames_encoded: int = 0
    #: Frames a ladder step with a lower frame rate did not send (docs/design/link.md §19).
    frames_left_out: int = 0
    frames_dropped: dict[str, int] = field(default_factory=dict)
    processing_ms: deque[float] = field(default_factory=lambda: deque(maxlen=_KEPT))
    stage_ms: dict[str, deque[float]] = field(
        default_factory=lambda: {stage: deque(maxlen=_KEPT) for stage in STAGES}
    )
    sending_ms: dict[str, deque[float]] = field(
        default_factory=lambda: {stage: deque(maxlen=_KEPT) for stage in SENDING}
    )
    #: The caller's audio from its arrival to the same samples sent back (ms).
    caller_audio_ms: deque[float] = field(default_factory=lambda: deque(maxlen=_KEPT))

    def drop(self, reason: str) -> None:
        self.frames_dropped[reason] = self.frames_dropped.get(reason, 0) + 1

    def record_frame(self, stages: FrameStages) -> None:
        """A frame made it: its time in each of :data:`STAGES`, whose sum is its delay."""
        for stage, seconds in zip(STAGES, stages, strict=True):
            self.stage_ms[stage].append(seconds * 1000)
        self.processing_ms.append(stages.total * 1000)

    def record_sending(self, sending: FrameSending) -> None:
        """A ready frame went out: how long it waited for its slot, and its encode."""
        for stage, seconds in zip(SENDING, sending, strict=True):
            self.sending_ms[stage].append(seconds * 1000)

    def added_delay(self) -> AddedDelay:
        """The added delay of the kept frames: p50, p95, mean and the mean per stage."""
        p50, p95 = self.processing_percentiles()

        def mean(values: deque[float]) -> float:
            return round(float(np.mean(values)), 1) if values else 0.0

        return AddedDelay(
            p50=round(p50, 1),
            p95=round(p95, 1),
            mean=mean(self.processing_ms),
            stages={stage: mean(values) for stage, values in self.stage_ms.items()},
            sending={stage: mean(values) for stage, values in self.sending_ms.items()},
        )

    def processing_percentiles(self) -> tuple[float, float]:
        """p50 and p95 of the time from a frame's audio being complete to it being ready."""
        if not self.processing_ms:
            return 0.0, 0.0
        values = np.asarray(self.processing_ms)
        return float(np.percentile(values, 50)), float(np.percentile(values, 95))


class RecentRate:
    """Events per second over roughly the last ``window_s``, from a running total.

    Sampled when read, so the hot path pays nothing: the rate is measured from the
    newest sample at least ``window_s`` old (or the oldest one kept) to now. Until two
    reads are ``min_span_s`` apart, it is the average since ``start``.
    """

    def __init__(self, window_s: float = 5.0, min_span_s: float = 0.5) -> None:
        self._window_s = window_s
        self._min_span_s = min_span_s
        self._samples: deque[tuple[float, int]] = deque(maxlen=256)

    def update(self, now: float, total: int, start: float | None) -> float:
        samples = self._samples
        while len(samples) > 1 and now - samples[1][0] >= self._window_s:
            samples.popleft()
        base = samples[0] if samples else None
        samples.append((now, total))
        if base is not None and now - base[0] >= self._min_span_s:
            return (total - base[1]) / (now - base[0])
        if start is None or now <= start:
            return 0.0
        return total / (now - start)


def av_offset_ms(audio_next_index: int, video_next_index: int, fps: int) -> float:
    """Where audio is on the session timeline minus where video is (≈0 by design).

    Both tracks send media for timeline time t at start + delay + t, so their next slots
    (the next 20 ms chunk, the next frame) differ by less than one video frame.
    """
    audio_s = audio_next_index * AUDIO_CHUNK_S
    video_s = video_next_index / fps
    return round((audio_s - video_s) * 1000, 1)


class SessionReport:
    """The counters of one session and its snapshots.

    ``clock`` (monotonic) times the output rate; ``wall_clock`` the uptime.
    """

    def __init__(
        self,
        session_id: str,
        avatar_id: str,
        remote: str | None,
        *,
        delay_s: float,
        lookahead_ms: float,
        fps: int,
        stats: SessionStats | None = None,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ) -> None:
        self.session_id = session_id
        self.avatar_id = avatar_id
        self.remote = remote
        self.delay_s = delay_s
        self.lookahead_ms = lookahead_ms
        self.fps = fps
        self.stats = stats if stats is not None else SessionStats()
        self._clock = clock
        self._wall_clock = wall_clock
        self.created_at = wall_clock()
        self._output_rate = RecentRate()

    def log_end(
        self,
        reason: str,
        *,
        frames_sent: int,
        frames_skipped: int,
        inbound_skipped_ms: float,
        abandoned: Sequence[str] = (),
    ) -> None:
        """The one log line of an ended call: its counters, its delay figures, and the
        tasks that had to be abandoned while it closed (none, normally)."""
        added = self.stats.added_delay()
        logger.info(
            "session ended: session=%s avatar=%s reason=%s frames_sent=%d frames_inferred=%d "
            "frames_skipped=%d dropped=%s inbound_skipped_ms=%.0f delay_ms=%.0f "
            "lookahead_ms=%.1f added_delay_p50_ms=%.1f added_delay_p95_ms=%.1f "
            "added_delay_stages_ms=%s sending_ms=%s abandoned=%s",
            self.session_id,
            self.avatar_id,
            reason,
            frames_sent,
            self.stats.frames_inferred,
            frames_skipped,
            self.stats.frames_dropped,
            inbound_skipped_ms,
            self.delay_s * 1000,
            self.lookahead_ms,
            added.p50,
            added.p95,
            added.stages,
            added.sending,
            list(abandoned),
        )

    def show(self, avatar_id: str) -> None:
        """The call shows ``avatar_id`` from now on (a switch)."""
        self.avatar_id = avatar_id

    def snapshot(
        self,
        *,
        state: str,
        frames_sent: int,
        frames_skipped: int,
        started_at: float | None,
        video_next_index: int,
        audio_next_index: int | None,
        queued_audio_s: float,
        buffered: BufferedMedia,
        inbound_skipped_ms: float,
        bitrate_bps: int | None,
        inbound_concealed_ms: float = 0.0,
        app_audio: AppAudioState,
        idle_clip: str = "idle",
        clips: list[str] | None = None,
        audio_skipped: int = 0,
        link: LinkSnapshot | None = None,
    ) -> SessionSnapshot:
        """The session now. ``started_at`` is the session clock's start (None before
        media); ``audio_next_index`` None when no audio is sent: no A/V offset then."""
        fps = self._output_rate.update(self._clock(), frames_sent, started_at)
        offset_ms = (
            None
            if started_at is None or audio_next_index is None
            else av_offset_ms(audio_next_index, video_next_index, self.fps)
        )
        return SessionSnapshot(
            session_id=self.session_id,
            avatar=self.avatar_id,
            state=state,
            uptime_s=round(self._wall_clock() - self.created_at, 1),
            frames_sent=frames_sent,
            frames_inferred=self.stats.frames_inferred,
            frames_shared=self.stats.frames_shared,
            frames_encoded=self.stats.frames_encoded,
            frames_skipped=frames_skipped,
            audio_skipped=audio_skipped,
            frames_dropped=dict(self.stats.frames_dropped),
            delay_ms=round(self.delay_s * 1000, 1),
            lookahead_ms=self.lookahead_ms,
            added_delay_ms=self.stats.added_delay(),
            queued_audio_s=round(queued_audio_s, 2),
            buffered=buffered,
            inbound_skipped_ms=round(inbound_skipped_ms, 1),
            remote=self.remote,
            output_fps=round(fps, 2),
            av_offset_ms=offset_ms,
            bitrate_bps=bitrate_bps,
            app_audio=app_audio,
            idle_clip=idle_clip,
            clips=clips if clips is not None else ["idle"],
            frames_left_out=self.stats.frames_left_out,
            caller_audio_ms=_percentiles(self.stats.caller_audio_ms),
            link=link,
            inbound_concealed_ms=round(inbound_concealed_ms, 1),
        )


def _percentiles(values: deque[float]) -> dict[str, float] | None:
    """p50 and p95 of ``values`` (None when there are none)."""
    if not values:
        return None
    p50, p95 = np.percentile(np.asarray(values), [50, 95])
    return {"p50": round(float(p50), 1), "p95": round(float(p95), 1)}
