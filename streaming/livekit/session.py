"""A LiveKit agent's avatar as a session (``POST /livekit/sessions``, ``docs/design/livekit.md``).

Built of the same parts as any session (``streaming/live/session_parts.py``), with a
:class:`~streaming.broadcast.station.Station` pulling its media into the room
(:class:`~streaming.livekit.room.AvatarRoom`, its sink) and the agent's speech coming in
as byte streams (:class:`~streaming.livekit.segments.AgentAudio`). It is live once it
joined the room and published its tracks; it ends when the agent leaves, the room
closes, the LiveKit server is gone, or as any session does (``DELETE``, shutdown). It
can be watched and pushed out as any session can.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streaming.broadcast.station import Station
from streaming.live.avatar import CallAvatar
from streaming.live.pipeline import CallResources
from streaming.live.session import Session
from streaming.live.session_parts import build_parts
from streaming.livekit.join import RoomJoin
from streaming.livekit.media import RoomMedia
from streaming.livekit.room import AvatarRoom
from streaming.livekit.segments import AgentAudio


async def open_livekit(
    session_id: str,
    join: RoomJoin,
    avatar: CallAvatar,
    shared: CallResources,
    *,
    remote: str | None = None,
    on_closed: Callable[[Session], None] | None = None,
) -> Session:
    """Join the room as the avatar of the agent ``join`` names, and run the session
    (module doc). ``LiveKitTokenError`` or ``LiveKitJoinError`` if it cannot join; then
    nothing of it is left."""
    settings = shared.settings.livekit
    parts = build_parts(session_id, avatar, shared, remote)
    tasks, pipeline, events = parts.tasks, parts.pipeline, parts.events
    media_in = pipeline.media()
    width, height = media_in.frame_size
    config = shared.encoders.config(width, height, media_in.fps)
    media = RoomMedia(
        settings.video, media_in.frame_size, media_in.fps, config.max_bitrate, media_in.clock
    )

    def on_state(state: str, fields: dict[str, Any]) -> None:
        events.publish("livekit", state=state, **fields)

    room = AvatarRoom(join, media, settings, on_state=on_state)
    agent_audio = AgentAudio(
        room.room, join.claims.agent, parts.app_audio, interrupt=pipeline.interrupt
    )
    try:
        await room.join(before_publish=agent_audio.attach)
    except BaseException:
        tasks.end("offer failed")
        await tasks.stop(pipeline.in_flight)
        raise
    station = Station(
        session_id,
        media_in,
        shared.encoders,
        tasks,
        sink=room,
        encode=settings.video == "encoded",
    )
    media.encoder = station.encoder
    listener = events.listen()
    parts.start(avatar, shared)
    station.start()
    tasks.spawn("watchdog", room.watch())
    tasks.spawn("livekit", agent_audio.read())
    tasks.spawn("livekit", agent_audio.forward(listener))
    tasks.spawn("livekit", agent_audio.tell())
    on_state(
        "joined",
        {
            "room": room.room.name,
            "identity": join.claims.identity,
            "agent": join.claims.agent,
            "join_ms": round((room.joined_s or 0) * 1000, 1),
        },
    )
    return Session(parts, station, on_closed=on_closed)
