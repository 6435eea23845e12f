"""Sessions no caller owns, and their viewers (``docs/architecture.md`` §21)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from inference_core.avatars.package import AVATAR_ID_PATTERN
from web.schemas.base import AvatarId, RequestModel, ResponseModel, SessionId
from web.schemas.signalling import DelayBudget


class NewSession(RequestModel):
    """At most `server.max_offer_bytes` of JSON."""

    value_codes: ClassVar[Mapping[str, str]] = {"avatar": "invalid_model_id"}

    avatar: Annotated[str, Field(pattern=f"^({AVATAR_ID_PATTERN.pattern})?$")] | None = Field(
        default="demo",
        description="Avatar id (see `GET /avatars`); empty or null means `demo`.",
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
