"""A LiveKit Agents avatar plugin: a self-hosted lipstream avatar for a LiveKit voice agent.

Install with ``pip install 'lipstream-client[livekit]'``. In the agent's entrypoint,
before ``session.start``::

    from lipstream_client.livekit import AvatarSession

    avatar = AvatarSession("http://lipstream:8080", avatar="demo")
    await avatar.start(session, room=ctx.room)
    await session.start(agent=MyAgent(), room=ctx.room)

:meth:`AvatarSession.start` does what the hosted providers' plugins do:

- mints the avatar's token with the agent's LiveKit API key and secret (arguments, else
  ``LIVEKIT_API_KEY`` / ``LIVEKIT_API_SECRET``): kind ``agent``, ``roomJoin`` for the
  agent's room, the attribute ``lk.publish_on_behalf`` = the agent's identity (so the
  agent's room I/O skips the avatar as a user, and frontends show its tracks as the
  agent's);
- posts it with the LiveKit URL (``livekit_url``, else ``LIVEKIT_URL``) to lipstream's
  ``POST /livekit/sessions``, which answers once the avatar joined and published;
- replaces the tail of the agent's audio output with livekit-agents'
  ``DataStreamAudioOutput`` to the avatar: the agent's speech goes to lipstream as byte
  streams instead of into the room, and lipstream publishes it, lip-synced, with the
  video. ``session.interrupt()`` reaches lipstream as ``lk.clear_buffer``; lipstream
  answers ``lk.playback_finished`` with the position the room was sent.

The base class (livekit-agents' ``AvatarSession``) reports the avatar's join latency as
``AvatarMetrics`` on the agent session's ``metrics_collected``, and its playback
latency (from the first audio forwarded to ``lk.playback_started``).
:meth:`AvatarSession.aclose` (called at the job's shutdown) ends the lipstream session.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any, Literal

from livekit import api, rtc
from livekit.agents import get_job_context
from livekit.agents.voice.avatar import AvatarSession as AgentsAvatarSession
from livekit.agents.voice.avatar import DataStreamAudioOutput

from lipstream_client.errors import LipstreamError
from lipstream_client.http import Client
from lipstream_client.models import LiveKitSession

if TYPE_CHECKING:
    from livekit.agents import AgentSession

#: livekit-agents' attribute for the agent an avatar publishes for.
PUBLISH_ON_BEHALF = "lk.publish_on_behalf"
DEFAULT_IDENTITY = "lipstream-avatar"


class AvatarSession(AgentsAvatarSession[Literal["metrics_collected"]]):
    """A lipstream avatar for one agent session (module doc).

    ``api_url`` is lipstream's HTTP base; ``token`` its session JWT when the server
    wants one (``auth.jwt_secret``). ``avatar_identity`` and ``avatar_name`` are the
    avatar participant's; ``idle_clip`` the clip it plays while listening.
    """

    def __init__(
        self,
        api_url: str,
        *,
        avatar: str = "demo",
        token: str | None = None,
        avatar_identity: str = DEFAULT_IDENTITY,
        avatar_name: str = "lipstream",
        idle_clip: str | None = None,
    ) -> None:
        super().__init__()
        self._client = Client(api_url, token=token)
        self._avatar = avatar
        self._identity = avatar_identity
        self._name = avatar_name
        self._idle_clip = idle_clip
        self.session: LiveKitSession | None = None
        #: The agent's audio output to the avatar, once started: its
        #: ``playback_finished`` events carry the positions lipstream reported.
        self.audio_output: DataStreamAudioOutput | None = None

    @property
    def avatar_identity(self) -> str:
        return self._identity

    @property
    def provider(self) -> str:
        return "lipstream"

    async def start(
        self,
        agent_session: AgentSession[Any],
        room: rtc.Room,
        *,
        livekit_url: str | None = None,
        livekit_api_key: str | None = None,
        livekit_api_secret: str | None = None,
    ) -> None:
        """Have lipstream join ``room`` as this agent's avatar (module doc). Raises
        :class:`~lipstream_client.errors.LipstreamError` for what lipstream refused
        (its message says why: a token it cannot use, a LiveKit server it cannot reach)
        and ``ValueError`` for LiveKit settings that are missing."""
        if self.session is not None:
            raise RuntimeError("AvatarSession.start() runs once; make another AvatarSession")
        url = livekit_url or os.environ.get("LIVEKIT_URL")
        key = livekit_api_key or os.environ.get("LIVEKIT_API_KEY")
        secret = livekit_api_secret or os.environ.get("LIVEKIT_API_SECRET")
        if not url or not key or not secret:
            raise ValueError(
                "the LiveKit URL, API key and secret are needed to mint the avatar's token: "
                "pass livekit_url, livekit_api_key, livekit_api_secret or set LIVEKIT_URL, "
                "LIVEKIT_API_KEY, LIVEKIT_API_SECRET"
            )
        await super().start(agent_session, room)
        job = get_job_context(required=False)
        if job is not None:
            agent_identity = job.local_participant_identity
        elif room.isconnected():
            agent_identity = room.local_participant.identity
        else:
            raise RuntimeError("connect the room (or run in an agent job) before start()")
        token = (
            api.AccessToken(api_key=key, api_secret=secret)
            .with_kind("agent")
            .with_identity(self._identity)
            .with_name(self._name)
            .with_grants(api.VideoGrants(room_join=True, room=room.name))
            .with_attributes({PUBLISH_ON_BEHALF: agent_identity})
            .to_jwt()
        )
        try:
            self.session = await self._client.create_livekit_session(
                url, token, avatar=self._avatar, idle_clip=self._idle_clip
            )
        except BaseException:
            await self._client.close()
            raise
        self.audio_output = DataStreamAudioOutput(
            room,
            destination_identity=self._identity,
            wait_remote_track=rtc.TrackKind.KIND_VIDEO,
            wait_playback_start=True,
        )
        agent_session.output.replace_audio_tail(self.audio_output)

    async def aclose(self) -> None:
        """End the lipstream session (if it is still on) and leave the agent session."""
        session, self.session = self.session, None
        if session is not None:
            # It may have ended already: the agent left, or the room closed.
            with contextlib.suppress(LipstreamError):
                await self._client.hang_up(session.session_id)
        await self._client.close()
        await super().aclose()
