"""``POST /admin/avatars/import`` on a cluster front: the import reaches every worker.

Each worker serves the avatars in its own ``avatars.root``, so an avatar imported through
one worker alone stays unknown to the others. The front checks the request as one
process would (the admin rule, the body), refuses a ``replace`` of an avatar a worker
has loaded, then sends the import to every answering worker **in turn**:

- each worker imports from ``avatars.import_root`` on its own machine, so the folder
  must be readable there (a shared mount, or the same copy on every machine);
- a worker whose avatar root already holds the package an earlier worker wrote (workers
  on one machine, or a root on a shared file system) registers it instead of writing it
  again: the front passes the packages written so far in ``X-Lipstream-Package``
  (:func:`~inference_core.avatars.package.package_fingerprint`), and one at a time, so
  no two workers write into one root at once.

When the first worker to answer refuses the import (a bad path, an avatar that exists,
a source that does not import), its answer is the front's and nothing was written
anywhere. Once one worker has it, every other worker's failure is collected, and the front answers
``502 import_incomplete`` naming each worker that failed and why (a worker that is not
answering included) and the ones that have the avatar. Otherwise it answers 201 with the
first worker's import and each worker's outcome (``workers``).

A worker takes as long as its import takes: the front waits for it without the request
timeout (connecting is bounded by ``cluster.report_timeout_s``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
from aiohttp import web

from web.admin import MAX_IMPORT_BODY, PACKAGE_HEADER
from web.cluster.front import ClusterFront
from web.cluster.placement import WorkerState
from web.errors import RequestError
from web.request_body import parse_body, read_limited
from web.schemas import AvatarImportRequest, ClusterImportedAvatar, ImportedAvatar, WorkerImport

logger = logging.getLogger(__name__)


async def import_everywhere(
    request: web.Request, front: ClusterFront, http: aiohttp.ClientSession
) -> web.Response:
    """Import on every worker, one after another (module doc)."""
    raw = await read_limited(request, MAX_IMPORT_BODY, "an import request")
    wanted = parse_body(AvatarImportRequest, raw)
    workers = list(front.workers.values())
    answering = [w for w in workers if w.answering and w.report is not None]
    if not answering:
        raise RequestError(503, "worker_unavailable", "no worker is answering", retry_after=1)
    holding = [w.name for w in answering if w.report and wanted.id in w.report.models]
    if wanted.replace and holding:
        raise RequestError(
            409,
            "model_in_use",
            f"avatar {wanted.id!r} is loaded on {', '.join(holding)}; unload it there "
            f"(POST /admin/models/{wanted.id}/unload) before replacing it",
        )
    failed = {
        w.name: f"not answering ({w.last_error or 'no report yet'})"
        for w in workers
        if w not in answering
    }
    outcomes: dict[str, WorkerImport] = {}
    written: list[str] = []  # the packages' fingerprints, as the workers answered them
    first: ImportedAvatar | None = None
    for worker in answering:
        try:
            status, body, package = await _send(front, http, worker, raw, written)
        except (aiohttp.ClientError, TimeoutError) as exc:
            failed[worker.name] = f"did not answer: {type(exc).__name__}: {exc}"[:300]
            continue
        if status == 201:
            imported = ImportedAvatar.model_validate(body)
            first = first or imported
            outcomes[worker.name] = WorkerImport(outcome="imported")
            if package:
                written.append(package)
        elif status == 200:
            outcomes[worker.name] = WorkerImport(outcome="registered")
        elif not outcomes:  # nothing was written anywhere: the refusal is the answer
            return web.json_response(body, status=status)
        else:
            failed[worker.name] = _refusal(status, body)
    if failed or first is None:
        done = ", ".join(f"{name} ({o.outcome})" for name, o in outcomes.items()) or "none"
        reasons = "; ".join(f"{name}: {why}" for name, why in failed.items())
        logger.warning("cluster: import of %s incomplete: %s", wanted.id, reasons)
        raise RequestError(
            502,
            "import_incomplete",
            f"avatar {wanted.id!r} is on {done}; not on {reasons}. Each worker reads the "
            "folder from avatars.import_root on its own machine: make it readable there, "
            "then import again with replace: true"[:2000],
        )
    answer = ClusterImportedAvatar(**first.model_dump(), workers=outcomes)
    return web.json_response(answer.dump(), status=201)


async def _send(
    front: ClusterFront,
    http: aiohttp.ClientSession,
    worker: WorkerState,
    raw: bytes,
    written: list[str],
) -> tuple[int, Any, str]:
    """The import as ``worker`` answers it: its status, JSON body and package token."""
    assert worker.report is not None
    headers = {
        "Authorization": f"Bearer {front.worker_admin_token.get_secret_value()}",
        "Content-Type": "application/json",
    }
    if written:
        headers[PACKAGE_HEADER] = ",".join(written)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=front.settings.cluster.report_timeout_s
    )
    url = worker.report.url + "/admin/avatars/import"
    async with http.post(url, data=raw, headers=headers, timeout=timeout) as answer:
        text = await answer.text()
        try:
            body = json.loads(text)
        except ValueError:
            body = {"error": {"code": "worker_error", "message": text[:300]}}
        return answer.status, body, answer.headers.get(PACKAGE_HEADER, "")


def _refusal(status: int, body: Any) -> str:
    """A worker's error answer in a few words: its status, code and message."""
    try:
        error = body["error"]
        return f"{status} {error['code']}: {error['message']}"[:500]
    except (KeyError, TypeError):
        return f"HTTP {status}"
