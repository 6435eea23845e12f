"""What every request and response model shares, and the field types used across them.

* :class:`RequestModel`: what a client sends (a JSON body, or query parameters). Open:
  keys the server does not know are ignored, so clients may send more. Strict for JSON:
  ``"1"`` is not an integer and ``true`` is not a device index. Each model names the
  error codes its fields fail with (see :func:`web.request_body.validate`).
* :class:`ResponseModel`: what the server sends. Closed (``additionalProperties:
  false``): the server never sends a key the document does not name. Built with
  validation: a handler whose answer breaks its model fails (500, logged) rather than
  send what the document does not describe; :meth:`ResponseModel.dump` serialises it.
* :class:`Error`: the body of every 4xx and 5xx (:mod:`web.errors` sends it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from inference_core.avatars.package import AVATAR_ID_PATTERN


class RequestModel(BaseModel):
    """A request body or a set of query parameters, as the server validates it."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    #: How error messages name one of its values.
    noun: ClassVar[str] = "field"
    #: The error code for a missing value.
    missing_code: ClassVar[str] = "bad_field"
    #: The error code for a value of the wrong type (a number for a string, ...).
    wrong_type_code: ClassVar[str] = "bad_field"
    #: Codes by field for a value of the right type that the field does not allow.
    value_codes: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def error_codes(cls) -> tuple[str, ...]:
        """Every code validating this model can answer (400), in a stable order."""
        required = any(field.is_required() for field in cls.model_fields.values())
        codes = (*((cls.missing_code,) if required else ()), cls.wrong_type_code)
        return tuple(dict.fromkeys((*codes, *cls.value_codes.values())))


class ResponseModel(BaseModel):
    """A JSON response body."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def dump(self) -> dict[str, Any]:
        """The body as JSON-ready data, keys as the document names them."""
        return self.model_dump(mode="json", by_alias=True)


# --- field types -----------------------------------------------------------------------

Count = Annotated[int, Field(ge=0)]
NonNegative = Annotated[float, Field(ge=0)]
#: Counts by reason, e.g. ``{"late": 2}``: only reasons that happened appear.
Counts = dict[str, Count]
AvatarId = Annotated[str, Field(pattern=f"^{AVATAR_ID_PATTERN.pattern}$")]
SessionId = Annotated[
    str,
    Field(
        pattern="^[A-Za-z0-9_-]+$",
        description="Random, URL-safe; names the session in `/sessions/{session_id}`.",
    ),
]
SessionStateName = Literal["new", "connected", "streaming", "closed"]
#: What a session is (its snapshot's ``kind``).
SessionKind = Literal["call", "callerless", "whip", "livekit"]
#: ISO 8601 with milliseconds, UTC (``2025-01-31T12:00:00.000+00:00``).
UtcTime = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


# --- errors ----------------------------------------------------------------------------


class ErrorDetail(ResponseModel):
    code: str = Field(
        pattern="^[a-z0-9_]+$",
        description="Stable, for programs; each operation lists its own.",
    )
    message: str = Field(description="For people: what to do.")


class Error(ResponseModel):
    """Every error the server sends, with any 4xx or 5xx status."""

    error: ErrorDetail
