"""Sessions no caller owns, their viewers and their outputs (``docs/design/broadcast.md`` §21)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from inference_core.avatars.package import AVATAR_ID_PATTERN
from web.schemas.base import AvatarId, Count, NonNegative, RequestModel, ResponseModel, SessionId
from web.schemas.signalling import DelayBudget


class OutputTarget(RequestModel):
    """Where a session pushes a stream: `rtmp`, or `whip` (with its `token`)."""

    value_codes: ClassVar[Mapping[str, str]] = {
        "rtmp": "bad_output",
        "whip": "bad_output",
        "token": "bad_output",
    }

    rtmp: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="`rtmp://host[:port]/app/stream-key` (or `rtmps://`): H.264 + AAC in FLV.",
    )
    whip: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="A WHIP endpoint, `http(s)://...`: H.264 + Opus over WebRTC (RFC 9725).",
    )
    token: str | None = Field(
        default=None, max_length=4096, description="The WHIP endpoint's bearer token."
    )


class NewSession(RequestModel):
    """At most `server.max_offer_bytes` of JSON."""

    value_codes: ClassVar[Mapping[str, str]] = {
        "avatar": "invalid_model_id",
        "outputs": "bad_output",
    }

    avatar: Annotated[str, Field(pattern=f"^({AVATAR_ID_PATTERN.pattern})?$")] | None = Field(
        default="demo",
        description="Avatar id (see `GET /avatars`); empty or null means `demo`.",
    )

    outputs: list[OutputTarget] = Field(
        default_factory=list,
        description="Streams to push from the start (each as `POST .../outputs` takes).",
    )

    @property
    def avatar_id(self) -> str:
        """The avatar asked for, ``demo`` when none is named."""
        return self.avatar or "demo"


class SessionCreated(ResponseModel):
    session_id: SessionId
    avatar: AvatarId
    whep: str = Field(description="Where viewers `POST` their SDP offer (WHEP), a path.")
    delay: DelayBudget = Field(description="The session's delay, with its avatar's lookahead.")


class ViewerLeft(ResponseModel):
    viewer_id: str
    state: Literal["closed"]


class OutputState(ResponseModel):
    output_id: str
    kind: Literal["rtmp", "whip"]
    target: str = Field(description="The URL without its stream key.")
    state: Literal["connecting", "live", "retrying", "ended"]
    frames_sent: Count
    frames_dropped: Count = Field(description="Frames the ingest was too slow to take.")
    bytes_sent: Count
    connects: Count = Field(description="Times the output went live.")
    retries: Count
    last_error: str | None
    started_at: NonNegative = Field(description="Unix time the output was added.")


class OutputList(ResponseModel):
    outputs: list[OutputState]
