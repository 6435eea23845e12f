"""A session's state, as ``GET /sessions/{id}`` answers it.

:class:`SessionState` mirrors :class:`streaming.live.snapshot.SessionSnapshot` field for
field (``tests/test_schemas.py`` holds them together) and is built from one; its parts
are the delay it added, the media waiting, the audio apps bring and the call's link.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from web.schemas.base import (
    AvatarId,
    Count,
    Counts,
    NonNegative,
    ResponseModel,
    SessionId,
    SessionKind,
    SessionStateName,
)


class AddedDelay(ResponseModel):
    """Time from a frame's audio being complete to it being ready, over the last 500 frames."""

    p50: float
    p95: float
    mean: float
    stages: dict[str, float] = Field(
        description="The mean split by stage (they add up to `mean`): `features` (the "
        "audio tick, features and hand-off), `prepare`, `inference` (batch wait and run), "
        "`compose`."
    )
    sending: dict[str, float] = Field(
        description="Then, means over the last 500 frames sent lip-synced: `slot_wait` (ready "
        "→ its send slot; with the stages, one 20 ms tick + `session.pipeline_margin_ms` for a "
        "frame sent in its slot) and `encode` (its slot → its H.264 RTP payloads handed to "
        "the WebRTC sender, on top of the configured delay)."
    )


class BufferedMedia(ResponseModel):
    """Media waiting: the caller's audio for the timeline, made media for its send slot."""

    audio_chunks: Count
    frames: Count
    inbound_audio_ms: NonNegative = Field(
        description="The caller's microphone audio received and not yet on the timeline: "
        "at most one chunk plus 20 ms of slack once any backlog is skipped."
    )


class AppAudio(ResponseModel):
    """The audio apps bring to the session (docs/apps.md)."""

    speaking: bool = Field(
        description="The caller is getting an utterance now (between its `speech_started` "
        "and its `speech_ended` or `interrupted`)."
    )
    utterances: Count = Field(description="Utterances queued so far (pushes, says, streamed).")
    audio_stream: bool = Field(description="An audio stream WebSocket is open.")
    event_listeners: Count = Field(
        description="Readers of the session's events: its audio stream, server-sent-events "
        "readers and the caller's data channel."
    )


class Link(ResponseModel):
    """The call's link to its caller (docs/design/link.md §19)."""

    mode: Literal["transport-cc", "remb", "loss"] = Field(
        description="What the estimate is made from: the caller's transport-cc feedback "
        "(browsers), its REMB, or its loss reports alone."
    )
    estimate_bps: Count = Field(description="What the call may send, audio and video.")
    target_bps: Count = Field(description="The video encoder's target within the estimate.")
    sent_bps: Count = Field(description="Everything sent over the last second.")
    loss: float = Field(ge=0, le=1, description="Share lost over the last loss window.")
    rtt_ms: float | None = Field(description="Round trip from receiver reports, once measured.")
    queue_ms: NonNegative = Field(
        description="The queue on the path the one-way delays show (transport-cc only)."
    )
    step: str = Field(description="The quality ladder's step: frame height and rate, `720p25`.")
    step_index: Count = Field(description="0 is the avatar's full picture.")
    step_changes: Count
    qp: float | None = Field(description="Mean QP of the last 25 live frames at this step.")
    delay_state: Literal["normal", "overuse", "underuse"]
    remb_bps: int | None = Field(description="The caller's last REMB, if it sends any.")
    nacks: Count = Field(description="Packets the caller asked to be resent.")
    retransmitted: Count
    keyframe_requests: Count = Field(description="PLI and FIR from the caller.")
    keyframe_requests_ignored: Count = Field(
        description="Those answered by an IDR already on its way."
    )
    probes: Count
    probes_succeeded: Count
    paced_packets: Count = Field(description="Video packets the pacer held back.")
    pacing_wait_ms: NonNegative = Field(description="Their mean wait.")


class SessionState(ResponseModel):
    session_id: SessionId
    avatar: AvatarId = Field(description="The avatar this session shows.")
    state: SessionStateName = Field(
        description="`new` until ICE connects, `streaming` once media flows."
    )
    uptime_s: NonNegative
    frames_sent: Count
    frames_inferred: Count = Field(description="Frames composed with an inferred face.")
    frames_shared: Count = Field(
        description="Idle frames sent from the avatar's shared encoded idle loop "
        "(`video.shared_idle`): encoded once for every call, not by this one."
    )
    frames_encoded: Count = Field(description="Frames encoded by this call's own encoder.")
    frames_skipped: Count = Field(description="Send slots skipped because the track fell behind.")
    audio_skipped: Count = Field(
        description="20 ms audio slots skipped because the audio track fell behind."
    )
    frames_dropped: Counts = Field(
        description="Frames shown idle instead of lip-synced, by reason (`late`, "
        "`overload`, `not_ready`, or an error's name)."
    )
    delay_ms: float = Field(
        description="What the server adds, as configured: lookahead + one audio tick + "
        "`session.pipeline_margin_ms` (the `/offer` answer's `delay.server_ms`). A caller "
        "measuring microphone → heard sees this plus its own browser's buffers (the "
        "answer's `delay.browser_extra_ms_low`–`_high`)."
    )
    lookahead_ms: float = Field(description="The model's part of `delay_ms`.")
    added_delay_ms: AddedDelay
    queued_audio_s: NonNegative
    buffered: BufferedMedia
    inbound_skipped_ms: NonNegative = Field(
        description="Microphone audio skipped since the call began, so that a backlog "
        "(after a stall or from a caller's faster clock) never adds delay."
    )
    remote: str | None = Field(description="The caller's address as the server saw it.")
    output_fps: NonNegative = Field(
        description="Video frames sent per second over about the last 5 s."
    )
    av_offset_ms: float | None = Field(
        description="Next audio chunk's time minus next video frame's time (about 0); "
        "null before media flows or without an audio track."
    )
    bitrate_bps: int | None = Field(
        description="The video encoder's target bitrate, once it exists."
    )
    app_audio: AppAudio
    idle_clip: str = Field(description="The clip the avatar plays while silent.")
    clips: list[str] = Field(description="Every idle clip the avatar has (`POST .../idle`).")
    frames_left_out: Count = Field(
        description="Frames a ladder step with a lower frame rate did not send."
    )
    caller_audio_ms: dict[str, float] | None = Field(
        description="The caller's audio from its arrival to the same samples sent back, "
        "`p50` and `p95` over the last 500 chunks: `delay_ms` plus the inbound buffer's "
        "wait; null without audio from the caller."
    )
    link: Link | None = Field(
        description="The call's link: estimate, target, loss, round trip, ladder step "
        "(null for a call aiortc encodes itself, VP8, and for a session with no caller)."
    )
    caller: bool = Field(description="False for a session made by `POST /sessions`.")
    kind: SessionKind = Field(
        description="`call` (`/offer`), `callerless` (`POST /sessions`), `whip` "
        "(`POST /whip/{avatar}`) or `livekit` (a LiveKit agent's avatar, "
        "`POST /livekit/sessions`)."
    )
    viewers: Count = Field(description="Viewers watching it now (`POST .../whep`).")
    outputs: Count = Field(description="Streams it pushes out now (`GET .../outputs`).")
    inbound_concealed_ms: NonNegative = Field(
        description="Microphone audio made up (Opus packet-loss concealment) since the "
        "call began, for packets that came after their 20 ms tick while the caller spoke; "
        "the late audio is skipped when it comes, so the delay stays as it was."
    )
