"""What every listener lipstream serves starts from: one process's app and a cluster front's.

Both face callers the same way (``docs/design/failure.md`` §12), so both are built on
:func:`edge_app`: the connection guard (a request head in time, a per-address cap), the
caller's address behind trusted proxies, CORS for the allowed origins, and errors as
JSON, in that order. The app also holds, from its creation, the state the offer gate
(``web/offer_gate.py``), the probes (``/health``, ``/ready``) and the serve loop
(``web/serve.py``) read: the settings, the per-address offer limiter, the drain flag and
the process's liveness. Built once here, a front cannot drift from one process at its edge.
"""

from __future__ import annotations

from aiohttp import web

from config.settings import Settings
from web.app_keys import DRAINING, LIVENESS, OFFER_LIMITER, SETTINGS, DrainState, Liveness
from web.client_address import client_address_middleware
from web.connection_guard import GUARD, ConnectionGuard
from web.cors import cors_headers, cors_middleware
from web.errors import error_middleware
from web.rate_limit import RateLimiter


def edge_app(settings: Settings) -> web.Application:
    """A new application with the edge every lipstream listener has (module doc)."""
    server = settings.server
    guard = ConnectionGuard.for_server(server)
    app = web.Application(
        middlewares=[
            guard.middleware,  # first: the head has arrived, whatever the rest answers
            client_address_middleware(server.trusted_proxies, server.forwarded_header),
            cors_middleware(server.cors_origins),
            error_middleware,
        ]
    )
    add_cors_headers = cors_headers(server.cors_origins)
    if add_cors_headers is not None:
        app.on_response_prepare.append(add_cors_headers)
    app[GUARD] = guard
    app[SETTINGS] = settings
    app[OFFER_LIMITER] = RateLimiter(server.offer_rate_limit_per_minute)
    app[DRAINING] = DrainState()
    app[LIVENESS] = Liveness()
    return app
