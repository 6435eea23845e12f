"""One string field of a protobuf message, read from its wire bytes without parsing it.

The front's gRPC proxy (``web/cluster/grpc_front.py``) routes a request by the model it
names and passes the message on as the bytes it came in: an inference request of 32
float frames is 80 MB, which parsing would copy into a message only to serialise again.
:func:`string_field` walks the message's top-level fields instead, with the walker the
workers' doors split their requests with (:func:`web.inference.grpc_wire.fields`: no
copy, each field stepped over by its wire type), and decodes only the field it was asked
for. As protobuf does, the last occurrence of a field wins, and a field of the wanted
number with another wire type is someone else's (protobuf keeps it as an unknown field).

A message that does not parse raises :class:`MalformedMessageError` (the front answers
INVALID_ARGUMENT, as the worker would; the walker's doc lists the faults), as does a
name that is not UTF-8.
"""

from __future__ import annotations

from google.protobuf.message import Message

from web.inference.grpc_wire import LENGTH_DELIMITED, MalformedMessageError, fields, not_valid

__all__ = ["MalformedMessageError", "model_name", "string_field"]


def string_field(message: bytes | memoryview, number: int) -> str:
    """The string field ``number`` of ``message``'s top level; ``""`` when it is absent
    (proto3's default). Raises :class:`MalformedMessageError` (module doc)."""
    data = memoryview(message)
    found: tuple[int, int] | None = None
    for field in fields(data):
        if field.number == number and field.wire_type == LENGTH_DELIMITED:
            found = (field.value, field.end)
    if found is None:
        return ""
    start, stop = found
    try:
        return str(data[start:stop], "utf-8")
    except UnicodeDecodeError:
        raise MalformedMessageError(f"field {number} is not UTF-8 text") from None


def model_name(request: bytes, message: type[Message], field: str) -> str:
    """The model a ``message`` request names in its string ``field``, read from its bytes;
    a request that does not parse is a 400 (INVALID_ARGUMENT)."""
    try:
        return string_field(request, message.DESCRIPTOR.fields_by_name[field].number)
    except MalformedMessageError as exc:
        raise not_valid(message, exc) from None
