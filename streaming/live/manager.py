"""Creates sessions from SDP offers, finds them by id, and ends them.

The manager owns what sessions share: the background-frame cache, one audio encoder per
avatar, the H.264 encoder factory and the compositing thread pool. It holds every live
session and closes them all on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from compositor.background_cache import AvatarFrames, BackgroundCache
from config.settings import Settings
from inference_core.exceptions import ShuttingDownError
from inference_core.features.encoder import AudioEncoder
from inference_core.serving.core import InferenceCore
from inference_core.serving.handle import ModelHandle
from streaming.exceptions import AvatarIncompatibleError, SessionLimitError, SessionNotFoundError
from streaming.idle_loops import IdleLoopCache
from streaming.live.admission import AdmissionControl, usable_cpus
from streaming.live.avatar import AvatarSwitched, CallAvatar, call_avatar, incompatibility
from streaming.live.broadcast_sessions import open_callerless, open_published
from streaming.live.cpu_meter import CpuMeter
from streaming.live.pipeline import CallResources, Control
from streaming.live.reporting import FrameSending, FrameStages
from streaming.live.session import Session
from streaming.live.snapshot import LinkTotals, SessionsSnapshot, SessionTotals
from streaming.live.workers import MediaWorkers
from streaming.webrtc.offer_check import OfferInfo
from streaming.webrtc.video_encoder import EncoderFactory

logger = logging.getLogger(__name__)

MAX_CACHED_AUDIO_ENCODERS = 64
#: How long the compositing threads may take to finish their queued jobs at shutdown.
WORKERS_STOP_S = 10.0


#: What :meth:`SessionManager.create_opened` calls to open a session: avatar, shared
#: resources, session id, and the callback for when it ends.
SessionOpener = Callable[
    [CallAvatar, CallResources, str, Callable[[Session], None]], Awaitable[Session]
]


@dataclass
class SessionCounters:
    """Totals of the sessions that ended (and offers refused or failed) since start-up."""

    started: int = 0
    ended: int = 0
    rejected: int = 0  # refused at capacity or while shutting down
    failed: int = 0  # offers that could not be answered
    frames_sent: int = 0
    frames_inferred: int = 0
    frames_shared: int = 0
    frames_encoded: int = 0
    frames_dropped: dict[str, int] = field(default_factory=dict)
    ended_by_reason: dict[str, int] = field(default_factory=dict)
    link: LinkTotals = field(default_factory=LinkTotals)


class SessionManager:
    """All live sessions of the server.

    ``on_frame_ready`` and ``on_frame_sent`` are handed to every session created while
    they are set (an observer may set them after construction): see :class:`Session`.
    Session ids start with ``session_id_prefix`` (a cluster worker's identity, so a front
    can route a session's requests by its id alone).
    """

    def __init__(
        self,
        settings: Settings,
        core: InferenceCore,
        *,
        on_frame_ready: Callable[[FrameStages], None] | None = None,
        on_frame_sent: Callable[[FrameSending], None] | None = None,
        session_id_prefix: str = "",
    ) -> None:
        self.settings = settings
        self.session_id_prefix = session_id_prefix
        self.core = core
        self.on_frame_ready = on_frame_ready
        self.on_frame_sent = on_frame_sent
        #: What a control message from a caller's data channel does (the web layer's).
        self.control: Control | None = None
        self.cache = BackgroundCache(settings.cache.background_cache_bytes)
        self.encoders = EncoderFactory(settings.video)
        self.idle_loops = IdleLoopCache(settings.cache.idle_loop_bytes)
        # One thread per usable core: the jobs are short CPU work (features, crop,
        # paste), so more threads only add switches. Python's default (cores + 4)
        # cost ≈10% more CPU per frame with 3 live 720p calls on 2 cores (12.4 and
        # 11.2 vs 13.1 and 13.0 ms per frame, two runs each).
        self.compose_threads = usable_cpus()
        self.executor = MediaWorkers(self.compose_threads)
        self._sessions: dict[str, Session] = {}
        self._empty = asyncio.Event()  # set while no session is live
        self._empty.set()
        # Audio-encoder sessions by avatar, most recently used last; bounded so that
        # hundreds of avatars do not pin hundreds of ONNX sessions (live sessions keep
        # their own reference, so dropping one here never breaks a call).
        self._audio_encoders: OrderedDict[str, AudioEncoder | None] = OrderedDict()
        self._creating = 0
        self._closing = False
        self.counters = SessionCounters()
        self.cpu_meter = CpuMeter(self._frames_sent)
        self._cpu_sampling: asyncio.Task[None] | None = None
        self.admission = AdmissionControl(
            settings, core, measured_cpu_ms=self.cpu_meter.ms_per_frame
        )

    def _frames_sent(self) -> int:
        """Video frames sent since start-up, the live calls' included."""
        return self.counters.frames_sent + sum(s.frames_sent for s in self._sessions.values())

    def snapshot(self) -> SessionsSnapshot:
        """Every live call, the totals since start-up (live calls included) and the cache."""
        live = self.sessions
        c = self.counters
        dropped = dict(c.frames_dropped)
        for session in live:
            for reason, count in session.stats.frames_dropped.items():
                dropped[reason] = dropped.get(reason, 0) + count
        room = self.admission.room(live)
        sessions = tuple(s.snapshot() for s in live)
        totals = SessionTotals(
            live=len(live),
            started=c.started,
            ended=c.ended,
            rejected=c.rejected,
            failed=c.failed,
            frames_sent=self._frames_sent(),
            frames_inferred=c.frames_inferred + sum(s.stats.frames_inferred for s in live),
            frames_dropped=dropped,
            ended_by_reason=dict(c.ended_by_reason),
            frames_shared=c.frames_shared + sum(s.stats.frames_shared for s in live),
            frames_encoded=c.frames_encoded + sum(s.stats.frames_encoded for s in live),
            cpu_ms_per_frame=self.cpu_meter.ms_per_frame(),
            room_places=room.places,
            room_share=room.share,
            speaking=sum(s.app_audio.speech.speaking for s in live),
            audio_streams=sum(s.app_audio.stream_open for s in live),
            viewers=sum(s.audience.count for s in live),
            outputs=sum(s.outputs.count for s in live),
            callerless=sum(not s.has_caller for s in live),
            by_kind=dict(Counter(s.kind for s in live)),
            link=c.link.plus(snapshot.link for snapshot in sessions),
        )
        return SessionsSnapshot(
            sessions=sessions,
            totals=totals,
            cache=self.cache.stats(),
            idle_loops=self.idle_loops.stats(),
        )

    @property
    def live_count(self) -> int:
        """How many sessions are live now."""
        return len(self._sessions)

    @property
    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFoundError(f"no live session {session_id[:64]!r}")
        return session

    async def create(
        self, sdp: str, offer: OfferInfo, avatar_id: str, remote: str | None
    ) -> Session:
        """Answer a checked offer for ``avatar_id``; the session is live once ICE connects.

        Raises ``SessionLimitError`` at capacity, avatar errors for unknown ids,
        ``OfferError`` for offers aiortc cannot take.
        """

        async def open_call(avatar: CallAvatar, shared: CallResources, session_id: str) -> Session:
            return await Session.open(
                session_id, sdp, offer, avatar, shared, remote=remote, on_closed=self._forget
            )

        return await self._admitted(avatar_id, open_call)

    async def create_callerless(self, avatar_id: str, remote: str | None) -> Session:
        """A session on ``avatar_id`` no caller owns (``docs/design/broadcast.md`` §21),
        admitted as a call is; its media flows at once, to its viewers."""

        async def open_one(avatar: CallAvatar, shared: CallResources, session_id: str) -> Session:
            return open_callerless(
                session_id, avatar, shared, remote=remote, on_closed=self._forget
            )

        return await self._admitted(avatar_id, open_one)

    async def create_published(
        self, sdp: str, offer: OfferInfo, avatar_id: str, remote: str | None
    ) -> Session:
        """A session on ``avatar_id`` whose audio a WHIP publisher sends (its checked
        offer answered receive-only), admitted as a call is (§21)."""

        async def open_publisher(
            avatar: CallAvatar, shared: CallResources, session_id: str
        ) -> Session:
            return await open_published(
                session_id, sdp, offer, avatar, shared, remote=remote, on_closed=self._forget
            )

        return await self._admitted(avatar_id, open_publisher)

    async def create_opened(self, avatar_id: str, open_session: SessionOpener) -> Session:
        """A session on ``avatar_id`` that a layer above opens (a LiveKit agent's avatar,
        ``streaming/livekit/session.py``), admitted as a call is: ``open_session`` gets
        the avatar, the shared resources, the session's id and what to call when it ends,
        and returns the live session or raises (nothing of it is left then)."""

        async def open_one(avatar: CallAvatar, shared: CallResources, session_id: str) -> Session:
            return await open_session(avatar, shared, session_id, self._forget)

        return await self._admitted(avatar_id, open_one)

    async def _admitted(
        self,
        avatar_id: str,
        open_session: Callable[[CallAvatar, CallResources, str], Awaitable[Session]],
    ) -> Session:
        """Admit a session on ``avatar_id``, load its model and open it (module doc)."""
        if self._closing:
            self.counters.rejected += 1
            raise SessionLimitError("the server is shutting down")
        try:  # before any load or connection: a full server answers at once
            reservation = self.admission.reserve(avatar_id, self.sessions)
        except SessionLimitError:
            self.counters.rejected += 1
            raise
        self._creating += 1
        try:
            model = await self.core.open(avatar_id)
            try:  # again with the model's real device, fps and frame size
                reservation.confirm(model, self.sessions)
            except SessionLimitError:
                model.close()
                self.counters.rejected += 1
                raise
            try:
                avatar = await self._call_avatar(model)
                session_id = self.session_id_prefix + secrets.token_urlsafe(16)
                session = await open_session(avatar, self._resources(), session_id)
            except BaseException:
                model.close()
                self.counters.failed += 1
                raise
            self.counters.started += 1
            self._register(session)
            return session
        finally:
            self._creating -= 1
            reservation.release()

    def _resources(self) -> CallResources:
        return CallResources(
            self.settings,
            self.executor,
            self.encoders,
            self.on_frame_ready,
            self.on_frame_sent,
            self.idle_loops,
            self.control,
        )

    def _register(self, session: Session) -> None:
        self._sessions[session.session_id] = session
        self._empty.clear()
        if self._cpu_sampling is None or self._cpu_sampling.done():
            self._cpu_sampling = asyncio.create_task(self._sample_cpu(), name="lipstream-cpu-meter")
        logger.info(
            "session created: session=%s avatar=%s remote=%s video_codec=%s caller=%s",
            session.session_id,
            session.avatar_id,
            session.report.remote,
            session.peer.video_codec,
            session.has_caller,
        )

    async def switch_avatar(self, session: Session, avatar_id: str) -> AvatarSwitched | None:
        """Show ``avatar_id`` in ``session`` from its next frame decided, with a dissolve
        (``docs/design/switching.md`` §18); None when it shows that avatar already. The new
        model loads while the call shows the old one; admission counts the call on the new
        model (the old one is released after the dissolve). Whatever fails leaves the call
        as it was: ``ShuttingDownError`` while the server stops, avatar and load errors,
        ``SessionLimitError`` / ``CapacityError`` when the new model does not fit,
        ``AvatarIncompatibleError``, ``AvatarSwitchBusyError``."""
        if self._closing:
            raise ShuttingDownError("the server is shutting down; the call keeps its avatar")
        if session.avatar_id == avatar_id:
            return None
        with session.switch_slot():
            others = [s for s in self.sessions if s is not session]
            reservation = self.admission.reserve(avatar_id, others)
            try:
                model = await self.core.open(avatar_id)
                try:
                    reservation.confirm(model, others)
                    reason = incompatibility(session.pipeline.avatar.package, model.package)
                    if reason is not None:
                        raise AvatarIncompatibleError(reason)
                    avatar = await self._call_avatar(model)
                    return await session.switch_avatar(avatar, self.executor)
                except BaseException:
                    model.close()
                    raise
            finally:
                reservation.release()

    async def _call_avatar(self, model: ModelHandle) -> CallAvatar:
        package = model.package
        return call_avatar(
            model,
            AvatarFrames(package.avatar_id, package.frame_paths, self.cache),
            await self._audio_encoder(package.avatar_id, model),
            settings=self.settings,
            encoders=self.encoders,
            idle_loops=self.idle_loops,
        )

    async def _audio_encoder(self, avatar_id: str, model: ModelHandle) -> AudioEncoder | None:
        cache = self._audio_encoders
        if avatar_id in cache:
            cache.move_to_end(avatar_id)
            return cache[avatar_id]
        path = model.package.encoder_path
        encoder = None
        if model.spec.audio_feature == "ave" and path is not None:
            encoder = await asyncio.to_thread(AudioEncoder.from_path, path)
        cache[avatar_id] = encoder
        while len(cache) > MAX_CACHED_AUDIO_ENCODERS:
            cache.popitem(last=False)
        return encoder

    def _forget(self, session: Session) -> None:
        if self._sessions.pop(session.session_id, None) is None:
            return  # never went live (the offer failed)
        if not self._sessions:
            self._empty.set()
        c = self.counters
        c.ended += 1
        c.frames_sent += session.frames_sent
        c.frames_inferred += session.stats.frames_inferred
        c.frames_shared += session.stats.frames_shared
        c.frames_encoded += session.stats.frames_encoded
        if session.peer.link is not None:
            c.link.add(session.peer.link.snapshot())
        for reason, count in session.stats.frames_dropped.items():
            c.frames_dropped[reason] = c.frames_dropped.get(reason, 0) + count
        reason = session.end_reason or "unknown"
        c.ended_by_reason[reason] = c.ended_by_reason.get(reason, 0) + 1

    async def _sample_cpu(self) -> None:
        """Sample the CPU meter once a second while calls are live, so its window slides
        (a call's set-up leaves it after ~20 s); ends when the last call does."""
        while self._sessions:
            self.cpu_meter.sample()
            with contextlib.suppress(TimeoutError):  # the last call ended: stop at once
                await asyncio.wait_for(self._empty.wait(), timeout=1.0)
        self.cpu_meter.sample()

    async def wait_until_empty(self) -> None:
        """Return once no session is live (at once if none is)."""
        await self._empty.wait()

    async def close(self, session_id: str, reason: str = "hung up") -> None:
        await self.get(session_id).close(reason)

    async def close_all(self) -> None:
        """End every session (shutdown; each closes within its own bounds) and stop the
        compositing threads (within :data:`WORKERS_STOP_S`)."""
        self._closing = True
        await asyncio.gather(*(s.close("server shutdown") for s in self.sessions))
        if self._cpu_sampling is not None:
            self._cpu_sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cpu_sampling
        await self.idle_loops.close()
        await asyncio.to_thread(self.executor.shutdown, wait=True, timeout_s=WORKERS_STOP_S)
