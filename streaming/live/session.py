"""One live session: the thin owner of its peer, its pipeline, its app audio, its events
and its viewers.

    Peer (streaming.webrtc)            the caller's peer connection: answer, tracks, state
      │ caller's audio ▲ frames and packets at their slots       (or, with no caller, a
    LivePipeline (streaming.live.pipeline)                         Station pulling them)
        mixer ─▶ timeline ─▶ renderer ─▶ send buffers ─▶ feed ─▶ Audience (viewers)
      ▲ pushed, spoken, streamed audio
    AppAudio, SessionEvents            what apps bring, and what they are told

``delay`` = the model's lookahead + one 20 ms tick + ``pipeline_margin_ms``: by then a
frame's audio is complete and it has been computed, or it is shown idle (never late;
``docs/design/audio-in.md`` §2, ``docs/design/delay.md`` §8).

:meth:`Session.open` builds the parts in that order (``session_parts.py``), each with
what it needs, and answers the offer; ``broadcast_sessions.py`` builds the same parts
with a :class:`~streaming.broadcast.station.Station` where the caller's peer would be,
for a session no caller owns or one a WHIP publisher speaks into (§21). Every task of
the session runs under one :class:`StageTasks`, whose rule is the session's: a task that
ends other than by cancellation (a watchdog's reason, any stage's error) ends it, and
the session's lifetime task then tears it down within a bound (§7). Viewers and outputs
are the session's audience and outputs: one ending ends nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import replace
from typing import Any, Protocol

from inference_core.serving.handle import ModelHandle
from streaming.broadcast.station import Station
from streaming.exceptions import AvatarSwitchBusyError, SessionNotFoundError
from streaming.link import LinkController
from streaming.live.avatar import AvatarSwitched, CallAvatar, preload, release_after
from streaming.live.caller_messages import CallerMessages
from streaming.live.pipeline import CallResources
from streaming.live.reporting import DelayBudget, SessionStats
from streaming.live.session_parts import SessionParts, build_parts
from streaming.live.snapshot import SessionSnapshot
from streaming.live.speech import Played
from streaming.live.watchdogs import (
    PEER_CHECK_S,
    PEER_SILENCE_S,
    ice_failure,
    peer_gone,
    went_idle,
)
from streaming.live.workers import Offload
from streaming.webrtc.data_channel import EventChannel
from streaming.webrtc.ice import ice_configuration
from streaming.webrtc.offer_check import OfferInfo
from streaming.webrtc.peer import Peer, PeerState, SentMedia

__all__ = ["PEER_CHECK_S", "PEER_SILENCE_S", "AvatarSwitched", "CallResources", "Session"]

#: Seconds a closing session gives its data channels to send ``session_ended``.
FLUSH_EVENTS_S = 1.0

logger = logging.getLogger(__name__)


class SessionPeer(Protocol):
    """What a session reads of whoever pulls its media: the caller's
    :class:`~streaming.webrtc.peer.Peer`, or a callerless session's
    :class:`~streaming.broadcast.station.Station`."""

    @property
    def link(self) -> LinkController | None: ...

    @property
    def answer_sdp(self) -> str: ...

    @property
    def video_codec(self) -> str | None: ...

    @property
    def state(self) -> PeerState: ...

    @property
    def target_bitrate_bps(self) -> int | None: ...

    def sent(self) -> SentMedia: ...

    async def flush_events(self, timeout_s: float) -> None: ...

    async def close(self) -> None: ...


class Session:
    """One call, or a session no caller owns (module doc); made by :meth:`open` or
    ``broadcast_sessions.py``. ``on_closed(session)`` once it ended."""

    def __init__(
        self,
        parts: SessionParts,
        peer: SessionPeer,
        *,
        on_closed: Callable[[Session], None] | None = None,
    ) -> None:
        self.session_id = parts.session_id
        self.pipeline = parts.pipeline
        self.peer = peer
        self.app_audio = parts.app_audio
        self.events = parts.events
        self.report = parts.report
        self.audience = parts.audience
        self.outputs = parts.outputs
        self._tasks = parts.tasks
        self._on_closed = on_closed
        self._switching = False  # a switch of avatar is loading or dissolving
        self._lifetime = asyncio.create_task(self._live(), name=f"session-{self.session_id[:8]}")

    @classmethod
    async def open(
        cls,
        session_id: str,
        sdp: str,
        offer: OfferInfo,
        avatar: CallAvatar,
        shared: CallResources,
        *,
        remote: str | None = None,
        on_closed: Callable[[Session], None] | None = None,
    ) -> Session:
        """Build the call's parts, answer the offer and start the call's tasks; raises
        ``OfferError`` for an offer aiortc cannot take (what started is stopped; the model
        is the caller's to release)."""
        settings = shared.settings.session
        parts = build_parts(session_id, avatar, shared, remote)
        tasks, pipeline = parts.tasks, parts.pipeline
        messages = CallerMessages(shared.control)
        try:
            peer = await Peer.answer(
                session_id,
                sdp,
                offer,
                config=ice_configuration(shared.settings),
                encoders=shared.encoders,
                media=pipeline.media(),
                events=EventChannel(parts.events.listen, messages.answer),
                tasks=tasks,
            )
        except BaseException:
            tasks.end("offer failed")
            await tasks.stop(pipeline.in_flight)
            raise
        parts.start(avatar, shared)
        tasks.spawn("watchdog", ice_failure(peer, settings.ice_timeout_s, session_id))
        tasks.spawn("watchdog", peer_gone(peer, session_id))
        if settings.idle_timeout_s > 0:
            tasks.spawn("watchdog", went_idle(parts.activity, settings.idle_timeout_s, session_id))
        session = cls(parts, peer, on_closed=on_closed)
        messages.bind(session)
        return session

    # -- what a call is now ---------------------------------------------------------

    @property
    def model(self) -> ModelHandle:
        """The held model of the avatar the call shows (the incoming one during a switch)."""
        return self.pipeline.avatar.model

    @property
    def avatar_id(self) -> str:
        return self.pipeline.avatar.avatar_id

    @property
    def switching(self) -> bool:
        """Whether a switch of avatar is loading or dissolving (one at a time)."""
        return self._switching

    @property
    def answer_sdp(self) -> str:
        """The SDP answer to the caller's offer."""
        return self.peer.answer_sdp

    @property
    def kind(self) -> str:
        """``call``, ``callerless``, ``whip`` or ``livekit`` (the snapshot's ``kind``)."""
        return self.peer.kind if isinstance(self.peer, Station) else "call"

    @property
    def has_caller(self) -> bool:
        """Whether a caller (or a WHIP publisher) sends the session's audio."""
        return not isinstance(self.peer, Station) or self.peer.has_caller

    @property
    def state(self) -> str:
        """``new``, ``connected``, ``streaming`` (media flows) or ``closed``."""
        if self._tasks.reason is not None:
            return "closed"
        if self.pipeline.clock.start is not None:
            return "streaming"
        return "connected" if self.peer.state == PeerState.CONNECTED else "new"

    @property
    def end_reason(self) -> str | None:
        """Why the call ended, once it has."""
        return self._tasks.reason

    @property
    def closed(self) -> bool:
        return self._tasks.reason is not None

    @property
    def delay_budget(self) -> DelayBudget:
        return self.pipeline.budget

    @property
    def delay_s(self) -> float:
        """The configured delay: media for audio time t is sent at start + this + t."""
        return self.pipeline.clock.delay_s

    @property
    def lookahead_ms(self) -> float:
        return self.pipeline.budget.lookahead_ms

    @property
    def stats(self) -> SessionStats:
        """The counters the render path bumps (:class:`~streaming.live.reporting.SessionStats`)."""
        return self.report.stats

    @property
    def frames_sent(self) -> int:
        return self.peer.sent().frames_sent

    @property
    def queued_audio_s(self) -> float:
        return self.pipeline.mixer.pushed_seconds

    def snapshot(self) -> SessionSnapshot:
        """This call's state and counters (``GET /sessions/{id}``, the admin API)."""
        sent = self.peer.sent()
        started_at = self.pipeline.clock.start
        mixer = self.pipeline.mixer
        snapshot = self.report.snapshot(
            state=self.state,
            frames_sent=sent.frames_sent,
            frames_skipped=sent.frames_skipped,
            started_at=started_at,
            video_next_index=sent.video_next,
            audio_next_index=sent.audio_next if started_at is not None else None,
            queued_audio_s=mixer.pushed_seconds,
            buffered=self.pipeline.waiting(),
            inbound_skipped_ms=mixer.inbound_skipped_ms,
            inbound_concealed_ms=mixer.inbound_concealed_ms,
            bitrate_bps=self.peer.target_bitrate_bps,
            app_audio=self.app_audio.state(),
            idle_clip=self.pipeline.idle_clip,
            clips=self.pipeline.clips,
            audio_skipped=sent.audio_skipped,
            link=None if self.peer.link is None else self.peer.link.snapshot(),
        )
        return replace(
            snapshot,
            caller=self.has_caller,
            kind=self.kind,
            viewers=self.audience.count,
            outputs=self.outputs.count,
        )

    # -- control --------------------------------------------------------------------

    def interrupt(self) -> tuple[float, list[Played]]:
        """Drop queued audio and frames: the avatar is idle from the next frame on.

        Returns the seconds of queued audio dropped and how much of each utterance it cut
        short the caller was sent (``played_ms``).
        """
        return self.pipeline.interrupt()

    @property
    def clips(self) -> list[str]:
        """The idle clips of the call's avatar."""
        return self.pipeline.clips

    def set_idle_clip(self, clip: str) -> str:
        """Play ``clip`` while the avatar is silent, from a seam (``docs/design/compositing.md``
        §5); returns the clip it replaces. ``ClipNotFoundError`` names the clips there are.
        ``idle_clip_changed`` tells every listener, with the media time from which the
        next silent frame plays it."""
        previous = self.pipeline.set_idle_clip(clip)
        if previous != clip:
            media_ms = self.pipeline.timeline.next_frame * 1000 / self.pipeline.fps
            self.events.publish(
                "idle_clip_changed", clip=clip, previous=previous, media_ms=round(media_ms, 1)
            )
        return previous

    def run_control(self, action: Coroutine[Any, Any, None]) -> None:
        """Run a client's change request (a switch, a clip) as a task of the call: it
        never holds up the reader it came from, and ends with the call."""
        self._tasks.spawn("switch", action)

    @contextlib.contextmanager
    def switch_slot(self) -> Iterator[None]:
        """Hold the call's one switch slot while the next avatar loads (the manager's);
        a second switch meanwhile is refused (``AvatarSwitchBusyError``)."""
        if self._switching or self.pipeline.dissolving:
            raise AvatarSwitchBusyError(
                f"session {self.session_id[:16]} is switching avatar already; "
                "switch again once avatar_changed was sent"
            )
        self._switching = True
        try:
            yield
        finally:
            self._switching = False

    async def switch_avatar(self, avatar: CallAvatar, executor: Offload) -> AvatarSwitched:
        """Show ``avatar`` from the next frame decided, dissolving from the current one
        (``docs/design/switching.md`` §18); returns once the switch is scheduled. The outgoing
        model is released once the dissolve was sent and its frames in flight ended;
        ``avatar_changed`` goes to every listener when the first new frame is sent. The
        caller keeps ``avatar``'s model if this raises."""
        if self.closed:
            raise SessionNotFoundError(f"session {self.session_id[:16]} has ended")
        previous = self.pipeline.avatar
        fps = self.pipeline.fps

        def shown(first: int) -> None:
            self.events.publish(
                "avatar_changed",
                avatar=avatar.avatar_id,
                previous=previous.avatar_id,
                frame=first,
                media_ms=round(first * 1000 / fps, 1),
                frame_size=list(avatar.frame_size),
            )

        def retired(outgoing: CallAvatar, first: int) -> None:
            waiting = self.pipeline.renderer.in_flight_before(first)
            self._tasks.spawn("switch", release_after(outgoing, waiting))

        first = await self.pipeline.switch_avatar(avatar, on_shown=shown, on_retired=retired)
        self.report.show(avatar.avatar_id)
        self._tasks.spawn("preload", preload(avatar, executor))
        if avatar.sharing is not None:
            avatar.sharing.prepare()
        logger.info(
            "session switches avatar: session=%s from=%s to=%s frame=%d",
            self.session_id,
            previous.avatar_id,
            avatar.avatar_id,
            first,
        )
        return AvatarSwitched(previous.avatar_id, avatar.avatar_id, first, first * 1000 / fps)

    async def close(self, reason: str) -> None:
        """End the call for ``reason`` and wait until it is torn down (bounded); safe to
        call more than once, from anywhere but the call's own tasks."""
        self._tasks.end(reason)
        await asyncio.shield(self._lifetime)

    async def _live(self) -> None:
        """The call's lifetime: wait for its end, then stop everything it owns, each step
        within a bound (``docs/design/threads.md`` §7). The manager hears of the end
        whatever happens on the way."""
        reason = await self._tasks.ended()
        try:
            await self._tear_down(reason)
        except Exception:  # a bug in the teardown must not keep the call listed
            logger.exception("tearing down the session failed: session=%s", self.session_id)
        finally:
            if self._on_closed is not None:
                self._on_closed(self)

    async def _tear_down(self, reason: str) -> None:
        self.events.end(reason)
        await self.peer.flush_events(FLUSH_EVENTS_S)  # session_ended before the close
        await self.audience.close()
        await self.outputs.close()
        abandoned = await self._tasks.stop(self.pipeline.in_flight)
        self.pipeline.feed.close()
        await self.peer.close()  # its video encoder's codec freed with its track
        # The codecs now, not at Python's next full collection (a job of the timeline
        # still on a worker thread fails, unread).
        self.pipeline.timeline.close()
        outgoing = self.pipeline.renderer.retire()  # a switch still dissolving
        if outgoing is not None:
            outgoing.model.close()
        self.model.close()
        sent = self.peer.sent()
        self.report.log_end(
            reason,
            frames_sent=sent.frames_sent,
            frames_skipped=sent.frames_skipped,
            inbound_skipped_ms=self.pipeline.mixer.inbound_skipped_ms,
            abandoned=abandoned,
        )
