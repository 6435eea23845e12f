"""Many worker processes behind one HTTP front, on Ray (``docs/design/cluster.md`` §14).

``placement`` (where a session goes, and which worker a session id names), ``worker``
(one lipstream server as a Ray actor), ``runtime`` (Ray in the front's process: started,
joined or given, and whether it is still there), ``front`` (the workers, their reports,
and bringing the runtime back), ``app`` (the front's HTTP app; ``web/serve.py`` serves
it) and ``grpc_front`` (the front's gRPC listener, relaying to the workers' own:
``grpc_relay`` carries a call as bytes, ``grpc_wire`` reads its model, ``grpc_merge``
merges the answers of every worker). Only ``runtime`` imports Ray, and ``worker`` asks it
for its node id.
"""

from web.cluster.placement import WorkerReport, WorkerState, candidates, parse_session_id

__all__ = ["WorkerReport", "WorkerState", "candidates", "parse_session_id"]
