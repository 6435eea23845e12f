"""Many worker processes behind one HTTP front, on Ray (``docs/architecture.md`` §14).

``placement`` (where a session goes, and which worker a session id names), ``worker``
(one lipstream server as a Ray actor), ``front`` (Ray, the workers and their reports) and
``app`` (the front's HTTP app and ``serve_front``). Only ``front`` imports Ray.
"""

from web.cluster.placement import WorkerReport, WorkerState, candidates, parse_session_id

__all__ = ["WorkerReport", "WorkerState", "candidates", "parse_session_id"]
