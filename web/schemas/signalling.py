"""Signalling and session control: the offer, the answer, speech, avatars, ICE servers.

A session's state, as ``GET /sessions/{id}`` answers it, is :mod:`web.schemas.session_state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from inference_core.avatars.package import AVATAR_ID_PATTERN
from streaming.audio_in.tts import VOICE_PATTERN
from streaming.live import reporting
from web.schemas.base import (
    AvatarId,
    NonNegative,
    RequestModel,
    ResponseModel,
    SessionId,
)

# --- requests --------------------------------------------------------------------------


class Offer(RequestModel):
    """At most `server.max_offer_bytes` of JSON."""

    value_codes: ClassVar[Mapping[str, str]] = {"type": "bad_offer", "avatar": "invalid_model_id"}

    sdp: str = Field(description="The caller's complete SDP offer.")
    type: Literal["offer"]
    avatar: Annotated[str, Field(pattern=f"^({AVATAR_ID_PATTERN.pattern})?$")] | None = Field(
        default="demo",
        description="Avatar id (see `GET /avatars`); empty or null means `demo`.",
    )

    @property
    def avatar_id(self) -> str:
        """The avatar asked for, ``demo`` when none is named."""
        return self.avatar or "demo"


class Say(RequestModel):
    value_codes: ClassVar[Mapping[str, str]] = {"text": "bad_text", "voice": "bad_text"}

    text: str = Field(
        min_length=1,
        description="At most `session.max_say_chars` characters; control characters become spaces.",
    )
    voice: Annotated[str, Field(pattern=VOICE_PATTERN)] | None = Field(
        default=None,
        description="An engine voice such as `en`, `en-us` or `en+f3` (default `tts.voice`).",
    )


class AudioQuery(RequestModel):
    """The raw PCM parameters of ``POST /sessions/{id}/audio``, for the document only.

    :func:`streaming.audio_in.push.decode_pushed_audio` reads and checks them (they may
    also come as content-type parameters) and answers ``bad_audio``;
    ``tests/test_schemas.py`` checks that it takes what this model allows.
    """

    missing_code = wrong_type_code = "bad_audio"

    format: Literal["s16le", "f32le"] | SkipJsonSchema[None] = Field(
        default=None,
        description="Raw PCM sample format (required for `application/octet-stream`).",
    )
    rate: Annotated[int, Field(ge=1000, le=384_000)] | SkipJsonSchema[None] = Field(
        default=None, description="Raw PCM sample rate in Hz (required for raw PCM)."
    )
    channels: Annotated[int, Field(ge=1, le=32)] | SkipJsonSchema[None] = Field(
        default=None,
        description="Raw PCM channels, interleaved (default 1 for `audio/L16`, required "
        "otherwise).",
    )


class StreamQuery(RequestModel):
    """The parameters of ``GET /sessions/{id}/audio/stream``, for the document only.

    :meth:`streaming.audio_in.stream.StreamFormat.parse` reads and checks them and answers
    ``bad_stream_format``; ``tests/test_session_streams.py`` checks that it takes what this
    model allows.
    """

    missing_code = wrong_type_code = "bad_stream_format"

    format: Literal["s16le", "f32le"] = Field(
        description="Sample format of the binary messages (little-endian)."
    )
    rate: Literal[16000, 22050, 24000, 44100, 48000] = Field(description="Sample rate in Hz.")
    channels: Literal[1] | SkipJsonSchema[None] = Field(
        default=None, description="1 (mono, the default): streams are mono."
    )
    token: str | SkipJsonSchema[None] = Field(
        default=None,
        description="The session token, for clients that cannot send `Authorization` "
        "(browsers' `WebSocket`).",
    )


class TokenQuery(RequestModel):
    """``?token=``, where the route takes the session token as a parameter."""

    token: str | SkipJsonSchema[None] = Field(
        default=None,
        description="The session token, for clients that cannot send `Authorization` "
        "(browsers' `EventSource`).",
    )


# --- responses -------------------------------------------------------------------------


class DelayBudget(ResponseModel):
    """The delay the server adds between a caller's audio and the frame and sound sent back.

    A caller measuring microphone → heard sees `server_ms` plus its own path:
    `browser_extra_ms_low`–`browser_extra_ms_high` is what that added in headless
    Chromium on loopback (docs/performance/live-calls.md). A real network adds its one-way delay
    and jitter on top.
    """

    server_ms: NonNegative = Field(
        description="What the server adds, as configured: every frame and its audio go out "
        "this long after the audio reached the session's timeline; "
        "`lookahead_ms + tick_ms + margin_ms`."
    )
    lookahead_ms: NonNegative = Field(
        description="The model's: audio a frame needs after its own time "
        "(`audio.right_context`, the avatar's fps and audio features)."
    )
    tick_ms: NonNegative = Field(
        description="One audio chunk of the session timeline: the one that completes a "
        "frame's audio."
    )
    margin_ms: NonNegative = Field(
        description="`session.pipeline_margin_ms`: time for the features, the batched "
        "inference and the compositing."
    )
    browser_extra_ms_low: NonNegative = Field(
        description="What a browser caller typically measures on top of `server_ms`, low "
        "end: its capture and send path, its jitter buffer and decoder, and the server's "
        "inbound slack."
    )
    browser_extra_ms_high: NonNegative = Field(
        description="The same, high end (a slower or busier machine adds more)."
    )

    @classmethod
    def of(cls, budget: reporting.DelayBudget) -> DelayBudget:
        """The figures of ``budget``, rounded to 0.1 ms."""
        low, high = budget.browser_extra_ms
        return cls(
            server_ms=round(budget.server_ms, 1),
            lookahead_ms=round(budget.lookahead_ms, 1),
            tick_ms=round(budget.tick_ms, 1),
            margin_ms=round(budget.margin_ms, 1),
            browser_extra_ms_low=low,
            browser_extra_ms_high=high,
        )


class Answer(ResponseModel):
    sdp: str = Field(description="The server's SDP answer.")
    type: Literal["answer"]
    session_id: SessionId
    delay: DelayBudget = Field(
        description="This session's delay, with its avatar's lookahead; `delay_ms` in "
        "`GET /sessions/{id}` is its `server_ms`."
    )


class HungUp(ResponseModel):
    session_id: SessionId
    state: Literal["closed"]


class Queued(ResponseModel):
    utterance: int = Field(
        ge=1,
        description="This audio's utterance number in the session: events about it "
        "(`speech_started`, `speech_ended`) carry it (docs/apps.md).",
    )
    duration_ms: NonNegative = Field(description="This audio.")
    queued_ms: NonNegative = Field(
        description="All audio now queued in the session, this included."
    )


class PlayedUtterance(ResponseModel):
    """How much of one cut utterance the caller was sent."""

    utterance: int
    played_ms: NonNegative = Field(
        description="Its audio handed to the caller's audio track before the interrupt "
        "silenced the rest (0: cut before any of it was sent)."
    )


class Interrupted(ResponseModel):
    dropped_ms: NonNegative = Field(description="Audio dropped.")
    utterances: list[int] = Field(
        description="The utterances cut short or dropped, in order. Each one that had audio "
        "got its `speech_ended` (`interrupted: true`) before the `interrupted` event."
    )
    played: list[PlayedUtterance] = Field(
        default_factory=list,
        description="Per cut utterance, in the order of `utterances`: how much of it the "
        "caller was sent (`played_ms`, as in its `speech_ended`).",
    )


class Avatar(ResponseModel):
    id: AvatarId = Field(description="Pass as `avatar` in `POST /offer`.")
    name: str = Field(description="Display name.")
    clips: list[str] = Field(
        description="Its idle clips, sorted (`POST /sessions/{id}/idle`); `idle` always."
    )


class Avatars(ResponseModel):
    avatars: list[Avatar] = Field(description="Sorted by id.")


class IceServer(ResponseModel):
    urls: list[str] = Field(min_length=1)
    # Sent only when configured: absent, never null.
    username: str | SkipJsonSchema[None] = None
    credential: str | SkipJsonSchema[None] = None


class WebRtcConfig(ResponseModel):
    ice_servers: list[IceServer] = Field(
        serialization_alias="iceServers",
        description="`server.ice_servers`, ready for `new RTCPeerConnection()`.",
    )
    delay: DelayBudget = Field(
        description="The configured delay for a 25 fps avatar with `ave` audio features "
        "(unet_328, as the demo avatar); each session's own is in its `/offer` answer."
    )

    def dump(self) -> dict[str, Any]:
        """The config with unset TURN credentials left out (not null)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
