"""The gRPC listener of the raw inference front doors: its message limits and its lifetime.

One grpc.aio server on ``server.grpc_port`` (``server.host``) serves two services side
by side (``docs/design/inference-protocols.md`` §17): the Open Inference Protocol v2
(``inference.GRPCInferenceService``, :mod:`web.inference.oip_grpc`) and the seed's
``inference.InferenceService`` (:mod:`web.inference.seed_grpc`). ``lipstream serve``
opens it next to the HTTP listener once the app has started (its services use the
app's inference door) and closes it in its shutdown path; each cluster worker opens one
on a port the OS picks and reports it (``WorkerReport.grpc_port``).

Messages are capped at the largest request a model takes, :func:`message_limits`: grpc
reads a message's length before its bytes and refuses one past the cap with
RESOURCE_EXHAUSTED, so an oversized request costs the server no allocation, and the
calls already running go on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
from aiohttp import web

from inference_core.adapter.spec import AdapterSpec
from web.inference.grpc_status import GrpcService
from web.inference.oip_grpc import oip_service
from web.inference.seed_grpc import seed_service
from web.schemas.inference import MAX_REQUEST_FRAMES

logger = logging.getLogger(__name__)

#: Room for a request's or response's framing around its tensors: names, shapes,
#: parameters and field tags (a few hundred bytes in practice; 32 seed regions add 5
#: bytes each).
ENVELOPE_BYTES = 64 * 1024
_FLOAT32 = 4


@dataclass(frozen=True)
class MessageLimits:
    """The largest message the listener takes and sends, in bytes."""

    receive_bytes: int
    send_bytes: int


def message_limits(
    spec: AdapterSpec | None = None, max_frames: int = MAX_REQUEST_FRAMES
) -> MessageLimits:
    """Limits sized for ``max_frames`` frames of the float contract of ``spec``'s geometry
    (unet_328's by default), the larger of a model's two contracts, plus
    :data:`ENVELOPE_BYTES`.

    At the defaults: 32 × (6×320×320 + 32×16×16) float32 = 79,691,776 bytes in (a seed
    ``InferBatch`` of 25 frames is 62 MB) and 32 × 3×320×320 float32 = 39,321,600 out,
    each plus 64 KiB. grpc's own default, 4 MiB, would refuse two float frames.
    """
    spec = spec or AdapterSpec()
    frame_in = (math.prod(spec.visual_shape) + math.prod(spec.audio_shape)) * _FLOAT32
    frame_out = math.prod(spec.output_shape) * _FLOAT32
    return MessageLimits(
        receive_bytes=max_frames * frame_in + ENVELOPE_BYTES,
        send_bytes=max_frames * frame_out + ENVELOPE_BYTES,
    )


class GrpcListener:
    """A started grpc.aio server; :meth:`close` stops it."""

    def __init__(
        self,
        server: grpc.aio.Server,
        host: str,
        port: int,
        after_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._server = server
        self.host = host
        self.port = port  # the bound one (the OS's choice when asked for 0)
        self._after_close = after_close
        self._closed = False

    @property
    def address(self) -> str:
        return _address(self.host, self.port)

    async def close(self, grace_s: float | None) -> None:
        """Refuse new calls; let running ones finish for up to ``grace_s`` seconds, then
        cancel them; then run ``after_close`` (what the services held). Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._server.stop(grace_s)
        if self._after_close is not None:
            await self._after_close()
        logger.info("gRPC listener on %s closed", self.address)


async def start_grpc(
    services: Sequence[GrpcService],
    host: str,
    port: int,
    limits: MessageLimits | None = None,
    after_close: Callable[[], Awaitable[None]] | None = None,
) -> GrpcListener:
    """Listen on ``host:port`` (0: a port the OS picks) for ``services``;
    ``after_close`` runs when the listener has closed (a proxy's client channels).

    Raises :class:`OSError` when the address cannot be bound (another process holds the
    port: grpc's SO_REUSEPORT, which would let two servers share it silently, is off).
    """
    limits = limits or message_limits()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limits.receive_bytes),
            ("grpc.max_send_message_length", limits.send_bytes),
            ("grpc.so_reuseport", 0),
        ]
    )
    for service in services:
        server.add_registered_method_handlers(service.name, dict(service.methods))
    address = _address(host, port)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc's "Failed to bind to address"
        bound, reason = 0, str(exc)
    else:
        reason = "grpc could not bind it"
    if bound == 0:
        await server.stop(None)
        raise OSError(
            f"cannot listen for gRPC on {address} ({reason}): free the port or choose "
            "another with server.grpc_port (null turns the gRPC listener off)"
        )
    await server.start()
    listener = GrpcListener(server, host, bound, after_close)
    logger.info(
        "gRPC listening on %s (%s; messages up to %d bytes in, %d out)",
        listener.address,
        ", ".join(s.name for s in services),
        limits.receive_bytes,
        limits.send_bytes,
    )
    return listener


async def start_inference_grpc(app: web.Application, host: str, port: int) -> GrpcListener:
    """The raw inference front doors of a started ``app`` (``web.app.build_app``: its
    startup made the inference door) on ``host:port``: the Open Inference Protocol and
    the seed's service."""
    return await start_grpc([oip_service(app), seed_service(app)], host, port)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
