"""Changing what a live call shows: its avatar and its idle clip (``docs/apps.md``).

The same requests go over HTTP (these bodies), the session's WebSocket and the caller's
data channel (as ``{"type": "switch_avatar", ...}`` / ``{"type": "set_idle_clip", ...}``
messages with the same fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from inference_core.avatars.package import AVATAR_ID_PATTERN
from web.schemas.base import AvatarId, NonNegative, RequestModel, ResponseModel, SessionId

#: What an idle clip's name looks like (the avatar package's rule).
CLIP_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"


class SwitchAvatar(RequestModel):
    value_codes: ClassVar[Mapping[str, str]] = {"avatar": "invalid_model_id", "token": "bad_field"}

    avatar: Annotated[str, Field(pattern=f"^{AVATAR_ID_PATTERN.pattern}$")] = Field(
        description="The avatar to show from the next frame (see `GET /avatars`). It must "
        "run at the call's fps and take the same audio features (else 409 "
        "`avatar_incompatible`)."
    )
    token: str | SkipJsonSchema[None] = Field(
        default=None,
        description="With session tokens on (`auth.jwt_secret`), a token for the new "
        "avatar; over HTTP the `Authorization` header may carry it instead.",
    )


class SetIdleClip(RequestModel):
    value_codes: ClassVar[Mapping[str, str]] = {"clip": "bad_field"}

    clip: Annotated[str, Field(pattern=CLIP_PATTERN)] = Field(
        description="One of the avatar's clips (`GET /avatars`, `GET /sessions/{id}`); "
        "plays while the avatar is silent."
    )


class AvatarSwitched(ResponseModel):
    session_id: SessionId
    avatar: AvatarId = Field(description="The avatar the call shows from `frame` on.")
    previous: AvatarId = Field(description="The avatar it showed before.")
    changed: bool = Field(description="False when the call showed `avatar` already.")
    frame: int | None = Field(
        ge=0,
        description="The first output frame of the new avatar (null when unchanged); "
        "`avatar_changed` comes when it is sent.",
    )
    media_ms: NonNegative | None = Field(
        description="That frame's media time (the timeline of the call's events)."
    )


class IdleClipSet(ResponseModel):
    session_id: SessionId
    clip: str = Field(description="The clip played while the avatar is silent, from now.")
    previous: str = Field(description="The clip played before.")
    clips: list[str] = Field(description="Every clip the call's avatar has.")
