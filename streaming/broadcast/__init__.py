"""One session, many viewers (``docs/design/broadcast.md`` §21).

:mod:`~streaming.broadcast.feed` keeps the H.264 frames a session sent for its viewers
and decides, per viewer, which of them it may be sent (from an IDR on, in the frames'
reference chain); :mod:`~streaming.broadcast.station` is the sender of a session no
caller owns. The viewers themselves, each a peer connection of the session, are the
live session's (:mod:`streaming.live.audience`). This package imports nothing of
``streaming.live``.
"""

from streaming.broadcast.feed import PublishedVideo, SentFrame, VideoFeed, ViewerVideo
from streaming.broadcast.station import Station

__all__ = ["PublishedVideo", "SentFrame", "Station", "VideoFeed", "ViewerVideo"]
