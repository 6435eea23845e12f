"""How the gRPC front doors answer: errors as status codes, admin access, typed handlers.

Every failure leaves a gRPC call as a status code and a message (the status details), by
one table shared with the HTTP API: :func:`web.errors.classify` gives the HTTP status,
and :func:`status_for` turns it into the gRPC code that says the same thing

    400, 413, 415, 422  INVALID_ARGUMENT      401  UNAUTHENTICATED
    403                 PERMISSION_DENIED     404  NOT_FOUND
    409                 FAILED_PRECONDITION   429  RESOURCE_EXHAUSTED
    503 queue_full      RESOURCE_EXHAUSTED    503 out_of_memory  RESOURCE_EXHAUSTED
    other 503           UNAVAILABLE (not ready, shutting down, no capacity)
    504                 DEADLINE_EXCEEDED     500 and the rest   INTERNAL

A Retry-After the HTTP API would send travels as the trailing metadata ``retry-after``
(seconds). Handlers are plain coroutines over the generated messages; :func:`unary` and
:func:`bidi` register them with the messages' own (de)serialisers, so the servicers are
typed end to end without the generated ``_pb2_grpc`` base classes (untyped, and they
import their ``_pb2`` module as a top-level name). :func:`raw_unary` and
:func:`raw_bidi` register handlers of the bytes on the wire, with no (de)serialiser:
the doors that carry tensors read and write those bytes themselves
(``web/inference/grpc_wire.py``), and the cluster front relays them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from pydantic import SecretStr

from web.admin_auth import FORBIDDEN_MESSAGE, UNAUTHORIZED_MESSAGE, bearer_matches, is_loopback
from web.errors import RequestError, classify

logger = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp", bound=Message)
_Answer = TypeVar("_Answer")

_BY_HTTP_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    # Too large for the request's own declared shapes: the argument is wrong. (A message
    # past the listener's limit never gets here: grpc refuses it, RESOURCE_EXHAUSTED.)
    413: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# 503s that mean "too much at once" (come back later, or send less), not "not serving".
_EXHAUSTED_CODES = frozenset({"queue_full", "out_of_memory"})
# Headers a proxy adds for the client it forwards (gRPC metadata keys are lower-case).
_PROXY_METADATA = ("forwarded", "x-forwarded-for", "x-real-ip")


def status_for(error: RequestError) -> grpc.StatusCode:
    """The gRPC status code of an error the HTTP API answers with ``error.status``."""
    if error.status == 503 and error.code in _EXHAUSTED_CODES:
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return _BY_HTTP_STATUS.get(error.status, grpc.StatusCode.INTERNAL)


def described(exc: Exception) -> tuple[grpc.StatusCode, RequestError]:
    """``exc`` as its status code and classified error, logged as the HTTP API logs it:
    a 5xx with its message (with the traceback when it is not a known error)."""
    error = classify(exc)
    if error.status >= 500:
        if error.code == "internal_error":
            logger.error("gRPC call failed", exc_info=exc)
        else:
            logger.warning("gRPC call failed: %s", exc)
    return status_for(error), error


async def abort(context: Context, exc: Exception) -> None:
    """End the call with ``exc``'s status code and message (raises grpc's AbortError)."""
    code, error = described(exc)
    trailing = () if error.retry_after is None else (("retry-after", str(error.retry_after)),)
    await context.abort(code, str(error), trailing_metadata=trailing)


def check_admin(context: Context, token: SecretStr | None) -> None:
    """Let an admin call (load, unload) in, or raise the 401/403 the admin API answers.

    The rule of ``web/admin_auth.py``: with ``server.admin_token`` set, the metadata
    ``authorization: Bearer <token>``; without one, only a loopback peer that no proxy
    forwarded.
    """
    metadata = {key.lower(): value for key, value in context.invocation_metadata() or ()}
    if token is not None and token.get_secret_value():
        header = metadata.get("authorization")
        if bearer_matches(header if isinstance(header, str) else None, token):
            return
        logger.info("gRPC admin call refused (no valid token) from %s", context.peer())
        raise RequestError(401, "unauthorized", UNAUTHORIZED_MESSAGE)
    if is_loopback(peer_host(context.peer())) and not any(k in metadata for k in _PROXY_METADATA):
        return
    logger.info("gRPC admin call refused (not local, no admin_token set) from %s", context.peer())
    raise RequestError(403, "forbidden", FORBIDDEN_MESSAGE)


def peer_host(peer: str) -> str | None:
    """The address in grpc's peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return None  # a unix socket, or something grpc adds later: not provably local


@dataclass(frozen=True)
class GrpcService:
    """One service's full name (``package.Service``) and its methods' handlers by name."""

    name: str
    methods: Mapping[str, grpc.RpcMethodHandler[Any, Any]]


Unary = Callable[[_Req, Context], Awaitable[_Resp]]
Bidi = Callable[[AsyncIterator[_Req], Context], Awaitable[None]]
RawUnary = Callable[[bytes, Context], Awaitable[bytes]]
RawBidi = Callable[[AsyncIterator[bytes], Context], Awaitable[None]]


def unary(
    handler: Unary[_Req, _Resp], request: Callable[[bytes], _Req]
) -> grpc.RpcMethodHandler[_Req, _Resp]:
    """A unary method: ``handler`` answers each request; what it raises ends the call
    with its status (module doc). ``request`` parses the request (``Message.FromString``)."""
    return grpc.unary_unary_rpc_method_handler(
        _guarded_unary(handler), request_deserializer=request, response_serializer=_serialize
    )


def bidi(handler: Bidi[_Req], request: Callable[[bytes], _Req]) -> grpc.RpcMethodHandler[_Req, Any]:
    """A bidirectional streaming method: ``handler`` reads the requests and writes its
    answers with ``context.write``; what it raises ends the call with its status."""
    return grpc.stream_stream_rpc_method_handler(
        _guarded_bidi(handler), request_deserializer=request, response_serializer=_serialize
    )


def raw_unary(handler: RawUnary) -> grpc.RpcMethodHandler[bytes, bytes]:
    """A unary method with bytes in and out (no (de)serialiser); errors as :func:`unary`'s."""
    return grpc.unary_unary_rpc_method_handler(_guarded_unary(handler))


def raw_bidi(handler: RawBidi) -> grpc.RpcMethodHandler[bytes, bytes]:
    """A bidirectional method with bytes both ways (it writes bytes); errors as
    :func:`unary`'s."""
    return grpc.stream_stream_rpc_method_handler(_guarded_bidi(handler))


def _guarded_unary(
    handler: Callable[[_Req, Context], Awaitable[_Answer]],
) -> Callable[[_Req, Context], Awaitable[_Answer | None]]:
    async def behaviour(message: _Req, context: Context) -> _Answer | None:
        try:
            return await handler(message, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort(context, exc)
            return None  # not reached: abort raises

    return behaviour


def _guarded_bidi(handler: Bidi[_Req]) -> Bidi[_Req]:
    async def behaviour(messages: AsyncIterator[_Req], context: Context) -> None:
        try:
            await handler(messages, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort(context, exc)

    return behaviour


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()
