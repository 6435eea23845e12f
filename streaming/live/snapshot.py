"""Everything operators see of the live calls, as one immutable, serialisable value.

:meth:`SessionManager.snapshot() <streaming.live.manager.SessionManager.snapshot>` returns
a :class:`SessionsSnapshot`: one :class:`SessionSnapshot` per live call (the body of
``GET /sessions/{id}``), totals since start-up, and the shared background-frame cache.
The admin API, ``/metrics`` and ``/ready`` read nothing else (``docs/design/failure.md``
§13), and a snapshot crosses a process boundary as JSON unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from pydantic import TypeAdapter

from compositor.background_cache import CacheStats
from streaming.idle_loops import IdleLoopStats
from streaming.link import LinkSnapshot


@dataclass(frozen=True)
class AddedDelay:
    """How long frames took after their audio was complete, over the last 500 frames.

    ``stages`` splits the mean by where the time went (the stages add up to ``mean``):
    ``features`` (the tick that completes the frame's audio, its features, the hand-off
    to the render task), ``prepare`` (crop and model input), ``inference`` (waiting for
    a batch and running it) and ``compose`` (the face pasted into the frame).

    ``sending`` (means, ms) follows a frame from ready to out: ``slot_wait`` (ready → its
    send slot: the part of the margin it did not need) and ``encode`` (its slot → its RTP
    payloads handed to aiortc: the H.264 encode and packetising, waiting for a worker
    included). For a frame sent in its slot, ``stages`` + ``slot_wait`` = one tick +
    ``session.pipeline_margin_ms`` (``docs/design/delay.md`` §8).
    """

    p50: float
    p95: float
    mean: float
    stages: dict[str, float]
    sending: dict[str, float]


@dataclass(frozen=True)
class BufferedMedia:
    """Media waiting: the caller's audio for the timeline, made media for its send slot."""

    audio_chunks: int
    frames: int
    inbound_audio_ms: float  # the caller's microphone audio not yet on the timeline


@dataclass(frozen=True)
class AppAudioState:
    """The audio apps bring (``docs/apps.md``): whether the caller is getting an
    utterance now, how many were queued, whether an audio stream is open, and how many
    event listeners (stream, server-sent events, data channel) follow the session."""

    speaking: bool
    utterances: int
    audio_stream: bool
    event_listeners: int


@dataclass(frozen=True)
class SessionSnapshot:
    """One live call."""

    session_id: str
    avatar: str
    state: str  # new, connected, streaming, closed
    uptime_s: float
    frames_sent: int
    frames_inferred: int  # composed with an inferred face
    frames_shared: int  # sent from the avatar's shared encoded idle loop
    frames_encoded: int  # encoded by the call's own encoder
    frames_skipped: int  # send slots skipped because the track fell behind
    audio_skipped: int  # 20 ms audio slots skipped because the audio track fell behind
    frames_dropped: dict[str, int]  # by reason: not_ready, late, overload, an error name
    delay_ms: float  # configured: lookahead + one audio tick + pipeline margin
    lookahead_ms: float
    added_delay_ms: AddedDelay
    queued_audio_s: float
    buffered: BufferedMedia
    inbound_skipped_ms: float  # microphone audio skipped so its backlog never adds delay
    remote: str | None
    output_fps: float  # video frames sent per second, over about the last 5 s
    av_offset_ms: float | None  # next audio chunk's time - next video frame's time
    bitrate_bps: int | None  # the video encoder's target bitrate, once it exists
    app_audio: AppAudioState
    idle_clip: str  # the clip the avatar plays while silent
    clips: list[str]  # every idle clip the avatar has
    #: Frames a ladder step with a lower frame rate left out (docs/design/link.md §19).
    frames_left_out: int = 0
    #: The caller's audio from its arrival to the same samples sent back, p50 and p95 of
    #: the last 500 chunks (ms): the configured delay plus the inbound buffer's wait
    #: (docs/design/delay.md §8); None without a caller's audio.
    caller_audio_ms: dict[str, float] | None = None
    #: The call's link: estimate, target, loss, round trip, ladder step (None: VP8,
    #: aiortc's own encoder, no link; or no caller).
    link: LinkSnapshot | None = None
    caller: bool = True  # False: a session made by POST /sessions (docs/design/broadcast.md §21)
    #: call, callerless (POST /sessions), whip (POST /whip/{avatar}), livekit (a LiveKit
    #: agent's avatar, POST /livekit/sessions)
    kind: str = "call"
    viewers: int = 0  # viewers watching it now (WHEP)
    outputs: int = 0  # streams it pushes out now (RTMP)
    #: Microphone audio made up for packets that came after their tick while the caller
    #: spoke, their late audio skipped (docs/design/audio-in.md §2).
    inbound_concealed_ms: float = 0.0


@dataclass
class LinkTotals:
    """What the calls' links did since start-up (docs/design/link.md §19), ended calls'
    and live ones' together: ``/metrics`` counters."""

    nacks: int = 0  # NACKed packets the callers asked for
    retransmitted: int = 0  # packets resent for them
    keyframe_requests: int = 0  # PLI/FIR received
    keyframe_requests_ignored: int = 0  # within a round trip of the last one answered
    step_changes: int = 0  # quality ladder steps taken, up or down
    probes: int = 0
    probes_succeeded: int = 0

    def add(self, link: LinkSnapshot) -> None:
        """Count one call's link (its totals so far)."""
        self.nacks += link.nacks
        self.retransmitted += link.retransmitted
        self.keyframe_requests += link.keyframe_requests
        self.keyframe_requests_ignored += link.keyframe_requests_ignored
        self.step_changes += link.step_changes
        self.probes += link.probes
        self.probes_succeeded += link.probes_succeeded

    def plus(self, links: Iterable[LinkSnapshot | None]) -> LinkTotals:
        """These totals with ``links`` (the live calls') added, as a new value."""
        total = replace(self)
        for link in links:
            if link is not None:
                total.add(link)
        return total


@dataclass(frozen=True)
class SessionTotals:
    """Counts since start-up; the live calls' frames are included."""

    live: int
    started: int
    ended: int
    rejected: int  # refused at capacity or while shutting down
    failed: int  # offers that could not be answered
    frames_sent: int
    frames_inferred: int
    frames_dropped: dict[str, int]
    ended_by_reason: dict[str, int]
    #: Video frames sent from shared idle loops, and encoded by the calls themselves.
    frames_shared: int = 0
    frames_encoded: int = 0
    #: The process's CPU ms per frame sent lately (admission's measured figure), if any.
    cpu_ms_per_frame: float | None = None
    #: What admission has left for new sessions: places, and the least-used-up
    #: resource's share (0..1).
    room_places: int = 0
    room_share: float = 0.0
    #: Live calls whose caller is getting an app's utterance now, and open audio streams.
    speaking: int = 0
    audio_streams: int = 0
    #: WHEP viewers and outputs of the live sessions, and sessions no caller owns (§21).
    #: Live sessions by kind (``call``, ``callerless``, ``whip``, ``livekit``).
    by_kind: dict[str, int] = field(default_factory=dict)
    viewers: int = 0
    outputs: int = 0
    callerless: int = 0
    #: The calls' links (docs/design/link.md §19).
    link: LinkTotals = field(default_factory=LinkTotals)


@dataclass(frozen=True)
class SessionsSnapshot:
    """The live calls at one moment."""

    sessions: tuple[SessionSnapshot, ...]
    totals: SessionTotals
    cache: CacheStats
    idle_loops: IdleLoopStats

    def links(self) -> list[LinkSnapshot]:
        """The live calls' links (a call with no link, VP8, left out)."""
        return [session.link for session in self.sessions if session.link is not None]

    def to_json(self) -> bytes:
        """The snapshot as JSON (what crosses a process boundary)."""
        return _SESSIONS_JSON.dump_json(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> SessionsSnapshot:
        """The snapshot :meth:`to_json` wrote."""
        return _SESSIONS_JSON.validate_json(data)


_SESSIONS_JSON = TypeAdapter(SessionsSnapshot)
