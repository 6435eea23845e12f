"""The server's JSON answers as small typed values, and the frames a call receives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import av

#: A session event or stream message: a JSON object with at least ``type``
#: (docs/apps.md lists them: ``speech_started``, ``speech_ended`` with ``played_ms``
#: and ``interrupted``, ``interrupted`` with ``played``, ``avatar_changed``,
#: ``idle_clip_changed``, ``queued_ms``, ``session_ended``, …).
Event = dict[str, Any]


@dataclass(frozen=True)
class Avatar:
    """An avatar a call may show (``GET /avatars``), and the idle clips it can play
    while silent (:meth:`Call.set_idle_clip`; empty from a server without clips)."""

    id: str
    name: str
    clips: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Avatar:
        return cls(
            id=str(data["id"]),
            name=str(data.get("name", data["id"])),
            clips=tuple(str(c) for c in data.get("clips", ())),
        )


@dataclass(frozen=True)
class AvatarSwitched:
    """``POST /sessions/{id}/avatar``: the switch is scheduled, the new avatar loaded.

    ``frame`` is the session's first output frame showing ``avatar`` and ``media_ms`` its
    place on the media timeline (the ``avatar_changed`` event follows when that frame is
    sent). ``changed`` is false when the call already showed ``avatar``; ``frame`` and
    ``media_ms`` are ``None`` then.
    """

    session_id: str
    avatar: str
    previous: str
    changed: bool
    frame: int | None
    media_ms: float | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AvatarSwitched:
        return cls(
            session_id=str(data["session_id"]),
            avatar=str(data["avatar"]),
            previous=str(data["previous"]),
            changed=bool(data["changed"]),
            frame=int(frame) if (frame := data.get("frame")) is not None else None,
            media_ms=float(ms) if (ms := data.get("media_ms")) is not None else None,
        )


@dataclass(frozen=True)
class IdleClipSet:
    """``POST /sessions/{id}/idle``: the clip now played while the avatar is silent,
    the one before it, and every clip the avatar has."""

    session_id: str
    clip: str
    previous: str | None
    clips: tuple[str, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IdleClipSet:
        previous = data.get("previous")
        return cls(
            session_id=str(data["session_id"]),
            clip=str(data["clip"]),
            previous=str(previous) if previous is not None else None,
            clips=tuple(str(c) for c in data.get("clips", ())),
        )


@dataclass(frozen=True)
class IceServer:
    """A STUN or TURN server for the call's ICE agent."""

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IceServer:
        urls = data["urls"]
        return cls(
            urls=(urls,) if isinstance(urls, str) else tuple(urls),
            username=data.get("username"),
            credential=data.get("credential"),
        )


@dataclass(frozen=True)
class DelayBudget:
    """What the server adds between audio and the frame and sound sent back, in ms."""

    server_ms: float
    lookahead_ms: float
    tick_ms: float
    margin_ms: float
    browser_extra_ms_low: float
    browser_extra_ms_high: float

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DelayBudget:
        return cls(
            server_ms=float(data["server_ms"]),
            lookahead_ms=float(data["lookahead_ms"]),
            tick_ms=float(data["tick_ms"]),
            margin_ms=float(data["margin_ms"]),
            browser_extra_ms_low=float(data["browser_extra_ms_low"]),
            browser_extra_ms_high=float(data["browser_extra_ms_high"]),
        )


@dataclass(frozen=True)
class WebRtcConfig:
    """``GET /webrtc-config``: ICE servers for the client, and the configured delay."""

    ice_servers: tuple[IceServer, ...]
    delay: DelayBudget

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WebRtcConfig:
        # The server writes ``iceServers`` (ready for a browser's RTCPeerConnection).
        servers = data.get("iceServers", data.get("ice_servers", []))
        return cls(
            ice_servers=tuple(IceServer.from_json(s) for s in servers),
            delay=DelayBudget.from_json(data["delay"]),
        )


@dataclass(frozen=True)
class Answer:
    """``POST /offer``: the server's SDP answer, the new session, and its delay."""

    sdp: str
    type: str
    session_id: str
    delay: DelayBudget | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Answer:
        delay = data.get("delay")
        return cls(
            sdp=data["sdp"],
            type=data["type"],
            session_id=str(data["session_id"]),
            delay=DelayBudget.from_json(delay) if delay is not None else None,
        )


@dataclass(frozen=True)
class CreatedSession:
    """``POST /sessions``: a session no caller owns, made to speak with the session API
    (:meth:`Client.say`, …) and watched by viewers (:func:`lipstream_client.watch`);
    :meth:`Client.hang_up` ends it. ``whep`` is the path viewers ``POST`` their offer to."""

    session_id: str
    avatar: str
    whep: str
    delay: DelayBudget

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CreatedSession:
        return cls(
            session_id=str(data["session_id"]),
            avatar=str(data["avatar"]),
            whep=str(data["whep"]),
            delay=DelayBudget.from_json(data["delay"]),
        )


@dataclass(frozen=True)
class LiveKitSession:
    """``POST /livekit/sessions``: the avatar joined the LiveKit room ``room`` as
    ``identity``, publishing for the agent ``agent``, ``join_ms`` after the request came;
    :meth:`Client.hang_up` ends it (it ends by itself once the agent leaves)."""

    session_id: str
    avatar: str
    room: str
    identity: str
    agent: str
    join_ms: float
    whep: str
    delay: DelayBudget

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LiveKitSession:
        return cls(
            session_id=str(data["session_id"]),
            avatar=str(data["avatar"]),
            room=str(data["room"]),
            identity=str(data["identity"]),
            agent=str(data["agent"]),
            join_ms=float(data["join_ms"]),
            whep=str(data["whep"]),
            delay=DelayBudget.from_json(data["delay"]),
        )


@dataclass(frozen=True)
class WhepAnswer:
    """``POST /sessions/{id}/whep``: the server's SDP answer to a viewer's offer, the
    viewer's resource (``location``, an absolute URL: ``DELETE`` it to leave) and id, and
    the ICE servers the server lists for the viewer (its ``Link`` headers, RFC 9725)."""

    sdp: str
    location: str
    viewer_id: str
    ice_servers: tuple[IceServer, ...]


@dataclass(frozen=True)
class Queued:
    """Audio accepted into a session (202): this audio's length and all audio now queued.

    ``utterance`` numbers it within its session, when the server reports it
    (docs/apps.md, Utterances).
    """

    duration_ms: float
    queued_ms: float
    utterance: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Queued:
        utterance = data.get("utterance")
        return cls(
            duration_ms=float(data["duration_ms"]),
            queued_ms=float(data["queued_ms"]),
            utterance=int(utterance) if utterance is not None else None,
        )


@dataclass(frozen=True)
class VideoFrame:
    """A decoded video frame of a call.

    ``index`` is the session's frame number at the avatar's fps and ``media_ms`` its
    place on the session's media timeline, both counted from the first frame received
    (RTP timestamps start at a random offset; the server starts its clock on frame 0):
    an event's ``media_ms`` names the same instant. ``received_at`` is
    ``time.monotonic()`` on arrival.
    """

    index: int
    media_ms: float
    frame: av.VideoFrame
    received_at: float


@dataclass(frozen=True)
class AudioFrame:
    """A decoded audio frame of a call (48 kHz from lipstream), placed as :class:`VideoFrame`."""

    media_ms: float
    frame: av.AudioFrame
    received_at: float


@dataclass(frozen=True)
class CallStats:
    """What a call has received, and what its bounded queues dropped because the app did
    not take it in time (the oldest goes first)."""

    video_frames: int = 0
    audio_frames: int = 0
    events: int = 0
    video_dropped: int = 0
    audio_dropped: int = 0
    events_dropped: int = 0

    @property
    def frames_dropped(self) -> int:
        """Video and audio frames dropped unread."""
        return self.video_dropped + self.audio_dropped


@dataclass(frozen=True)
class QueueSizes:
    """How many items each of a call's receive queues holds before it drops the oldest.

    Frames are decoded (a 720p video frame is 1.4 MB), so the video queue is short.
    """

    video: int = 25
    audio: int = 50
    events: int = 256
