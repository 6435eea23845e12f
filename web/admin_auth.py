"""Who may use the admin routes: a bearer token, or, without one, only this machine.

* ``server.admin_token`` set: every admin request needs ``Authorization: Bearer <token>``
  (compared in constant time). Anything else gets 401 with ``WWW-Authenticate: Bearer``
  and one fixed message, whatever was wrong (missing header, other scheme, wrong token).
* no token: admin routes answer only requests from a loopback peer (127.0.0.0/8, ::1)
  that carry no proxy forwarding header. A reverse proxy on the same host connects from
  loopback on behalf of remote clients; its ``Forwarded``/``X-Forwarded-For`` header gives
  it away, so proxied requests are refused too. A loopback peer can also be a browser on
  this machine running some other site's script, so the ``Host`` must name this machine
  (no DNS rebinding) and an ``Origin``, when sent, must be a loopback one (no cross-site
  POST). Others get 403 saying to set the token.

Applied per route with :func:`admin_only`, so no other route is affected. The admin
page itself (HTML, no data) is served with ``page=True``: a browser navigation cannot
send a bearer header, so with a token configured the page loads without it and asks for
the token, which every JSON call it makes then sends.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import SecretStr

from web.app_keys import SETTINGS
from web.errors import json_error

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

UNAUTHORIZED_MESSAGE = "admin access needs a valid bearer token"
FORBIDDEN_MESSAGE = (
    "admin access is limited to this machine because server.admin_token is not set; "
    "configure server.admin_token and send it as 'Authorization: Bearer <token>'"
)
# Headers a reverse proxy adds for the client it forwards.
_PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")


def is_loopback(remote: str | None) -> bool:
    """True for a loopback peer address (127.0.0.0/8, ::1, or IPv4-mapped 127.x)."""
    if not remote:
        return False
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:  # a unix socket path, a scoped address: not provably local
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def _names_this_machine(url: str) -> bool:
    try:
        host = urlsplit(url).hostname  # lower-cased, IPv6 brackets removed
    except ValueError:
        return False
    return host is not None and (host == "localhost" or is_loopback(host))


def is_local_request(request: web.Request) -> bool:
    """From this machine, not through a proxy, not a cross-site browser request."""
    if not is_loopback(request.remote):
        return False
    if any(name in request.headers for name in _PROXY_HEADERS):
        return False
    # Browsers always send Host; a script without one is no rebinding risk. (Not
    # request.host: without the header it falls back to a blocking getfqdn().)
    host = request.headers.get("Host")
    if host is not None and not _names_this_machine(f"http://{host}"):
        return False
    origin = request.headers.get("Origin")
    return origin is None or _names_this_machine(origin)


def bearer_matches(header: str | None, token: SecretStr) -> bool:
    if header is None:
        return False
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    expected = token.get_secret_value().encode()
    # Bytes, not str: compare_digest refuses non-ASCII str, and a header may hold any.
    return hmac.compare_digest(presented.strip().encode("utf-8", "surrogateescape"), expected)


def admin_denial(
    request: web.Request, token: SecretStr | None, *, page: bool = False
) -> web.Response | None:
    """The error response for a request the admin rule refuses, or ``None`` to let it in.

    ``page=True`` skips the token check (not the loopback rule) for the admin page.
    """
    if token is not None and token.get_secret_value():
        if page or bearer_matches(request.headers.get("Authorization"), token):
            return None
        logger.info("admin request refused (no valid token): %s %s", request.method, request.path)
        response = json_error(401, "unauthorized", UNAUTHORIZED_MESSAGE)
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
    if is_local_request(request):
        return None
    logger.info(
        "admin request refused (not local, no admin_token set): %s %s from %s",
        request.method,
        request.path,
        request.remote,
    )
    return json_error(403, "forbidden", FORBIDDEN_MESSAGE)


def admin_only(handler: Handler, *, page: bool = False) -> Handler:
    """Wrap ``handler`` so it runs only for requests the admin rule lets in."""

    @functools.wraps(handler)
    async def guarded(request: web.Request) -> web.StreamResponse:
        denial = admin_denial(request, request.app[SETTINGS].server.admin_token, page=page)
        if denial is not None:
            return denial
        return await handler(request)

    return guarded
