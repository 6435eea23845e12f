"""The parts every live session is built of, call or callerless, in the order they need
each other (``docs/design/map.md`` §1, ``docs/design/threads.md`` §7): its tasks, events
and speech events, the activity its idle watchdog reads, the pipeline, the app audio,
its report, its audience and its outputs. :class:`~streaming.live.session.Session` adds
what pulls the media: the caller's peer, or a callerless session's station.
"""

from __future__ import annotations

from dataclasses import dataclass

from streaming.live.app_audio import AppAudio
from streaming.live.audience import Audience
from streaming.live.avatar import CallAvatar, preload
from streaming.live.events import SessionEvents
from streaming.live.outputs import Outputs
from streaming.live.pipeline import CallResources, LivePipeline
from streaming.live.reporting import SessionReport
from streaming.live.speech import SpeechEvents
from streaming.live.tasks import StageTasks
from streaming.live.watchdogs import AudioActivity


@dataclass(frozen=True)
class SessionParts:
    """One session's parts (module doc)."""

    session_id: str
    tasks: StageTasks
    events: SessionEvents
    speech: SpeechEvents
    activity: AudioActivity
    pipeline: LivePipeline
    app_audio: AppAudio
    report: SessionReport
    audience: Audience
    outputs: Outputs

    def start(self, avatar: CallAvatar, shared: CallResources) -> None:
        """Start the session's media loop and the preload of its frames."""
        self.tasks.spawn("timeline", self.pipeline.run())
        self.tasks.spawn("preload", preload(avatar, shared.executor))
        if self.pipeline.sharing is not None:
            self.pipeline.sharing.prepare()  # the avatar's idle loop, built in the background


def build_parts(
    session_id: str, avatar: CallAvatar, shared: CallResources, remote: str | None
) -> SessionParts:
    """The parts of session ``session_id`` on ``avatar`` (nothing started yet)."""
    settings = shared.settings
    tasks = StageTasks(session_id)
    events = SessionEvents(session_id, queue_size=settings.session.event_queue_size)
    speech = SpeechEvents(events, avatar.package.manifest.fps)
    activity = AudioActivity()
    pipeline = LivePipeline(
        session_id, avatar, shared, speech=speech, on_voice=activity.heard, on_failure=tasks.fail
    )
    app_audio = AppAudio(
        pipeline.mixer,
        events,
        speech,
        max_stream_buffer_s=settings.session.max_stream_buffer_s,
        on_audio=activity.heard,
    )
    budget = pipeline.budget
    report = SessionReport(
        session_id,
        avatar.model.package.avatar_id,
        remote,
        delay_s=budget.server_ms / 1000,
        lookahead_ms=budget.lookahead_ms,
        fps=pipeline.fps,
        stats=pipeline.stats,
    )
    audience = Audience(
        session_id,
        pipeline,
        events,
        activity,
        settings=settings,
        encoders=shared.encoders,
        executor=shared.executor,
    )
    outputs = Outputs(session_id, pipeline, shared.encoders, settings)
    return SessionParts(
        session_id, tasks, events, speech, activity, pipeline, app_audio, report, audience, outputs
    )
