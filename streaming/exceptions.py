"""Errors raised by the streaming layer.

Hierarchy::

    StreamingError              root: a call cannot be set up or controlled
    ├── OfferError              the SDP offer is malformed or cannot be answered (400)
    ├── SessionNotFoundError    no live session with that id (404)
    │   └── PartNotFoundError   the session has no viewer or output with that id (404)
    ├── SessionLimitError       the server is at its session limit (503 + Retry-After)
    │   └── ViewerLimitError    the session has as many viewers as allowed (503)
    ├── OutputError             an output's target is not one the server may push to (400)
    ├── OutputLimitError        the session has as many outputs as allowed (409)
    ├── StreamBusyError         the session already has an audio stream open (409)
    ├── AvatarSwitchBusyError   the call is switching avatar already (409)
    ├── AvatarIncompatibleError the call cannot show that avatar: fps, audio features (409)
    └── LiveKitError            an avatar cannot join its LiveKit room
        ├── LiveKitNotInstalledError  the ``livekit`` extra is not installed (501)
        ├── LiveKitUrlError           the URL is malformed or not one to join (400)
        ├── LiveKitTokenError         the token is malformed, expired, lacks a grant or
        │                             was refused by the LiveKit server (400)
        └── LiveKitJoinError          the LiveKit server could not be reached in time (502)

An unknown idle clip is :class:`compositor.clips.ClipNotFoundError` (404).
"""

from __future__ import annotations


class StreamingError(Exception):
    """Root of all streaming errors."""


class OfferError(StreamingError):
    """An SDP offer that cannot be parsed or answered."""


class SessionNotFoundError(StreamingError):
    """No live session has that id."""


class PartNotFoundError(SessionNotFoundError):
    """The session is live, but has no viewer or output with that id."""


class SessionLimitError(StreamingError):
    """The server runs as many sessions as it is configured for."""


class ViewerLimitError(SessionLimitError):
    """A session has as many viewers as ``broadcast.viewers_per_session`` allows."""


class OutputError(StreamingError):
    """An output's target is malformed, or one the server may not push to."""


class OutputLimitError(StreamingError):
    """A session has as many outputs as ``outputs.max_per_session`` allows."""


class StreamBusyError(StreamingError):
    """A session takes one audio stream at a time."""


class AvatarSwitchBusyError(StreamingError):
    """A call switches avatar once at a time."""


class AvatarIncompatibleError(StreamingError):
    """A call keeps its fps and audio features; this avatar has others."""


class LiveKitError(StreamingError):
    """An avatar could not join its LiveKit room (``docs/design/livekit.md``)."""


class LiveKitNotInstalledError(LiveKitError):
    """The ``livekit`` and ``livekit-api`` packages are not installed."""


class LiveKitUrlError(LiveKitError):
    """A LiveKit URL that is malformed, or one the server may not connect to."""


class LiveKitTokenError(LiveKitError):
    """A LiveKit token that is malformed, expired, lacks a grant, or was refused."""


class LiveKitJoinError(LiveKitError):
    """The LiveKit server could not be reached, or did not answer in time."""
