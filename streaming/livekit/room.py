"""The avatar's participant in its LiveKit room: joining, publishing, and watching the room.

:meth:`AvatarRoom.join` connects with the token it was given (its identity, name and
attributes are the token's, ``lk.publish_on_behalf`` among them), publishes the
avatar's video and audio tracks and returns once both are published, within
``livekit.connect_timeout_s``: a refused token, a server that cannot be reached or one
that never confirms a publication is an error naming which, and leaves nothing
connected. The LiveKit SDK's messages quote the token they refused; they are redacted.

:meth:`AvatarRoom.watch` is the session's watchdog for the room: it returns why the
session ends: ``agent never joined`` (not in the room within
``livekit.agent_timeout_s``), ``agent left``, ``room closed`` (the room was deleted or
the avatar removed from it), ``livekit disconnected`` (any other disconnection), or
``livekit unreachable`` (the SDK's own reconnection did not succeed within
``livekit.connect_timeout_s``). A reconnection that succeeds ends nothing; both it and
its end are told on the session's events (``livekit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from livekit import rtc
from livekit.rtc.participant import PublishTrackError

from config.settings import LiveKitSettings
from streaming.exceptions import LiveKitJoinError, LiveKitTokenError
from streaming.livekit.join import RoomJoin, redacted
from streaming.livekit.media import RoomMedia

logger = logging.getLogger(__name__)

#: How the LiveKit server says the avatar was put out of its room (``DisconnectReason``).
_ROOM_ENDED = ("ROOM_DELETED", "PARTICIPANT_REMOVED", "ROOM_CLOSED")


class AvatarRoom:
    """The avatar's participant (module doc). Event-loop only."""

    def __init__(
        self,
        join: RoomJoin,
        media: RoomMedia,
        settings: LiveKitSettings,
        *,
        on_state: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self.join_request = join
        self.media = media
        self._settings = settings
        self._on_state = on_state
        self.room = rtc.Room()
        self._changed = asyncio.Event()
        self._reconnecting_since: float | None = None
        self._disconnected: str | None = None
        self.joined_s: float | None = None
        self.reconnects = 0
        room = self.room
        room.on("participant_connected", self._participants_changed)
        room.on("participant_disconnected", self._participants_changed)
        room.on("reconnecting", self._reconnecting)
        room.on("reconnected", self._reconnected)
        room.on("disconnected", self._gone)

    @property
    def agent(self) -> str:
        return self.join_request.claims.agent

    async def join(self, before_publish: Callable[[], None]) -> None:
        """Connect, call ``before_publish`` (the agent waits for the avatar's video, so
        what answers the agent is in place before it), publish both tracks (module
        doc); ``LiveKitTokenError`` or ``LiveKitJoinError`` if it cannot."""
        started = time.perf_counter()
        timeout_s = self._settings.connect_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await self._connect()
                before_publish()
                await self._publish()
        except TimeoutError:
            await self.close()
            raise LiveKitJoinError(
                f"the LiveKit server at {self.join_request.url} did not let the avatar join "
                f"and publish within livekit.connect_timeout_s ({timeout_s:g} s)"
            ) from None
        except BaseException:
            await self.close()
            raise
        self.joined_s = time.perf_counter() - started
        logger.info(
            "livekit room joined: room=%s identity=%s agent=%s join_ms=%.0f",
            self.room.name,
            self.join_request.claims.identity,
            self.agent,
            self.joined_s * 1000,
        )

    async def _connect(self) -> None:
        request = self.join_request
        options = rtc.RoomOptions(auto_subscribe=False)
        try:
            await self.room.connect(request.url, request.token, options)
        except rtc.ConnectError as exc:
            message = redacted(exc.message)
            if "401" in message or "403" in message or "token" in message.lower():
                raise LiveKitTokenError(
                    f"the LiveKit server refused livekit_token: {message}"
                ) from None
            raise LiveKitJoinError(
                f"could not reach the LiveKit server at {request.url}: {message}"
            ) from None
        permissions = self.room.local_participant.permissions
        if not permissions.can_publish or not permissions.can_publish_data:
            raise LiveKitTokenError(
                "livekit_token may not publish media and data in the room (can_publish "
                f"{permissions.can_publish}, can_publish_data {permissions.can_publish_data}); "
                "mint it with can_publish and can_publish_data left true"
            )

    async def _publish(self) -> None:
        participant = self.room.local_participant
        media = self.media
        try:
            await participant.publish_track(media.audio_track, media.audio_options())
            await participant.publish_track(media.video_track, media.video_options())
        except PublishTrackError as exc:
            raise LiveKitJoinError(
                f"the LiveKit server did not take the avatar's tracks: {redacted(exc.message)}"
            ) from None

    # -- the session's media sink ----------------------------------------------------

    @property
    def kind(self) -> str:
        return self.media.kind

    async def video(self, media: Any) -> None:
        await self.media.video(media)

    async def audio(self, packet: Any) -> None:
        await self.media.audio(packet)

    # -- the room's watchdog ----------------------------------------------------------

    async def watch(self) -> str:
        """Return why the session ends (module doc)."""
        settings = self._settings
        joined_by = time.monotonic() + settings.agent_timeout_s
        seen = False
        while True:
            self._changed.clear()
            if self._disconnected is not None:
                return self._disconnected
            present = self.agent in self.room.remote_participants
            now = time.monotonic()
            wait_s: float | None = None
            if present and not seen:
                seen = True
                self._on_state("agent_joined", {"agent": self.agent})
            elif seen and not present and self._reconnecting_since is None:
                logger.info("livekit agent left: agent=%s room=%s", self.agent, self.room.name)
                return "agent left"
            elif not seen:
                if now >= joined_by:
                    return "agent never joined"
                wait_s = joined_by - now
            if self._reconnecting_since is not None:
                left_s = self._reconnecting_since + settings.connect_timeout_s - now
                if left_s <= 0:
                    return "livekit unreachable"
                wait_s = left_s if wait_s is None else min(wait_s, left_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._changed.wait()

    def _participants_changed(self, participant: rtc.RemoteParticipant) -> None:
        self._changed.set()

    def _reconnecting(self) -> None:
        self._reconnecting_since = time.monotonic()
        logger.warning("livekit reconnecting: room=%s", self.room.name)
        self._on_state("reconnecting", {})
        self._changed.set()

    def _reconnected(self) -> None:
        self._reconnecting_since = None
        self.reconnects += 1
        logger.info("livekit reconnected: room=%s", self.room.name)
        self._on_state("reconnected", {})
        self._changed.set()

    def _gone(self, reason: Any) -> None:
        name = rtc.DisconnectReason.Name(reason) if isinstance(reason, int) else str(reason)  # type: ignore[arg-type]
        if self._disconnected is None:
            self._disconnected = "room closed" if name in _ROOM_ENDED else "livekit disconnected"
            logger.info("livekit disconnected: room=%s reason=%s", self.room.name, name)
            self._on_state("disconnected", {"reason": name})
        self._changed.set()

    async def close(self) -> None:
        """Leave the room (if still in it) and release the media sources."""
        with contextlib.suppress(Exception):
            if self.room.isconnected():
                await self.room.disconnect()
        await self.media.close()
