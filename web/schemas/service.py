"""Liveness and readiness: what load balancers and orchestrators read."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from web.schemas.base import ResponseModel


class Health(ResponseModel):
    status: Literal["ok"]


class Ready(ResponseModel):
    ready: Literal[True]
    avatar_root: str = Field(description="`readable`, or `absent (demo avatar only)`.")
    devices: list[str] = Field(description="Devices with running inference workers.")
    draining: Literal[False]


class NotReady(ResponseModel):
    """Not the `Error` shape: a probe reads the status, a person the reasons."""

    ready: Literal[False]
    reasons: list[str] = Field(min_length=1, description="Every reason, for people.")


class OpenApiDocument(ResponseModel):
    """An OpenAPI 3.1 document: this one."""

    model_config = ConfigDict(extra="allow")

    openapi: str = Field(pattern=r"^3\.1\.\d+$")
    info: dict[str, Any]
    paths: dict[str, Any]
