"""How one operation of the HTTP API is declared: :class:`Operation` and its parts.

An operation names its path and method, what it takes (a JSON body model, a binary
body's content types, a query model), what it answers when it does not fail (a
:class:`Reply` per status: a response model or content types) and, per error status,
the codes it can send. Field types live only in the models. The table of every
operation is :data:`web.schemas.routes.OPERATIONS`; :mod:`web.openapi` renders it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from web.schemas.base import RequestModel

Tag = Literal["sessions", "inference", "inference-protocol", "admin", "service"]
#: ``admin``: ``server.admin_token`` or the loopback rule; ``session``: ``auth.jwt_secret``.
Access = Literal["admin", "session"]


@dataclass(frozen=True)
class Header:
    """A response header the server always sends."""

    name: str
    description: str = ""
    integer: bool = False


@dataclass(frozen=True)
class Reply:
    """One response that is not an error: a JSON ``model`` (a :class:`ResponseModel`, or a
    ``RootModel`` for a JSON array), or bodies of ``media`` types."""

    status: int
    description: str
    model: type[BaseModel] | None = None
    media: tuple[str, ...] = ()
    empty: bool = False  # the ``media`` bodies are empty
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True)
class Operation:
    """One method on one path. ``errors``: the codes each error status carries, beyond
    those :mod:`web.openapi` adds (a JSON body's ``bad_json`` and validation codes, a
    query's, 401/403 for ``access``, 500 ``internal_error`` everywhere).
    """

    operation_id: str
    method: Literal["get", "post", "delete"]
    path: str
    tag: Tag
    summary: str
    replies: tuple[Reply, ...]
    errors: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    description: str | None = None
    body: type[RequestModel] | None = None  # a JSON body
    body_required: bool = True
    body_media: tuple[str, ...] = ()  # a binary body, by content type
    query: type[RequestModel] | None = None
    access: Access | None = None
    #: Errors in the Open Inference Protocol's shape, ``{"error": "message"}`` (``/v2``).
    protocol_errors: bool = False


def file_replies(media: str, description: str) -> tuple[Reply, ...]:
    """What aiohttp's file responses send: whole files, ranges, conditional answers."""
    return (
        Reply(200, description, media=(media,)),
        Reply(206, "The requested byte range (`Range`).", media=(media,)),
        Reply(304, "Not modified since `If-Modified-Since`."),
        Reply(412, "Modified since `If-Unmodified-Since`."),
        Reply(416, "The requested range is outside the file."),
    )
