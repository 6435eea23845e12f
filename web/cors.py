"""CORS for an allow-list of origins (``server.cors_origins``; none by default).

Requests from an allowed origin get ``Access-Control-Allow-Origin`` for that origin, and
preflights are answered here; any other origin gets no CORS headers, so browsers keep
their pages out.

Once any origin is allowed, an answer depends on the request's ``Origin``, so every
response says so with ``Vary: Origin`` (added to whatever ``Vary`` the handler set): to
an allowed origin, to another one, to a request without the header, an error or a
refused preflight alike. Otherwise a shared cache could hand one origin's answer to
another (a cached answer without ``Access-Control-Allow-Origin`` to the allowed page,
or one with it to any page). The headers are put on as each response is prepared
(:func:`cors_headers`, an ``on_response_prepare`` hook), so a streamed response, sent
before its handler returns, carries them too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PrepareHook = Callable[[web.Request, web.StreamResponse], Awaitable[None]]

ALLOWED_METHODS = "GET, POST, DELETE, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type"
EXPOSED_HEADERS = (
    "Retry-After, X-Lipstream-Device, X-Lipstream-Inference-Ms, X-Lipstream-Batch-Size, "
    "X-Lipstream-Output-Shape, Location, Link"  # Location, Link: WHEP and WHIP (§21)
)


def _allowed(origins: Iterable[str]) -> frozenset[str]:
    return frozenset(origin.rstrip("/") for origin in origins)


def _is_preflight(request: web.Request) -> bool:
    return request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers


def cors_middleware(origins: Iterable[str]) -> Middleware:
    """A middleware answering the preflights of exactly ``origins`` (exact match, e.g.
    ``https://app.example``); :func:`cors_headers` puts the headers on every answer."""
    allowed = _allowed(origins)

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.headers.get("Origin") in allowed and _is_preflight(request):
            response = web.Response(status=204)
            response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
            response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
            response.headers["Access-Control-Max-Age"] = "600"
            return response
        return await handler(request)

    return cors


def cors_headers(origins: Iterable[str]) -> PrepareHook | None:
    """The ``on_response_prepare`` hook for ``origins``: ``Vary: Origin`` on every
    response and the allowed origin's headers on its own; None when no origin is allowed
    (then no answer depends on the origin)."""
    allowed = _allowed(origins)
    if not allowed:
        return None

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        add_vary(response, "Origin")
        origin = request.headers.get("Origin")
        if origin not in allowed:
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        if not _is_preflight(request):
            response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS

    return add_headers


def add_vary(response: web.StreamResponse, header: str) -> None:
    """Add ``header`` to the response's ``Vary`` list, keeping what is there (once each;
    ``Vary: *`` already covers it)."""
    present = [
        name.strip()
        for value in response.headers.getall(hdrs.VARY, ())
        for name in value.split(",")
        if name.strip()
    ]
    if "*" in present or header.lower() in (name.lower() for name in present):
        return
    response.headers[hdrs.VARY] = ", ".join([*present, header])
