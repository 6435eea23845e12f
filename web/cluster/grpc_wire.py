"""One string field of a protobuf message, read from its wire bytes without parsing it.

The front's gRPC proxy (``web/cluster/grpc_front.py``) routes a request by the model it
names and passes the message on as the bytes it came in: an inference request of 32
float frames is 80 MB, which parsing would copy into a message only to serialise again.
:func:`string_field` walks the message's top-level fields instead, stepping over each
by its wire type (a varint, 8 or 4 fixed bytes, or a length and that many bytes) without
copying anything, and decodes only the field it was asked for. As protobuf does, the
last occurrence of a field wins, and a field of the wanted number with another wire
type is someone else's (protobuf keeps it as an unknown field).

A message that does not parse raises :class:`MalformedMessageError` (the front answers
INVALID_ARGUMENT, as the worker would): a varint longer than 10 bytes or cut off by the
end, a field whose length runs past the end, field number 0 or past 2^29 - 1, wire types
6 and 7 (none), 3 and 4 (groups: proto2's, never written by proto3 senders; refused
rather than walked), and a name that is not UTF-8.
"""

from __future__ import annotations

from google.protobuf.message import Message

from web.errors import RequestError

#: The most bytes a varint takes (a 64-bit value, 7 bits a byte).
_MAX_VARINT_BYTES = 10
_MAX_FIELD_NUMBER = (1 << 29) - 1
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


class MalformedMessageError(ValueError):
    """The bytes are not a protobuf message (the message says where they go wrong)."""


def string_field(message: bytes | memoryview, number: int) -> str:
    """The string field ``number`` of ``message``'s top level; ``""`` when it is absent
    (proto3's default). Raises :class:`MalformedMessageError` (module doc)."""
    data = memoryview(message)
    end = len(data)
    found: tuple[int, int] | None = None
    at = 0
    while at < end:
        key, at = _varint(data, at)
        field, wire = key >> 3, key & 7
        if not 0 < field <= _MAX_FIELD_NUMBER:
            raise MalformedMessageError(f"field number {field} at byte {at} is out of range")
        if wire == _VARINT:
            _, at = _varint(data, at)
        elif wire == _FIXED64:
            at += 8
        elif wire == _FIXED32:
            at += 4
        elif wire == _LENGTH_DELIMITED:
            size, at = _varint(data, at)
            if field == number:
                found = (at, at + size)
            at += size
        else:
            raise MalformedMessageError(f"field {field} has wire type {wire}, which is not served")
        if at > end:
            raise MalformedMessageError(f"field {field} runs past the end of the message")
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
        raise RequestError(
            400, "bad_message", f"the request is not a valid {message.DESCRIPTOR.name}: {exc}"
        ) from None


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    """The varint at ``at`` and where the next field starts."""
    value = shift = 0
    last = min(len(data), at + _MAX_VARINT_BYTES)
    while at < last:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    if at >= len(data):
        raise MalformedMessageError("a varint runs past the end of the message")
    raise MalformedMessageError(f"a varint is longer than {_MAX_VARINT_BYTES} bytes")
