"""The HTTP side of a lipstream server: avatars, session control, events, audio streams,
sessions no caller owns and their viewers' offers (WHEP)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import quote, unquote, urljoin, urlsplit

import numpy as np
from aiohttp import (
    ClientResponse,
    ClientSession,
    ClientTimeout,
    ClientWebSocketResponse,
    WSServerHandshakeError,
)

from lipstream_client.audio_stream import AudioStream
from lipstream_client.errors import LipstreamError, error_for, error_from_body
from lipstream_client.models import (
    Answer,
    Avatar,
    AvatarSwitched,
    CreatedSession,
    IceServer,
    IdleClipSet,
    LiveKitSession,
    Queued,
    WebRtcConfig,
    WhepAnswer,
)
from lipstream_client.pcm import STREAM_RATES, PcmFormat, pcm_format_for, to_pcm_bytes
from lipstream_client.sse import EventStream

logger = logging.getLogger(__name__)

#: Events arrive at any time, with a keepalive every 15 s: no total timeout, and a read
#: timeout that tolerates three missed keepalives.
EVENTS_TIMEOUT = ClientTimeout(total=None, sock_read=45.0)

# A refused WebSocket upgrade reaches aiohttp's client as a status without its body:
# the codes docs/apps.md gives for each status.
_HANDSHAKE_CODES: Mapping[int, str] = {
    400: "bad_stream_format",
    401: "unauthorized",
    404: "session_not_found",
    409: "stream_busy",
}

#: A WHEP offer and its answer are the SDP itself (RFC 9725).
SDP = "application/sdp"
# One link of a ``Link`` header (RFC 8288): ``<url>`` and its ``; name=value`` parameters,
# each value a token or a quoted string.
_LINK = re.compile(r'\s*<([^>]*)>((?:\s*;\s*[^;,=\s]+\s*=\s*(?:"(?:[^"\\]|\\.)*"|[^;,]*))*)')
_LINK_PARAM = re.compile(r';\s*([^;,=\s]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;,]*)')


class Client:
    """A lipstream server's HTTP API at ``base_url`` (``"http://127.0.0.1:8080"``).

    ``token`` (a session JWT) is sent as ``Authorization: Bearer`` on every request.
    Pass ``session`` to share an :class:`aiohttp.ClientSession` (it is not closed here);
    otherwise one is made on first use and closed by :meth:`close`. Every method raises
    a :class:`LipstreamError` subclass for an error answer (:mod:`lipstream_client.errors`)
    and lets :class:`aiohttp.ClientError` through for a connection that failed.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        session: ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session = session
        self._owns_session = session is None
        self._closed = False

    # -- lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session, if this client made it; the client is done then."""
        self._closed = True
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    # -- the server -------------------------------------------------------------------

    async def avatars(self) -> list[Avatar]:
        """The avatars a call may show, sorted by id, with their idle clips."""
        body = await self._json("GET", "/avatars")
        return [Avatar.from_json(a) for a in body["avatars"]]

    async def webrtc_config(self) -> WebRtcConfig:
        """ICE servers for the client (with per-client TURN credentials, if configured) and
        the configured delay."""
        return WebRtcConfig.from_json(await self._json("GET", "/webrtc-config"))

    async def offer(self, sdp: str, avatar: str) -> Answer:
        """Send a WebRTC offer (ICE fully gathered) for ``avatar``: the answer and the new
        session. :func:`lipstream_client.connect` does this; use it with a peer
        connection of your own."""
        body = {"sdp": sdp, "type": "offer", "avatar": avatar}
        return Answer.from_json(await self._json("POST", "/offer", json=body))

    async def create_session(self, avatar: str = "demo") -> CreatedSession:
        """Open a session of ``avatar`` that no caller owns (``POST /sessions``): its media
        runs from now on, for viewers (:func:`lipstream_client.watch`). Make it speak
        with :meth:`say`, :meth:`push_audio`, :meth:`stream_audio`; end it with
        :meth:`hang_up`."""
        body = {"avatar": avatar}
        return CreatedSession.from_json(await self._json("POST", "/sessions", json=body))

    async def create_livekit_session(
        self,
        livekit_url: str,
        livekit_token: str,
        *,
        avatar: str = "demo",
        idle_clip: str | None = None,
    ) -> LiveKitSession:
        """Have ``avatar`` join a LiveKit room as an agent's avatar, with the token
        ``livekit_token`` minted for it (``POST /livekit/sessions``; what
        :class:`lipstream_client.livekit.AvatarSession` does). Returns once it joined."""
        body: dict[str, Any] = {
            "livekit_url": livekit_url,
            "livekit_token": livekit_token,
            "avatar": avatar,
        }
        if idle_clip is not None:
            body["idle_clip"] = idle_clip
        data = await self._json("POST", "/livekit/sessions", json=body)
        return LiveKitSession.from_json(data)

    async def whep_offer(self, session_id: str, sdp: str) -> WhepAnswer:
        """Send a viewer's offer (receive-only, ICE fully gathered) for the session
        ``session_id`` as WHEP does (``application/sdp``): the answer, the viewer's
        resource and the ICE servers listed for it. :func:`lipstream_client.watch` does
        this; use it with a peer connection of your own."""
        url = self._url(_session(session_id, "/whep"))
        headers = {**self._headers, "Content-Type": SDP}
        async with self._http().post(url, data=sdp.encode(), headers=headers) as response:
            await _raise_for_error(response)
            answer = await response.text()
            location = self._resolve(response.headers["Location"])
            links = response.headers.getall("Link", [])
        logger.debug("POST %s -> %d", url, response.status)
        return WhepAnswer(
            sdp=answer,
            location=location,
            viewer_id=unquote(urlsplit(location).path.rstrip("/").rsplit("/", 1)[-1]),
            ice_servers=ice_servers_from_links(links),
        )

    async def end_viewer(self, location: str) -> None:
        """End a viewer: ``DELETE`` its resource (:attr:`WhepAnswer.location`;
        :class:`SessionNotFound` if it already left or its session ended)."""
        await self._json_at("DELETE", self._resolve(location))

    # -- a session --------------------------------------------------------------------

    async def say(self, session_id: str, text: str, voice: str | None = None) -> Queued:
        """Speak ``text`` through the server's text-to-speech engine."""
        body: dict[str, str] = {"text": text}
        if voice is not None:
            body["voice"] = voice
        return Queued.from_json(await self._json("POST", _session(session_id, "/say"), json=body))

    async def push_audio(self, session_id: str, data: bytes, content_type: str) -> Queued:
        """Speak a whole audio body: a file (``audio/wav``, ``audio/mpeg``, …) or raw PCM
        (``audio/L16; rate=16000``: big-endian, RFC 2586)."""
        answer = await self._json(
            "POST",
            _session(session_id, "/audio"),
            data=data,
            headers={"Content-Type": content_type},
        )
        return Queued.from_json(answer)

    async def push_pcm(self, session_id: str, samples: np.ndarray, rate: int) -> Queued:
        """Speak mono samples at ``rate`` Hz: float32 in [-1, 1] (sent as ``f32le``) or
        int16 (sent as ``s16le``)."""
        fmt = pcm_format_for(samples)
        answer = await self._json(
            "POST",
            _session(session_id, "/audio"),
            data=to_pcm_bytes(samples, fmt),
            headers={"Content-Type": "application/octet-stream"},
            params={"format": fmt, "rate": str(rate), "channels": "1"},
        )
        return Queued.from_json(answer)

    async def interrupt(self, session_id: str) -> float:
        """Drop the session's queued audio; returns the milliseconds dropped."""
        answer = await self._json("POST", _session(session_id, "/interrupt"))
        return float(answer["dropped_ms"])

    async def switch_avatar(self, session_id: str, avatar: str) -> AvatarSwitched:
        """Show ``avatar`` in the running call; the audio goes on untouched.

        Returns once the new avatar's model is loaded and the switch scheduled (a cold
        load takes a while; the call shows the old avatar meanwhile); ``avatar_changed``
        follows when its first frame is sent. Refusals: :class:`NotFound`
        (``model_not_found``), :class:`Conflict` (``avatar_incompatible``: another fps
        or audio features; ``avatar_switch_busy``: another switch is loading),
        :class:`Overloaded` (``no_capacity``, ``shutting_down``, …) and
        :class:`ServerError` (``model_load_failed``); the call goes on with the old
        avatar after any of them.
        """
        answer = await self._json("POST", _session(session_id, "/avatar"), json={"avatar": avatar})
        return AvatarSwitched.from_json(answer)

    async def set_idle_clip(self, session_id: str, clip: str) -> IdleClipSet:
        """Play the avatar's idle clip ``clip`` while it is silent (``idle``,
        ``listening``, ``thinking``, … as the avatar declares them; :class:`NotFound`
        ``clip_not_found`` names those it has)."""
        answer = await self._json("POST", _session(session_id, "/idle"), json={"clip": clip})
        return IdleClipSet.from_json(answer)

    async def state(self, session_id: str) -> dict[str, Any]:
        """The session's state and counters (``GET /sessions/{id}``)."""
        answer: dict[str, Any] = await self._json("GET", _session(session_id))
        return answer

    async def hang_up(self, session_id: str) -> None:
        """End the session (:class:`SessionNotFound` if it already ended)."""
        await self._json("DELETE", _session(session_id))

    def events(self, session_id: str) -> EventStream:
        """The session's events over server-sent events, from now on: ``async for event
        in client.events(id)`` (see :class:`EventStream`)."""

        async def open_response() -> ClientResponse:
            response = await self._http().get(
                self._url(_session(session_id, "/events")),
                headers={**self._headers, "Accept": "text/event-stream"},
                timeout=EVENTS_TIMEOUT,
            )
            await _raise_for_error(response)
            return response

        return EventStream(open_response)

    def stream_audio(
        self,
        session_id: str,
        *,
        format: PcmFormat = "s16le",
        rate: int = 16000,
        max_ahead_ms: float = 2000.0,
        event_queue_size: int = 256,
    ) -> AudioStream:
        """An audio stream into the session (``async with``); see :class:`AudioStream`.

        ``max_ahead_ms`` bounds how far ahead of play-out :meth:`AudioStream.send` runs.
        """
        if format not in ("s16le", "f32le"):
            raise ValueError(f"format must be 's16le' or 'f32le', got {format!r}")
        if rate not in STREAM_RATES:
            raise ValueError(f"rate must be one of {STREAM_RATES}, got {rate}")
        params = {"format": format, "rate": str(rate), "channels": "1"}

        async def connect() -> ClientWebSocketResponse:
            url = self._url(_session(session_id, "/audio/stream"))
            try:
                return await self._http().ws_connect(url, params=params, headers=self._headers)
            except WSServerHandshakeError as exc:
                code = _HANDSHAKE_CODES.get(exc.status, f"http_{exc.status}")
                retry = exc.headers.get("Retry-After") if exc.headers else None
                raise error_for(
                    code,
                    f"the server refused the audio stream with HTTP {exc.status}",
                    status=exc.status,
                    retry_after=float(retry) if retry and retry.isdigit() else None,
                ) from exc

        return AudioStream(
            connect,
            format=format,
            rate=rate,
            max_ahead_ms=max_ahead_ms,
            event_queue_size=event_queue_size,
        )

    # -- plumbing ---------------------------------------------------------------------

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return await self._json_at(method, self._url(path), **kwargs)

    async def _json_at(self, method: str, url: str, **kwargs: Any) -> Any:
        headers = {**self._headers, **kwargs.pop("headers", {})}
        async with self._http().request(method, url, headers=headers, **kwargs) as response:
            await _raise_for_error(response)
            logger.debug("%s %s -> %d", method, url, response.status)
            return await response.json()

    def _http(self) -> ClientSession:
        if self._closed:
            raise RuntimeError("this lipstream Client is closed")
        if self._session is None:
            self._session = ClientSession()
        return self._session

    def _url(self, path: str) -> str:
        return self.base_url + path

    def _resolve(self, location: str) -> str:
        """A ``Location`` the server sent, as an absolute URL. Its paths are the API's, so
        a root-relative one is taken under ``base_url`` as every path here is (a reverse
        proxy's path prefix kept, as ``lipstream.js`` does)."""
        return urljoin(self.base_url + "/", location.lstrip("/"))


def ice_servers_from_links(values: Iterable[str]) -> tuple[IceServer, ...]:
    """The ICE servers in ``Link`` header values (RFC 9725 §4.6: ``<url>;
    rel="ice-server"``, with ``username`` and ``credential`` for a TURN server); links of
    any other relation are left out."""
    servers: list[IceServer] = []
    for value in values:
        for link in _LINK.finditer(value):
            params = {
                name.lower(): _unquoted(raw) for name, raw in _LINK_PARAM.findall(link.group(2))
            }
            if "ice-server" not in params.get("rel", "").split():
                continue
            servers.append(
                IceServer(
                    urls=(link.group(1).strip(),),
                    username=params.get("username"),
                    credential=params.get("credential"),
                )
            )
    return tuple(servers)


def _unquoted(raw: str) -> str:
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return re.sub(r"\\(.)", r"\1", raw[1:-1])
    return raw


def _session(session_id: str, tail: str = "") -> str:
    return f"/sessions/{quote(session_id, safe='')}{tail}"


async def _raise_for_error(response: ClientResponse) -> None:
    if response.status < 400:
        return
    body = await response.read()
    response.release()
    error: LipstreamError = error_from_body(response.status, body, response.headers)
    raise error
