"""CORS for an allow-list of origins (``server.cors_origins``; none by default).

Requests from an allowed origin get ``Access-Control-Allow-Origin`` for that origin, and
preflights are answered here; any other origin gets no CORS headers, so browsers keep
their pages out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from aiohttp.typedefs import Middleware

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ALLOWED_METHODS = "GET, POST, DELETE, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type"
EXPOSED_HEADERS = (
    "Retry-After, X-Lipstream-Device, X-Lipstream-Inference-Ms, X-Lipstream-Batch-Size, "
    "X-Lipstream-Output-Shape, Location, Link"  # Location, Link: WHEP and WHIP (§21)
)


def cors_middleware(origins: Iterable[str]) -> Middleware:
    """A middleware allowing exactly ``origins`` (exact match, e.g. ``https://app.example``)."""
    allowed = frozenset(origin.rstrip("/") for origin in origins)

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None or origin not in allowed:
            return await handler(request)
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            response: web.StreamResponse = web.Response(status=204)
            response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
            response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
            response.headers["Access-Control-Max-Age"] = "600"
        else:
            response = await handler(request)
            response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"
        return response

    return cors
