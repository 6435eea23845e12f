"""A plausible live call's snapshot, for tests that serialise or render one."""

from __future__ import annotations

import dataclasses
from typing import Any

from streaming.link import LinkSnapshot
from streaming.live.snapshot import AddedDelay, AppAudioState, BufferedMedia, SessionSnapshot

_SAMPLE = SessionSnapshot(
    session_id="s-1",
    avatar="alice",
    state="streaming",
    uptime_s=12.5,
    frames_sent=300,
    frames_inferred=180,
    frames_shared=0,
    frames_encoded=0,
    frames_skipped=2,
    audio_skipped=1,
    frames_dropped={"not_ready": 3, "DeadlineExceededError": 1},
    delay_ms=532.5,
    lookahead_ms=452.5,
    added_delay_ms=AddedDelay(
        p50=21.5,
        p95=30.25,
        mean=22.0,
        stages={"features": 9.0, "prepare": 2.5, "inference": 6.5, "compose": 4.0},
        sending={"slot_wait": 58.0, "encode": 4.5},
    ),
    queued_audio_s=1.5,
    buffered=BufferedMedia(audio_chunks=26, frames=12, inbound_audio_ms=20.0),
    inbound_skipped_ms=140.0,
    remote="192.0.2.7",
    output_fps=25.0,
    av_offset_ms=-20.0,
    bitrate_bps=None,
    app_audio=AppAudioState(speaking=True, utterances=3, audio_stream=True, event_listeners=2),
    idle_clip="thinking",
    clips=["idle", "listening", "thinking"],
)


def session_snapshot(**changes: Any) -> SessionSnapshot:
    """The sample call, with ``changes`` applied (e.g. ``session_id="two"``)."""
    return dataclasses.replace(_SAMPLE, **changes)


_LINK = LinkSnapshot(
    mode="transport-cc",
    estimate_bps=1_000_000,
    target_bps=860_000,
    sent_bps=900_000,
    loss=0.0,
    rtt_ms=None,
    queue_ms=0.0,
    step="720p25",
    step_index=0,
    step_changes=0,
    qp=30.0,
    delay_state="normal",
    remb_bps=None,
    nacks=10,
    retransmitted=8,
    keyframe_requests=3,
    keyframe_requests_ignored=1,
    probes=4,
    probes_succeeded=3,
    paced_packets=0,
    pacing_wait_ms=0.0,
)


def link_snapshot(**changes: Any) -> LinkSnapshot:
    """A call's link, with ``changes`` applied (e.g. ``estimate_bps=300_000``)."""
    return dataclasses.replace(_LINK, **changes)
