"""The checks an offer passes before any session is made for it, in one process or a front.

In this order (``docs/design/failure.md`` §12, ``docs/design/cluster.md`` §14): the
server is not draining (503 + Retry-After), the caller's address is under
``server.offer_rate_limit_per_minute`` (429 + Retry-After), the body is within
``server.max_offer_bytes`` (413), it is JSON of an offer's shape (400), it carries a
session token for its avatar when ``auth.jwt_secret`` is set (401/403), and its SDP is
one lipstream can answer (400). A cluster front runs them all before it asks any worker,
so bad input costs a worker nothing and is refused exactly as one process refuses it.
Only one process can tell whether the avatar is registered (a front has no inference
core): it passes that check as ``avatar_known``, which runs after the token and before
the SDP, so an unknown avatar is 404 whatever the SDP says.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from streaming.exceptions import SessionLimitError
from streaming.webrtc.offer_check import OfferInfo, OfferLimits, check_offer
from web.app_keys import DRAINING, OFFER_LIMITER, SETTINGS
from web.errors import RequestError
from web.request_body import parse_body, read_limited
from web.schemas.signalling import Offer
from web.session_tokens import require_token


@dataclass(frozen=True)
class CheckedOffer:
    """An offer that passed every check: its body, what its SDP asks for, and its bytes as
    read (a front forwards those unchanged)."""

    body: Offer
    info: OfferInfo
    raw: bytes


async def check_offer_request(
    request: web.Request, *, avatar_known: Callable[[str], None] | None = None
) -> CheckedOffer:
    """Run the checks of the module doc on ``request``; raise the first that fails."""
    if request.app[DRAINING].draining:  # 503 + Retry-After (web.errors)
        raise SessionLimitError("the server is shutting down; try again shortly")
    settings = request.app[SETTINGS]
    refuse_if_rate_limited(request)
    raw = await read_limited(request, settings.server.max_offer_bytes, "the JSON body")
    body = parse_body(Offer, raw)
    require_token(request, settings.auth, body.avatar_id)
    if avatar_known is not None:
        avatar_known(body.avatar_id)
    info = check_offer(body.sdp, OfferLimits(max_bytes=settings.server.max_offer_bytes))
    return CheckedOffer(body=body, info=info, raw=raw)


def refuse_if_rate_limited(request: web.Request) -> None:
    """429 + Retry-After when the caller's address sent too many offers this minute."""
    wait = request.app[OFFER_LIMITER].retry_after(request.remote or "unknown")
    if wait is not None:
        limit = request.app[SETTINGS].server.offer_rate_limit_per_minute
        raise RequestError(
            429,
            "rate_limited",
            f"too many offers from this address; at most {limit} per minute",
            retry_after=max(1, math.ceil(wait)),
        )
