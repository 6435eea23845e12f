"""A session's viewers: WHEP peer connections sent what the session sends.

Any live session, a call or a callerless one, can be watched (``POST
/sessions/{id}/whep``, ``docs/design/broadcast.md`` §21). Each :class:`Viewer` is a
:class:`~streaming.webrtc.peer.Peer` answered with the session's viewer media: its
tracks run on the session's clock from the slot due when it joins, the video from the
session's feed (the frames the session's encoder made, never encoded again), the
audio the session's own packets, left in place. So a viewer has what a caller has on
its way out (its own link: pacing, NACK and RTX, the estimate; Opus DTX if it asks; the
session's events on a data channel) and nothing on the way in.

A viewer is owned here, not by the session's tasks: it ends on ``DELETE``, when its
connection fails or goes silent, when it never connects, or with the session, and its
end ends nothing else. :class:`Audience` holds at most ``broadcast.viewers_per_session``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
from collections.abc import Callable

import numpy as np

from config.settings import Settings
from streaming.broadcast.feed import ViewerVideo
from streaming.broadcast.rungs import Rungs
from streaming.exceptions import (
    OfferError,
    PartNotFoundError,
    SessionNotFoundError,
    ViewerLimitError,
)
from streaming.link.ladder import steps_for
from streaming.live.events import SessionEvents, error_event
from streaming.live.pipeline import LivePipeline, Reply
from streaming.live.tasks import StageTasks
from streaming.live.watchdogs import AudioActivity, ice_failure, peer_gone
from streaming.live.workers import Offload
from streaming.webrtc.data_channel import EventChannel
from streaming.webrtc.ice import ice_configuration
from streaming.webrtc.offer_check import OfferInfo
from streaming.webrtc.peer import Peer, PeerMedia
from streaming.webrtc.video_encoder import EncoderFactory

logger = logging.getLogger(__name__)


class Viewer:
    """One viewer's connection (module doc); ``on_closed(viewer)`` once it ended."""

    def __init__(
        self,
        viewer_id: str,
        peer: Peer,
        video: ViewerVideo,
        tasks: StageTasks,
        on_closed: Callable[[Viewer], None],
    ) -> None:
        self.viewer_id = viewer_id
        self.peer = peer
        self.video = video
        self._tasks = tasks
        self._on_closed = on_closed
        self._lifetime = asyncio.create_task(self._live(), name=f"viewer-{viewer_id[:8]}")

    @property
    def answer_sdp(self) -> str:
        return self.peer.answer_sdp

    @property
    def end_reason(self) -> str | None:
        return self._tasks.reason

    async def close(self, reason: str) -> None:
        """End the viewer for ``reason`` and wait until its connection is closed."""
        self._tasks.end(reason)
        await asyncio.shield(self._lifetime)

    async def _live(self) -> None:
        reason = await self._tasks.ended()
        try:
            await self._tasks.stop()
            await self.peer.close()
        finally:
            logger.info(
                "viewer left: viewer=%s reason=%s frames_relayed=%d",
                self.viewer_id,
                reason,
                self.video.frames_relayed,
            )
            self._on_closed(self)


class Audience:
    """The viewers of the session ``session_id`` (module doc)."""

    def __init__(
        self,
        session_id: str,
        pipeline: LivePipeline,
        events: SessionEvents,
        activity: AudioActivity,
        *,
        settings: Settings,
        encoders: EncoderFactory,
        executor: Offload,
    ) -> None:
        self._session_id = session_id
        self._pipeline = pipeline
        self._events = events
        self._settings = settings
        self._encoders = encoders
        self._executor = executor
        self.limit = settings.broadcast.viewers_per_session
        self.rungs: Rungs | None = None  # the lower steps, once a viewer joins
        self._rungs_task: asyncio.Task[None] | None = None
        self._activity = activity
        self._viewers: dict[str, Viewer] = {}
        self._joining = 0
        self._closed = False
        self.joined = 0  # viewers answered since the session started

    @property
    def count(self) -> int:
        """Viewers now (those being answered included)."""
        return len(self._viewers) + self._joining

    def get(self, viewer_id: str) -> Viewer:
        viewer = self._viewers.get(viewer_id)
        if viewer is None:
            raise PartNotFoundError(
                f"session {self._session_id[:16]} has no viewer {viewer_id[:64]!r}"
            )
        return viewer

    async def add(self, sdp: str, offer: OfferInfo) -> Viewer:
        """Answer a viewer's checked offer; ``OfferError`` for one that cannot watch,
        ``ViewerLimitError`` past the limit, ``SessionNotFoundError`` once the session
        ended."""
        if self._closed:
            raise SessionNotFoundError(f"session {self._session_id[:16]} has ended")
        if self.count >= self.limit:
            raise ViewerLimitError(
                f"session {self._session_id[:16]} has {self.count} viewers, as many as "
                "broadcast.viewers_per_session allows"
            )
        if not offer.offers_h264:
            raise OfferError("a viewer is sent the session's H.264 video; offer H.264")
        if "video" not in offer.kinds:
            raise OfferError("a viewer's offer needs a video section to receive the avatar")
        viewer_id = secrets.token_urlsafe(12)
        tasks = StageTasks(f"{self._session_id[:8]}/{viewer_id}")
        video = ViewerVideo(self._pipeline.feed, self._steps())
        media = self._viewer_media(video)
        self._joining += 1
        try:
            peer = await Peer.answer(
                viewer_id,
                sdp,
                offer,
                config=ice_configuration(self._settings),
                encoders=self._encoders,
                media=media,
                events=EventChannel(self._events.listen, _refuse_control),
                tasks=tasks,
            )
        except BaseException:
            tasks.end("offer failed")
            await tasks.stop()
            raise
        finally:
            self._joining -= 1
        if peer.video_codec is None or peer.video_codec.lower() != "video/h264":
            await peer.close()
            raise OfferError("a viewer is sent the session's H.264 video; offer H.264")
        ice_timeout_s = self._settings.session.ice_timeout_s
        tasks.spawn("watchdog", ice_failure(peer, ice_timeout_s, viewer_id))
        tasks.spawn("watchdog", peer_gone(peer, viewer_id))
        viewer = Viewer(viewer_id, peer, video, tasks, self._left)
        self._viewers[viewer_id] = viewer
        self.joined += 1
        self._activity.heard()
        logger.info(
            "viewer joined: session=%s viewer=%s viewers=%d",
            self._session_id,
            viewer_id,
            len(self._viewers),
        )
        return viewer

    def _steps(self) -> Rungs | None:
        """The session's lower steps for viewers on slower links (``broadcast.rungs``);
        their task starts with the first viewer and ends with the session."""
        if not self._settings.broadcast.rungs:
            return None
        if self.rungs is None:
            media = self._pipeline.media()
            width, height = media.frame_size
            top = self._encoders.config(width, height, media.fps).bitrate
            self.rungs = Rungs(
                self._pipeline.feed,
                steps_for(width, height, media.fps, top),
                self._encoders,
                self._executor,
                fps=media.fps,
            )
            self._rungs_task = asyncio.create_task(
                self.rungs.run(), name=f"rungs-{self._session_id[:8]}"
            )
            self._rungs_task.add_done_callback(_rungs_ended)
        return self.rungs

    def _viewer_media(self, video: ViewerVideo) -> PeerMedia:
        return dataclasses.replace(viewer_media(self._pipeline), video=video)

    def _left(self, viewer: Viewer) -> None:
        self._viewers.pop(viewer.viewer_id, None)
        self._activity.heard()  # a callerless session's idle time counts from the last

    async def remove(self, viewer_id: str, reason: str = "hung up by API") -> None:
        """End one viewer (``SessionNotFoundError`` if it is not one of this session's)."""
        await self.get(viewer_id).close(reason)

    async def close(self) -> None:
        """The session ends: every viewer with it, and no new one."""
        self._closed = True
        viewers = list(self._viewers.values())
        await asyncio.gather(*(v.close("session ended") for v in viewers))
        if self._rungs_task is not None:
            self._rungs_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rungs_task

    async def unwatched(self, timeout_s: float, *, also: Callable[[], int]) -> str:
        """Return ``"idle"`` once the session has had neither audio nor a viewer, nor
        anything ``also()`` counts (its outputs), for ``timeout_s`` (what ends a
        callerless session by itself)."""
        while True:
            await self._activity.idle(timeout_s)
            if not self.count and not also():
                logger.info(
                    "session idle and unwatched for %g s: session=%s", timeout_s, self._session_id
                )
                return "idle"
            self._activity.heard()  # watched: the count starts again


def _rungs_ended(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "the viewers' steps failed; viewers keep the session's own stream: %r",
            task.exception(),
            exc_info=task.exception(),
        )


def _refuse_control(message: object, reply: Reply) -> None:
    """A viewer's data channel carries the session's events; it controls nothing."""
    with contextlib.suppress(Exception):
        reply(error_event("bad_message", "a viewer's data channel takes no messages"))


def _ignored(samples: np.ndarray) -> None:
    """A viewer's own audio, if it sends any, is not heard by the session."""


def viewer_media(pipeline: LivePipeline) -> PeerMedia:
    """What a viewer's (or a WHIP publication's) tracks send: the session's frames from
    its feed, its audio packets left in place, from the slot due when media starts."""
    return dataclasses.replace(
        pipeline.media(),
        video=ViewerVideo(pipeline.feed),
        audio=pipeline.buffers.chunk_for_viewer,
        caller_audio=_ignored,
        audio_loss=None,
        join_late=True,
    )
