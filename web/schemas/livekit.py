"""A LiveKit agent's avatar in its room (``POST /livekit/sessions``, ``docs/design/livekit.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar

from pydantic import Field

from inference_core.avatars.package import AVATAR_ID_PATTERN
from web.schemas.base import AvatarId, NonNegative, RequestModel, ResponseModel, SessionId
from web.schemas.signalling import DelayBudget


class NewLiveKitSession(RequestModel):
    """What an avatar plugin posts (`lipstream_client.livekit.AvatarSession` does); at
    most `server.max_offer_bytes` of JSON."""

    value_codes: ClassVar[Mapping[str, str]] = {
        "avatar": "invalid_model_id",
        "livekit_url": "bad_livekit_url",
        "livekit_token": "bad_livekit_token",
    }

    livekit_url: str = Field(
        min_length=1,
        max_length=2048,
        description="The LiveKit server the agent is in: `ws(s)://` or `http(s)://` host.",
    )
    livekit_token: str = Field(
        min_length=1,
        max_length=8192,
        description="The avatar's access token: kind `agent`, `roomJoin` for the agent's "
        "room, the attribute `lk.publish_on_behalf` = the agent's identity. The avatar "
        "joins with the token's identity, name and attributes.",
    )
    avatar: Annotated[str, Field(pattern=f"^({AVATAR_ID_PATTERN.pattern})?$")] | None = Field(
        default="demo",
        description="Avatar id (see `GET /avatars`); empty or null means `demo`.",
    )
    idle_clip: str | None = Field(
        default=None,
        max_length=128,
        description="The idle clip to play while the avatar listens (its default if null).",
    )

    @property
    def avatar_id(self) -> str:
        """The avatar asked for, ``demo`` when none is named."""
        return self.avatar or "demo"


class LiveKitSessionCreated(ResponseModel):
    session_id: SessionId
    avatar: AvatarId
    room: str = Field(description="The room joined (the token's).")
    identity: str = Field(description="The avatar's participant identity (the token's).")
    agent: str = Field(description="The agent it publishes for (`lk.publish_on_behalf`).")
    join_ms: NonNegative = Field(
        description="From the request to the avatar's tracks published in the room."
    )
    whep: str = Field(description="Where viewers `POST` their SDP offer (WHEP), a path.")
    delay: DelayBudget = Field(description="The session's delay, with its avatar's lookahead.")
