"""Where a new session goes, and which worker a session id belongs to.

A front places each session once (``docs/design/cluster.md`` §14): among the workers that
answered their last report in time and are not draining, first those that already hold
the avatar's model (model affinity: the call shares that model's batches and costs no
load), most room first; then the others, most room first. A worker with no room left is
not asked. The worker's own admission control has the last word: a worker that refuses
(503) is skipped and the next one is asked, so a stale report costs one round trip, never
a wrong admission.

A session id is ``<worker>-<incarnation>-<token>``: the worker that made it and which
run of that worker (a restarted worker is a new incarnation and has lost its calls). A
front routes every later request from the id alone, with no shared state, so several
fronts can sit behind any HTTP load balancer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: Separates a session id's worker, incarnation and token. Worker names (``w0``…) and
#: incarnations (hex) never contain it; the token (URL-safe base64) may, and comes last.
SEPARATOR = "-"


@dataclass(frozen=True)
class WorkerReport:
    """What a worker says of itself, about once a second (small, cheap to make)."""

    name: str
    incarnation: str  # new every time the worker process starts
    url: str  # where the front reaches its HTTP API
    node: str  # the node's address
    node_id: str  # Ray's id of the node ("" outside Ray)
    pid: int  # the worker's process
    models: frozenset[str]  # models it holds loaded
    live_sessions: int
    room_places: int  # places left under its server.max_sessions
    room_share: float  # its least-used-up resource's share left, 0..1
    draining: bool = False
    gpus: str | None = None  # CUDA_VISIBLE_DEVICES as Ray set it
    # Its gRPC listener (the raw inference front doors) on ``node``'s address as ``url``
    # names it; None when server.grpc_port is null.
    grpc_port: int | None = None

    def session_prefix(self) -> str:
        """What the ids of this worker's sessions start with."""
        return f"{self.name}{SEPARATOR}{self.incarnation}{SEPARATOR}"


@dataclass
class WorkerState:
    """The front's view of one worker: its last report and whether it answers."""

    name: str
    report: WorkerReport | None = None
    answering: bool = False
    failures: int = 0  # reports missed in a row
    restarts: int = 0  # new incarnations seen since the front started
    last_error: str | None = field(default=None)

    @property
    def usable(self) -> bool:
        """Answering, started and taking new sessions."""
        return self.answering and self.report is not None and not self.report.draining


def candidates(avatar_id: str, workers: Sequence[WorkerState]) -> list[WorkerState]:
    """The workers to ask for a new session of ``avatar_id``, best first (module doc)."""
    usable = [
        w
        for w in workers
        if w.usable and w.report is not None and w.report.room_places > 0
        if w.report.room_share > 0
    ]

    def order(worker: WorkerState) -> tuple[bool, float, str]:
        report = worker.report
        assert report is not None
        return (avatar_id not in report.models, -report.room_share, worker.name)

    return sorted(usable, key=order)


@dataclass(frozen=True)
class SessionAddress:
    """The worker and incarnation a session id names."""

    worker: str
    incarnation: str


def parse_session_id(session_id: str) -> SessionAddress | None:
    """The worker part of a cluster session id, or None if it is not one."""
    worker, sep, rest = session_id.partition(SEPARATOR)
    incarnation, sep2, token = rest.partition(SEPARATOR)
    if not (sep and sep2 and worker and incarnation and token):
        return None
    return SessionAddress(worker, incarnation)
