"""What a request carries: its body read with a size limit, then parsed and validated.

aiohttp's ``request.read()`` is bounded only by the application-wide
``client_max_size``; every route here has its own limit, refused (413) as soon as the
declared length or the bytes received pass it. A JSON body, and query parameters, are
then validated against their model in :mod:`web.schemas`; :func:`validate` turns a
failure into the 400 error code the model names for it.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from aiohttp import web
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from web.errors import RequestError
from web.schemas import RequestModel

M = TypeVar("M", bound=RequestModel)


async def read_limited(request: web.Request, limit: int, what: str = "the body") -> bytes:
    """The whole body, or :class:`RequestError` 413 once it is known to exceed ``limit``."""
    return bytes(await read_buffer(request, limit, what))


async def read_buffer(request: web.Request, limit: int, what: str = "the body") -> bytearray:
    """:func:`read_limited`'s body as the buffer it was read into (no copy to ``bytes``).

    With a ``Content-Length`` the body goes into one buffer of that size as its chunks
    arrive (one copy of each byte; a raw inference body is tens of megabytes). A body
    that runs on past it (a compressed one, decoded) or has no length grows the buffer.
    """
    declared = request.content_length
    if declared is not None and declared > limit:
        raise RequestError(413, "body_too_large", f"{what} is {declared} bytes; at most {limit}")
    body = bytearray(declared or 0)
    filled = 0
    with memoryview(body) as view:
        while filled < len(body):
            chunk = await request.content.read(len(body) - filled)
            if not chunk:
                break
            view[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
    del body[filled:]
    while len(body) <= limit:  # read() may return less than asked: loop until EOF
        more = await request.content.read(limit + 1 - len(body))
        if not more:
            break
        body += more
    if len(body) > limit:
        raise RequestError(413, "body_too_large", f"{what} is over the limit of {limit} bytes")
    return body


def parse_json_object(body: bytes, example: str = "") -> dict[str, Any]:
    """A JSON object from ``body`` or :class:`RequestError` 400 ``bad_json``."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        hint = f" like {example}" if example else ""
        raise RequestError(400, "bad_json", f"the body must be a JSON object{hint}")
    return data


async def read_json(request: web.Request, model: type[M], limit: int) -> M:
    """The JSON body, at most ``limit`` bytes, validated against ``model``."""
    return parse_body(model, await read_limited(request, limit, "the JSON body"))


def parse_body(model: type[M], body: bytes, *, example: str = "", hint: str = "") -> M:
    """``body`` as a JSON object validated against ``model`` (see :func:`validate`)."""
    return validate(model, parse_json_object(body, example), hint=hint)


def validate(model: type[M], data: dict[str, Any], *, hint: str = "") -> M:
    """``data`` as ``model``, or :class:`RequestError` 400 for the first thing wrong.

    Missing fields and wrong types come before wrong values (the shape first). The code
    is the model's: ``missing_code`` for a missing field, ``wrong_type_code`` for a value
    of the wrong type, ``value_codes[field]`` for a value the field does not allow. The
    message names the field and what it allows, then ``hint`` (e.g. the devices there are).
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = sorted(
            exc.errors(include_url=False),
            key=lambda e: not (e["type"] == "missing" or _wrong_type(e)),
        )
        raise _request_error(model, errors[0], hint) from None


def _wrong_type(error: ErrorDetails) -> bool:
    kind = error["type"]
    # A Literal's error does not say why: a string is a wrong value, anything else a type.
    return kind.endswith("_type") or (
        kind == "literal_error" and not isinstance(error["input"], str)
    )


def _request_error(model: type[RequestModel], error: ErrorDetails, hint: str) -> RequestError:
    field = ".".join(str(part) for part in error["loc"])
    named = f"{model.noun} {field!r}"
    if error["type"] == "missing":
        code, message = model.missing_code, f"{named} is required: {_expected(model, field)}"
    else:
        code = model.wrong_type_code
        if not _wrong_type(error) and error["loc"]:
            code = model.value_codes.get(str(error["loc"][0]), code)
        reason = error["msg"][:1].lower() + error["msg"][1:]
        message = f"{named}: {reason}, got {_shown(error['input'])}"
    return RequestError(400, code, f"{message} ({hint})" if hint else message)


def _expected(model: type[RequestModel], field: str) -> str:
    """What a field takes, from its JSON schema: ``"offer"``, ``a string``, ``an integer``."""
    schema = model.model_json_schema()["properties"].get(field, {})
    if "const" in schema:
        return json.dumps(schema["const"])
    kind = schema.get("type", "value")
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _shown(value: object) -> str:
    text = json.dumps(value)  # it came from JSON or a query string
    return text if len(text) <= 40 else text[:37] + "..."
