"""What an avatar needs to join a LiveKit room, checked before anything connects.

A LiveKit Agents avatar plugin mints the avatar's token and posts it with the server's
URL (``docs/design/livekit.md`` §22). The token is the LiveKit server's to verify (its
signature takes the API secret lipstream never sees); what can be read of it without the
secret is read here, so that a token that can only fail is refused at once, with what to
change, instead of after a connection attempt: a malformed one, one that expired, one
without ``roomJoin`` for a named room, one that may not publish media or data, or one
whose ``lk.publish_on_behalf`` attribute names no agent. The participant's identity,
name and attributes are the token's own.

The URL is the one the agent's worker connects to (``ws://``, ``wss://``, or the same
host as ``http://``/``https://``); unless ``livekit.allow_private`` is on, its host must
resolve to public addresses only, as an output's must (``streaming/broadcast/targets.py``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import jwt

from streaming.exceptions import LiveKitNotInstalledError, LiveKitTokenError, LiveKitUrlError

#: The attribute naming the agent whose media the avatar publishes (livekit-agents'
#: ``ATTRIBUTE_PUBLISH_ON_BEHALF``): frontends show the avatar's tracks as that agent's.
PUBLISH_ON_BEHALF = "lk.publish_on_behalf"
MAX_URL = 2048
MAX_TOKEN = 8192
_SCHEMES = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}
_DEFAULT_PORTS = {"ws": 80, "wss": 443}
#: Anything that looks like a JWT, taken out of the LiveKit SDK's error messages
#: (they quote the token they refused) before they reach an answer or a log.
_JWT = re.compile(r"eyJ[\w-]*\.[\w-]*\.[\w-]*")


def require_sdk() -> None:
    """Raise :class:`LiveKitNotInstalledError` unless LiveKit's SDK can be imported."""
    try:
        import livekit.rtc  # noqa: F401
    except ImportError as exc:
        raise LiveKitNotInstalledError(
            f"LiveKit sessions need LiveKit's SDK ({exc}); install it with "
            "pip install 'lipstream[livekit]' and restart the server"
        ) from None


def redacted(message: str) -> str:
    """``message`` with every token in it replaced by ``<token>``."""
    return _JWT.sub("<token>", message)


@dataclass(frozen=True)
class TokenClaims:
    """What the avatar's token says, read without its secret."""

    identity: str
    room: str
    agent: str  # the identity in lk.publish_on_behalf
    name: str = ""
    expires_at: float | None = None
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RoomJoin:
    """A checked request to join: the URL as the SDK takes it, the token, its claims."""

    url: str
    token: str
    claims: TokenClaims


async def checked_join(url: str, token: str, *, allow_private: bool) -> RoomJoin:
    """``url`` and ``token`` if an avatar may join with them, else
    :class:`LiveKitUrlError` or :class:`LiveKitTokenError` saying why."""
    claims = read_claims(token)
    return RoomJoin(await _checked_url(url, allow_private=allow_private), token, claims)


def read_claims(token: str, *, now: float | None = None) -> TokenClaims:
    """The claims of ``token`` (module doc), or :class:`LiveKitTokenError`."""
    if not token or len(token) > MAX_TOKEN:
        raise LiveKitTokenError(
            f"livekit_token must be a LiveKit access token (a JWT of at "
            f"most {MAX_TOKEN} characters)"
        )
    try:
        payload: dict[str, Any] = jwt.decode(
            token, options={"verify_signature": False, "verify_exp": False}
        )
    except jwt.PyJWTError as exc:
        raise LiveKitTokenError(f"livekit_token is not a JWT: {exc}") from None
    identity = payload.get("sub")
    if not isinstance(identity, str) or not identity:
        raise LiveKitTokenError(
            "livekit_token names no identity (sub): mint it with .with_identity(...)"
        )
    video = payload.get("video")
    if not isinstance(video, dict) or not video.get("roomJoin") or not video.get("room"):
        raise LiveKitTokenError(
            "livekit_token does not grant roomJoin for a named room: mint it with "
            ".with_grants(VideoGrants(room_join=True, room=<the agent's room>))"
        )
    for grant in ("canPublish", "canPublishData"):
        if video.get(grant) is False:
            raise LiveKitTokenError(
                f"livekit_token has {grant}=false: the avatar publishes its video and audio "
                "and answers the agent over data messages; leave the grant out or set it true"
            )
    exp = payload.get("exp")
    if isinstance(exp, int | float) and exp <= (time.time() if now is None else now):
        raise LiveKitTokenError(
            f"livekit_token expired {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(exp))}; "
            "mint a fresh one for each session"
        )
    attributes = payload.get("attributes")
    attributes = (
        {str(k): str(v) for k, v in attributes.items()} if isinstance(attributes, dict) else {}
    )
    agent = attributes.get(PUBLISH_ON_BEHALF, "")
    if not agent:
        raise LiveKitTokenError(
            f"livekit_token has no {PUBLISH_ON_BEHALF} attribute: name the agent the avatar "
            f"speaks for, .with_attributes({{'{PUBLISH_ON_BEHALF}': <the agent's identity>}})"
        )
    name = payload.get("name")
    return TokenClaims(
        identity=identity,
        room=str(video["room"]),
        agent=agent,
        name=name if isinstance(name, str) else "",
        expires_at=float(exp) if isinstance(exp, int | float) else None,
        attributes=attributes,
    )


async def _checked_url(url: str, *, allow_private: bool) -> str:
    if len(url) > MAX_URL or any(c.isspace() or ord(c) < 32 for c in url):
        raise LiveKitUrlError(f"livekit_url is at most {MAX_URL} characters, without spaces")
    parts = urlsplit(url)
    scheme = _SCHEMES.get(parts.scheme)
    if scheme is None:
        raise LiveKitUrlError(
            f"livekit_url must be ws://, wss://, http:// or https:// (the URL the agent "
            f"connects to), got {parts.scheme!r}"
        )
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        raise LiveKitUrlError("livekit_url's port is not a number in 1..65535") from None
    host = parts.hostname
    if not host:
        raise LiveKitUrlError("livekit_url names no host")
    sdk_url = urlunsplit((scheme, parts.netloc, parts.path, parts.query, ""))
    if allow_private:
        return sdk_url
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise LiveKitUrlError(f"livekit_url's host {host!r} does not resolve: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            raise LiveKitUrlError(
                f"livekit_url's host {host!r} is {address}, not a public address; set "
                "livekit.allow_private to join a LiveKit server on your own network"
            )
    return sdk_url
