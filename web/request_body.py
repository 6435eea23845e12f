"""Reading request bodies with a size limit, before anything is parsed.

aiohttp's ``request.read()`` is bounded only by the application-wide
``client_max_size``; every route here has its own limit, refused (413) as soon as the
declared length or the bytes received pass it.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from web.errors import RequestError


async def read_limited(request: web.Request, limit: int, what: str = "the body") -> bytes:
    """The whole body, or :class:`RequestError` 413 once it is known to exceed ``limit``."""
    if request.content_length is not None and request.content_length > limit:
        raise RequestError(
            413, "body_too_large", f"{what} is {request.content_length} bytes; at most {limit}"
        )
    body = b""
    while len(body) <= limit:  # read() may return less than asked: loop until EOF
        more = await request.content.read(limit + 1 - len(body))
        if not more:
            break
        body += more
    if len(body) > limit:
        raise RequestError(413, "body_too_large", f"{what} is over the limit of {limit} bytes")
    return body


def parse_json_object(body: bytes, example: str = "") -> dict[str, Any]:
    """A JSON object from ``body`` or :class:`RequestError` 400 saying what is wrong."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        hint = f" like {example}" if example else ""
        raise RequestError(400, "bad_json", f"the body must be a JSON object{hint}")
    return data
