"""A session's outputs: the streams it pushes out (RTMP, WHIP; ``docs/design/broadcast.md`` §21).

Each output runs as a task of its own, owned here, on the session's clock; like a
viewer, it is sent what the session sends (its feed's frames, its audio packets) and
never encodes video. An output that fails keeps trying (its status says so); removing
it, or the session's end, stops it, waiting a bounded time for its thread to close the
stream. At most ``outputs.max_per_session`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import replace
from typing import Protocol

from config.settings import Settings
from streaming.broadcast.rtmp import OutputStatus, RtmpOutput, shown_target
from streaming.broadcast.targets import WHIP, check_target
from streaming.exceptions import OutputLimitError, PartNotFoundError, SessionNotFoundError
from streaming.live.audience import viewer_media
from streaming.live.pipeline import LivePipeline
from streaming.live.whip_output import WhipOutput
from streaming.webrtc.video_encoder import EncoderFactory

logger = logging.getLogger(__name__)

#: Seconds an output's thread may take to close its stream once stopped.
STOP_S = 5.0


class Output(Protocol):
    """One output: its status, its task (:meth:`run`), and what ends it after."""

    status: OutputStatus

    async def run(self) -> None: ...

    def refresh(self) -> None: ...

    async def finish(self) -> bool | None: ...


class Outputs:
    """The outputs of session ``session_id`` (module doc)."""

    def __init__(
        self, session_id: str, pipeline: LivePipeline, encoders: EncoderFactory, settings: Settings
    ) -> None:
        self._session_id = session_id
        self._pipeline = pipeline
        self._encoders = encoders
        self._all = settings
        self._settings = settings.outputs
        self._running: dict[str, tuple[Output, asyncio.Task[None]]] = {}
        self._closed = False

    @property
    def count(self) -> int:
        """Outputs running now."""
        return len(self._running)

    def statuses(self) -> list[OutputStatus]:
        """A copy of each output's status, oldest first."""
        for output, _ in self._running.values():
            output.refresh()
        return [replace(output.status) for output, _ in self._running.values()]

    async def add_rtmp(self, url: str) -> OutputStatus:
        """Push the session to ``url`` from its next IDR on; ``OutputError`` for a target
        it may not push to, ``OutputLimitError`` past the limit."""
        url = await check_target(url, allow_private=self._settings.allow_private)
        status = self._status("rtmp", shown_target(url))
        pipeline = self._pipeline
        output = RtmpOutput(
            status,
            url,
            clock=pipeline.clock,
            fps=pipeline.fps,
            feed=pipeline.feed,
            audio=pipeline.buffers.chunk_for_viewer,
            encoder=self._encoders.create(64, 64),
            retry_max_s=self._settings.retry_max_s,
            timeout_s=self._settings.connect_timeout_s,
        )
        return self._start(output)

    async def add_whip(self, url: str, token: str | None) -> OutputStatus:
        """Publish the session to the WHIP endpoint ``url`` (``token``: its bearer
        token); errors as :meth:`add_rtmp`."""
        allow = self._settings.allow_private
        url = await check_target(url, allow_private=allow, schemes=WHIP)
        status = self._status("whip", shown_target(url))
        output = WhipOutput(
            status, url, token, viewer_media(self._pipeline), self._encoders, self._all
        )
        return self._start(output)

    def _status(self, kind: str, target: str) -> OutputStatus:
        if self._closed:
            raise SessionNotFoundError(f"session {self._session_id[:16]} has ended")
        if self.count >= self._settings.max_per_session:
            raise OutputLimitError(
                f"session {self._session_id[:16]} has {self.count} outputs, as many as "
                "outputs.max_per_session allows"
            )
        return OutputStatus(secrets.token_urlsafe(9), kind, target)

    def _start(self, output: Output) -> OutputStatus:
        status = output.status
        task = asyncio.create_task(output.run(), name=f"output-{status.output_id[:6]}")
        task.add_done_callback(lambda done: _log_failure(done, status))
        self._running[status.output_id] = (output, task)
        logger.info(
            "output added: session=%s output=%s kind=%s target=%s",
            self._session_id,
            status.output_id,
            status.kind,
            status.target,
        )
        return replace(status)

    async def remove(self, output_id: str) -> OutputStatus:
        """Stop one output; its last status (``SessionNotFoundError`` if it is not one)."""
        running = self._running.pop(output_id, None)
        if running is None:
            raise PartNotFoundError(
                f"session {self._session_id[:16]} has no output {output_id[:64]!r}"
            )
        await _stop(*running)
        return replace(running[0].status)

    async def close(self) -> None:
        """The session ends: every output with it, and no new one."""
        self._closed = True
        running, self._running = list(self._running.values()), {}
        await asyncio.gather(*(_stop(output, task) for output, task in running))


async def _stop(output: Output, task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if await output.finish() is False:
        logger.warning(
            "output %s did not close its stream within %.0f s; abandoned",
            output.status.output_id,
            STOP_S,
        )
    output.status.state = "ended"


def _log_failure(task: asyncio.Task[None], status: OutputStatus) -> None:
    if task.cancelled() or task.exception() is None:
        return
    status.state = "ended"
    status.last_error = repr(task.exception())[:300]
    logger.error("output %s failed: %r", status.output_id, task.exception())
