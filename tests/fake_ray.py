"""A Ray runtime on numbers, for a :class:`~web.cluster.front.ClusterFront` without Ray: it
dies, goes silent and comes back when a test says so, and its worker actors answer
reports while it lives (``web/cluster/runtime.py`` is the real one)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from config.settings import Settings
from web.cluster.placement import WorkerReport
from web.cluster.runtime import ProbeTimeoutError, RuntimeMode


class _Method:
    def __init__(self, call: Callable[..., Coroutine[Any, Any, Any]]) -> None:
        self._call = call

    def remote(self, *args: Any) -> Coroutine[Any, Any, Any]:
        return self._call(*args)


class FakeWorker:
    """A worker actor of one incarnation: it answers while its runtime lives."""

    def __init__(self, runtime: FakeRuntime, name: str) -> None:
        self.incarnation = runtime.incarnation
        self.report = _Method(lambda: runtime.report(self, name))
        self.drain = _Method(runtime.drain)
        self.stop = _Method(runtime.stop)


@dataclass
class FakeRuntime:
    """A Ray runtime on numbers: it dies, times out and comes back when told."""

    mode: RuntimeMode
    where: str = "the fake runtime"
    dead: str | None = None
    gcs_gone: bool = False
    probe_error: Exception | None = None
    failing_reconnects: int = 0
    reconnects: int = 0
    incarnation: int = 0
    killed: int = 0
    closed: bool = False
    # Set: a reconnect waits for it, so a test sees the front while it restarts.
    hold: asyncio.Event | None = None
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def connect_now(self) -> None:
        pass

    async def connect(self) -> None:
        pass

    async def reconnect(self, timeout_s: float) -> None:
        self.reconnects += 1
        if self.hold is not None:
            await self.hold.wait()
        if self.failing_reconnects:
            self.failing_reconnects -= 1
            raise ConnectionError("nothing listens there yet")
        self.dead = self.probe_error = None
        self.incarnation += 1

    async def probe(self, timeout_s: float) -> str | None:
        if self.gcs_gone:
            raise ProbeTimeoutError(f"the Ray GCS did not answer within {timeout_s:.0f} s")
        if self.probe_error is not None:
            raise self.probe_error
        return self.dead

    async def worker(self, name: str, settings: Settings, timeout_s: float) -> tuple[Any, bool]:
        return FakeWorker(self, name), True

    async def kill(self, actor: Any, timeout_s: float) -> None:
        self.killed += 1

    async def close(self, timeout_s: float) -> None:
        self.closed = True

    async def report(self, worker: FakeWorker, name: str) -> WorkerReport:
        if self.dead is not None or worker.incarnation != self.incarnation:
            raise ConnectionError("the actor died with its node")
        return WorkerReport(
            name=name,
            incarnation=f"i{self.incarnation}",
            url=f"http://127.0.0.1:1/{name}",
            node="127.0.0.1",
            node_id="n",
            pid=next(self.ids),
            models=frozenset(),
            live_sessions=1,
            room_places=3,
            room_share=0.5,
        )

    async def drain(self, timeout_s: float) -> int:
        return 0

    async def stop(self) -> None:
        pass
