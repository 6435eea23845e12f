"""Signed session tokens: JWTs scoped to one avatar, required when ``auth.jwt_secret`` is set.

The algorithm is pinned (a token signed with another, or unsigned, is refused), ``exp``
is required and bounded by ``auth.max_ttl_s``, and the ``avatar`` claim scopes the token:
a token for avatar A cannot open or control a session on avatar B. PyJWT does the
cryptography and claim checks; we only decide what to require.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jwt
from aiohttp import web

from config.settings import AuthSettings
from web.errors import RequestError


@dataclass(frozen=True)
class SessionToken:
    """A verified token's claims we use."""

    avatar: str
    subject: str | None
    expires_at: float


def mint_token(
    settings: AuthSettings, avatar: str, *, ttl_s: float, subject: str | None = None
) -> str:
    """A token for ``avatar`` valid for ``ttl_s`` seconds (for tests and the CLI)."""
    if settings.jwt_secret is None:
        raise ValueError("auth.jwt_secret is not set: there is no key to sign tokens with")
    if not 0 < ttl_s <= settings.max_ttl_s:
        raise ValueError(f"ttl must be in (0, {settings.max_ttl_s:g}] seconds (auth.max_ttl_s)")
    now = int(time.time())
    claims: dict[str, object] = {"avatar": avatar, "iat": now, "exp": now + int(ttl_s)}
    if subject is not None:
        claims["sub"] = subject
    secret = settings.jwt_secret.get_secret_value()
    return jwt.encode(claims, secret, algorithm=settings.jwt_algorithm)


def verify_token(settings: AuthSettings, token: str) -> SessionToken:
    """Check ``token``'s signature and claims; :class:`RequestError` 401 when it fails."""
    assert settings.jwt_secret is not None
    try:
        claims = jwt.decode(
            token,
            settings.jwt_secret.get_secret_value(),
            algorithms=[settings.jwt_algorithm],
            options={"require": ["exp", "iat", "avatar"]},
            leeway=settings.leeway_s,
        )
    except jwt.ExpiredSignatureError:
        raise _unauthorized("the session token has expired") from None
    except jwt.InvalidTokenError:
        raise _unauthorized("the session token is not valid") from None
    avatar, issued, expires = claims.get("avatar"), claims["iat"], claims["exp"]
    if not isinstance(avatar, str):
        raise _unauthorized("the session token is not valid")
    if expires - issued > settings.max_ttl_s + settings.leeway_s:
        raise _unauthorized("the session token lives longer than the server allows")
    subject = claims.get("sub")
    return SessionToken(avatar, subject if isinstance(subject, str) else None, float(expires))


def require_token(
    request: web.Request, settings: AuthSettings, avatar: str, *, query: bool = False
) -> None:
    """When tokens are on, the request must carry a valid one for ``avatar`` (else 401).

    With ``query``, a ``?token=`` parameter is taken too, for the routes browsers open with
    ``WebSocket`` and ``EventSource``, which cannot set headers.
    """
    if settings.jwt_secret is None:
        return
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        value = request.query.get("token", "") if query else ""
        if not value.strip():
            where = " (or ?token=<token>)" if query else ""
            raise _unauthorized(
                f"a session token is required: send Authorization: Bearer <token>{where}"
            )
    token = verify_token(settings, value.strip())
    if token.avatar != avatar:
        raise _unauthorized("the session token is for another avatar")


def _unauthorized(message: str) -> RequestError:
    return RequestError(401, "unauthorized", message)
