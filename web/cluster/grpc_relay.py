"""gRPC calls relayed to a worker as bytes: the channels, the metadata, the status back.

The front's gRPC listener (``web/cluster/grpc_front.py``) decides which worker a call
goes to; this module carries it there and back without parsing it. Its methods are
registered with no (de)serialisers (``raw_unary``, ``raw_bidi`` of
``web/inference/grpc_status.py``), so a request arrives as the bytes the caller sent
and goes on as they are; the answer comes back the same way, with the worker's status,
details and metadata (grpc's own keys aside, which grpc writes itself). A worker that
does not answer, or fails during a call, ends the call UNAVAILABLE with ``worker
<name>:`` before grpc's reason, and its report is pulled at once
(:meth:`ClusterFront.report_soon`): a dead worker is skipped from then on.

:class:`WorkerChannels` holds one grpc.aio channel per worker, with the listener's
message limits (a request the front took, the worker takes; an answer the worker sends,
the front takes), made on first use, replaced when the worker's address changes (a new
incarnation: the old process and its calls are gone) and closed with the listener.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit

import grpc

from web.cluster.front import ClusterFront
from web.cluster.placement import WorkerReport, WorkerState
from web.errors import RequestError
from web.inference.grpc_server import MessageLimits
from web.inference.grpc_status import Context

logger = logging.getLogger(__name__)

#: Seconds a caller is told to wait (``retry-after``) when no worker can take its call.
RETRY_AFTER_S = 5
#: How a worker that did not answer a fan-out call ended it (its report is pulled).
_NOT_ANSWERED = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
#: Metadata grpc writes itself on every call, not the caller's to pass on.
_OWN_METADATA = frozenset({"user-agent", "content-type", "te", "host"})

Metadata = Sequence[tuple[str, str | bytes]]


def grpc_target(report: WorkerReport | None) -> str | None:
    """Where a worker's gRPC listener is: the host of its HTTP URL (its node's address
    or ``cluster.worker_host``) at its gRPC port; None without one."""
    if report is None or report.grpc_port is None:
        return None
    host = urlsplit(report.url).hostname or report.node
    return f"[{host}]:{report.grpc_port}" if ":" in host else f"{host}:{report.grpc_port}"


def relayed_metadata(
    context: Context, *, dropped: str | None = None
) -> list[tuple[str, str | bytes]]:
    """The caller's metadata as the worker gets it: all of it (``authorization`` too)
    but grpc's own keys and ``dropped``."""
    return [
        (key, value)
        for key, value in context.invocation_metadata() or ()
        if _relayed(key) and key != dropped
    ]


class WorkerChannels:
    """One grpc.aio channel per worker (module doc)."""

    def __init__(self, limits: MessageLimits) -> None:
        self._options = [
            ("grpc.max_send_message_length", limits.receive_bytes),
            ("grpc.max_receive_message_length", limits.send_bytes),
        ]
        self._open: dict[str, tuple[str, grpc.aio.Channel]] = {}
        self._closed = False

    async def channel(self, worker: WorkerState) -> grpc.aio.Channel:
        """The channel to ``worker``'s listener; one to its old address is closed."""
        target = grpc_target(worker.report)
        if target is None:  # the front routes only to workers that have a listener
            raise RequestError(503, "worker_unavailable", f"worker {worker.name} serves no gRPC")
        if self._closed:
            raise RequestError(503, "shutting_down", "the front is shutting down")
        held = self._open.get(worker.name)
        if held is not None and held[0] == target:
            return held[1]
        channel = grpc.aio.insecure_channel(target, options=self._options)
        self._open[worker.name] = (target, channel)
        if held is not None:
            logger.info(
                "cluster: worker %s moved to %s; closing its old channel", worker.name, target
            )
            await held[1].close(None)
        return channel

    async def close(self) -> None:
        """Close every channel (calls still on them are cancelled)."""
        self._closed = True
        channels = [channel for _, channel in self._open.values()]
        self._open.clear()
        await asyncio.gather(*(channel.close(None) for channel in channels))


class Relay:
    """Calls carried to the workers of ``front`` as bytes (module doc)."""

    def __init__(self, front: ClusterFront, channels: WorkerChannels) -> None:
        self._front = front
        self._channels = channels

    async def unary(
        self,
        worker: WorkerState,
        path: str,
        request: bytes,
        context: Context,
        *,
        metadata: Metadata,
        timeout_s: float | None,
    ) -> bytes:
        """``request`` to ``worker``; its answer, with its metadata set on ``context``,
        or its failure ended on ``context``."""
        channel = await self._channels.channel(worker)
        method: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
        call = method(request, metadata=metadata, timeout=timeout_s)
        try:
            answer = await call
        except grpc.aio.AioRpcError as exc:
            await self._pass_back(worker, exc, context)
        initial = _kept(await call.initial_metadata())
        if initial:
            await context.send_initial_metadata(initial)
        context.set_trailing_metadata(_kept(await call.trailing_metadata()))
        return answer

    async def stream(
        self,
        worker: WorkerState,
        path: str,
        requests: AsyncIterator[bytes],
        context: Context,
        *,
        metadata: Metadata,
    ) -> None:
        """A bidirectional call to ``worker``: ``requests`` go on as the caller sends them,
        the answers come back as the worker writes them, until either side ends."""
        channel = await self._channels.channel(worker)
        method: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(path)
        call = method(requests, metadata=metadata, timeout=context.time_remaining())
        try:
            async for answer in call:
                await context.write(answer)
            context.set_trailing_metadata(_kept(await call.trailing_metadata()))
        except grpc.aio.AioRpcError as exc:
            await self._pass_back(worker, exc, context)
        finally:
            call.cancel()  # the caller went away: so does the worker's half (done: no-op)

    async def ask_all(
        self,
        workers: Sequence[WorkerState],
        path: str,
        request: bytes,
        context: Context,
        *,
        metadata: Metadata,
        timeout_s: float,
    ) -> dict[str, bytes]:
        """``request`` to every one of ``workers`` at once, each within ``timeout_s``: the
        answers by worker name. When none answered, a worker's refusal of the request
        (an unknown model) ends the call as it came, else UNAVAILABLE lists them."""

        async def one(worker: WorkerState) -> bytes:
            channel = await self._channels.channel(worker)
            method: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
            return await method(request, metadata=metadata, timeout=timeout_s)

        results = await asyncio.gather(*(one(w) for w in workers), return_exceptions=True)
        answers: dict[str, bytes] = {}
        failures: dict[str, grpc.aio.AioRpcError] = {}
        for worker, result in zip(workers, results, strict=True):
            if isinstance(result, grpc.aio.AioRpcError):
                failures[worker.name] = result
            elif isinstance(result, BaseException):
                raise result
            else:
                answers[worker.name] = result
        for name, error in failures.items():
            if error.code() in _NOT_ANSWERED:
                logger.warning(
                    "cluster: worker %s did not answer %s: %s", name, path, error.details()
                )
                self._front.report_soon(name)
        if answers:
            return answers
        refusal = next((e for e in failures.values() if e.code() not in _NOT_ANSWERED), None)
        if refusal is not None:
            await context.abort(
                refusal.code(),
                refusal.details() or "",
                trailing_metadata=_kept(refusal.trailing_metadata()),
            )
        raise RequestError(
            503,
            "worker_unavailable",
            "no worker answered: "
            + "; ".join(f"worker {n}: {e.details()}" for n, e in failures.items()),
            retry_after=RETRY_AFTER_S,
        )

    async def _pass_back(
        self, worker: WorkerState, error: grpc.aio.AioRpcError, context: Context
    ) -> None:
        """End the call as ``worker`` ended it; UNAVAILABLE names the worker."""
        code, details = error.code(), error.details() or ""
        if code is grpc.StatusCode.UNAVAILABLE:
            logger.warning(
                "cluster: worker %s did not answer a gRPC call: %s", worker.name, details
            )
            worker.last_error = f"gRPC: {details}"[:300]
            self._front.report_soon(worker.name)  # gone, or restarted? its report tells
            details = f"worker {worker.name}: {details}"
        await context.abort(code, details, trailing_metadata=_kept(error.trailing_metadata()))


def _relayed(key: str) -> bool:
    return not key.startswith((":", "grpc-")) and key not in _OWN_METADATA


def _kept(metadata: grpc.aio.Metadata | None) -> Metadata:
    """A worker's answer metadata to pass back (a tuple: grpc's abort takes no list)."""
    return tuple((k, v) for k, v in metadata or () if _relayed(k))
