"""Short-lived TURN credentials in the TURN REST form coturn's ``use-auth-secret`` checks.

username = ``<unix expiry>:<id>``, credential = base64(HMAC-SHA1(secret, username)).
coturn recomputes the HMAC with its ``static-auth-secret`` and refuses the allocation
once the expiry has passed, so clients never hold a lasting password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

from config.settings import TurnSettings


def turn_credentials(
    secret: str, user: str, ttl_s: int, *, now: float | None = None
) -> tuple[str, str]:
    """``(username, credential)`` valid for ``ttl_s`` seconds from ``now``."""
    expiry = int(time.time() if now is None else now) + ttl_s
    username = f"{expiry}:{user}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode("ascii")


def turn_server(
    settings: TurnSettings, user: str | None = None
) -> tuple[list[str], str, str] | None:
    """``(urls, username, credential)`` for ``user`` (a random id by default), or None
    when no TURN server is configured."""
    if not settings.urls or settings.secret is None:
        return None
    who = user or secrets.token_hex(6)
    username, credential = turn_credentials(settings.secret.get_secret_value(), who, settings.ttl_s)
    return list(settings.urls), username, credential
