"""Sessions no caller's call owns (``docs/design/broadcast.md`` §21): built of the same parts
as a call (``session_parts.py``), with a :class:`~streaming.broadcast.station.Station`
pulling their media for their viewers and outputs.

- :func:`open_callerless` (``POST /sessions``): its audio is what apps push, say or
  stream;
- :func:`open_published` (``POST /whip/{avatar}``): its audio is a WHIP publisher's, taken
  by a receive-only peer connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from streaming.broadcast.station import Station
from streaming.live.avatar import CallAvatar
from streaming.live.pipeline import CallResources
from streaming.live.session import Session
from streaming.live.session_parts import build_parts
from streaming.live.watchdogs import ice_failure, peer_gone, went_idle
from streaming.webrtc.data_channel import EventChannel
from streaming.webrtc.ice import ice_configuration
from streaming.webrtc.offer_check import OfferInfo
from streaming.webrtc.peer import Peer


def open_callerless(
    session_id: str,
    avatar: CallAvatar,
    shared: CallResources,
    *,
    remote: str | None = None,
    on_closed: Callable[[Session], None] | None = None,
) -> Session:
    """A session no caller owns (``docs/design/broadcast.md`` §21): its audio is what
    apps push, say or stream, its media goes to its viewers, and it runs from now
    until it is closed, or has had neither audio nor a viewer for
    ``session.idle_timeout_s``."""
    parts = build_parts(session_id, avatar, shared, remote)
    station = Station(session_id, parts.pipeline.media(), shared.encoders, parts.tasks)
    parts.start(avatar, shared)
    station.start()
    idle_timeout_s = shared.settings.session.idle_timeout_s
    if idle_timeout_s > 0:
        watchdog = parts.audience.unwatched(idle_timeout_s, also=lambda: parts.outputs.count)
        parts.tasks.spawn("watchdog", watchdog)
    return Session(parts, station, on_closed=on_closed)


async def open_published(
    session_id: str,
    sdp: str,
    offer: OfferInfo,
    avatar: CallAvatar,
    shared: CallResources,
    *,
    remote: str | None = None,
    on_closed: Callable[[Session], None] | None = None,
) -> Session:
    """A session whose audio a WHIP publisher sends (``POST /whip/{avatar}``, §21):
    the publisher's offer answered receive-only, the media pulled by a station for
    the session's viewers and outputs. Ends as a call does (the publisher gone,
    never connected, or silent for ``session.idle_timeout_s``)."""
    settings = shared.settings.session
    parts = build_parts(session_id, avatar, shared, remote)
    tasks, pipeline = parts.tasks, parts.pipeline
    try:
        peer = await Peer.answer(
            session_id,
            sdp,
            offer,
            config=ice_configuration(shared.settings),
            encoders=shared.encoders,
            media=replace(pipeline.media(), send=False),
            events=EventChannel(parts.events.listen, lambda message, reply: None),
            tasks=tasks,
        )
    except BaseException:
        tasks.end("offer failed")
        await tasks.stop(pipeline.in_flight)
        raise
    station = Station(session_id, pipeline.media(), shared.encoders, tasks, receiver=peer)
    parts.start(avatar, shared)
    station.start()
    tasks.spawn("watchdog", ice_failure(peer, settings.ice_timeout_s, session_id))
    tasks.spawn("watchdog", peer_gone(peer, session_id))
    if settings.idle_timeout_s > 0:
        tasks.spawn("watchdog", went_idle(parts.activity, settings.idle_timeout_s, session_id))
    return Session(parts, station, on_closed=on_closed)
