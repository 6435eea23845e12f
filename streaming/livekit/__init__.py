"""lipstream as the avatar of a LiveKit Agents voice agent (``docs/design/livekit.md``).

    join.py      the URL and token checked, the token's claims read
    room.py      the avatar's participant: join, publish, the room's watchdog
    media.py     the session's media into the room's tracks
    segments.py  the agent's ``lk.audio_stream`` segments in, the playback RPCs out
    session.py   the session built of those

Needs ``pip install 'lipstream[livekit]'`` (the ``livekit`` SDK). Only :mod:`join`
(which does not need it) is imported with the package; ``web/livekit.py`` imports
:mod:`session` when a LiveKit session is asked for.
"""

from streaming.livekit.join import RoomJoin, TokenClaims, checked_join, require_sdk

__all__ = ["RoomJoin", "TokenClaims", "checked_join", "require_sdk"]
