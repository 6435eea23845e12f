"""The tasks of one call, by stage, and the one rule for how a call ends.

Every task a session owns runs for a named stage (``timeline``, ``render``, ``encode``,
``audio receive``, a watchdog…) and is spawned here. The rule (``docs/design/threads.md``
§7): **any task that ends other than by cancellation ends the call.**

- A task that returns a reason (a watchdog's ``"idle"``, ``"ICE timeout"``) ends the
  call for that reason; one that returns None was done (a preload, a data channel the
  caller closed) and ends nothing.
- A task that raises ends the call as ``"<stage> failed"``, logged once with its
  traceback; so does a failure a stage reports from outside a task (:meth:`fail`: a
  render task's error, a track whose source broke, the caller's audio failing in
  aiortc's receive path).

The first end wins; :meth:`ended` tells the session's lifetime task, which tears the
call down (:class:`~streaming.live.session.Session`). :meth:`stop` cancels what is left
and waits a bounded time, naming what it had to abandon.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Coroutine
from typing import Any

logger = logging.getLogger(__name__)

#: How long stopping a call's tasks may take before the rest are abandoned.
STOP_TIMEOUT_S = 5.0
#: The stages a call's tasks and failures are named by (``<stage> failed`` is a reason a
#: call ends with; ``/metrics`` counts ends by these names, so the set is fixed).
STAGES = (
    "timeline",
    "render",
    "encode",
    "audio send",
    "audio receive",
    "video receive",
    "data channel",
    "watchdog",
    "preload",
    "switch",
    "link",
    "livekit",
)
#: Why else a call ends: asked to (the API, an admin, the server stopping), a watchdog,
#: or the connection (``DTLS failed`` is followed by its cause).
END_REASONS = (
    "hung up",
    "hung up by API",
    "hung up by admin",
    "server shutdown",
    "offer failed",
    "idle",
    "ICE timeout",
    "DTLS handshake timed out",
    "peer silent",
    "connection failed",
    "connection closed",
    "DTLS failed",
    "agent left",
    "agent never joined",
    "room closed",
    "livekit disconnected",
    "livekit unreachable",
)


def end_reason_label(reason: str) -> str:
    """``reason`` as one of a fixed set of names (for a metric's label): itself, ``DTLS
    failed`` without its cause, ``<stage> failed``, or ``other``."""
    if reason.startswith("DTLS failed"):
        return "DTLS failed"
    if reason in END_REASONS or reason in {f"{stage} failed" for stage in STAGES}:
        return reason
    return "other"


class StageTasks:
    """The tasks of the call ``session_id`` (module doc)."""

    def __init__(self, session_id: str) -> None:
        self._session_id = session_id
        self._tasks: dict[asyncio.Task[Any], str] = {}
        self._ended = asyncio.get_running_loop().create_future()
        self._failed: set[str] = set()  # stages whose failure was logged

    @property
    def reason(self) -> str | None:
        """Why the call ended, once it has."""
        return self._ended.result() if self._ended.done() else None

    def spawn(self, stage: str, coro: Coroutine[Any, Any, str | None]) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of ``stage`` (one of :data:`STAGES`); how it ends decides
        whether the call does."""
        if stage not in STAGES:
            coro.close()
            raise ValueError(f"unknown stage {stage!r}; name it in STAGES")
        task = asyncio.create_task(coro, name=f"{stage.replace(' ', '-')}-{self._session_id[:8]}")
        self._tasks[task] = stage
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        stage = self._tasks.pop(task, "?")
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.fail(stage, exc)
            return
        reason = task.result()
        if reason is not None:
            self.end(reason)

    def fail(self, stage: str, exc: BaseException) -> None:
        """``stage`` failed with ``exc``: the call ends as ``"<stage> failed"``."""
        if stage not in self._failed:
            self._failed.add(stage)
            logger.error(
                "session stage %s failed: session=%s error=%r",
                stage,
                self._session_id,
                exc,
                exc_info=exc,
            )
        self.end(f"{stage} failed")

    def end(self, reason: str) -> None:
        """End the call for ``reason`` (the first reason given stands)."""
        if not self._ended.done():
            self._ended.set_result(reason)

    async def ended(self) -> str:
        """Wait until the call ends; why it did."""
        return await asyncio.shield(self._ended)

    async def stop(
        self, also: Collection[asyncio.Future[Any]] = (), timeout_s: float = STOP_TIMEOUT_S
    ) -> list[str]:
        """Cancel every task (but the one calling) and ``also``, and wait for them up to
        ``timeout_s``; returns the names of those still running then (abandoned)."""
        current = asyncio.current_task()
        waiting = [t for t in (*self._tasks, *also) if t is not current and not t.done()]
        for future in waiting:
            future.cancel()
        if not waiting:
            return []
        _, pending = await asyncio.wait(waiting, timeout=timeout_s)
        abandoned = sorted(
            t.get_name() if isinstance(t, asyncio.Task) else repr(t) for t in pending
        )
        if abandoned:
            logger.warning(
                "session tasks still running %.0f s after being cancelled, abandoned: "
                "session=%s tasks=%s",
                timeout_s,
                self._session_id,
                abandoned,
            )
        for future in waiting:  # retrieve their exceptions: none goes unread
            if future.done() and not future.cancelled():
                future.exception()
        return abandoned
