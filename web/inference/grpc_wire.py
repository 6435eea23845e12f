"""Protobuf messages at the wire level, where parsing them would copy their tensors.

A float request of 4 frames is 10 MB; protobuf's parser copies every bytes field into
its own memory, reading one out copies it again, and a response's bytes are copied in
and then serialised. The doors that carry tensors (``ModelInfer``, ``ModelStreamInfer``,
the seed's ``InferBatch``) and the cluster front's router read and write the wire bytes
themselves instead, with what this module gives:

* :func:`fields` walks a message's top-level fields without copying anything, stepping
  over each by its wire type (a varint, 8 or 4 fixed bytes, or a length and that many
  bytes). The front reads a request's model with it (``web/cluster/grpc_wire.py``).
* :class:`Splitter` parses a request with its large bytes fields left out: those are
  :class:`memoryview` slices of the bytes grpc handed over (views, not copies), and the
  other fields' encodings, concatenated (a few hundred bytes), are parsed by protobuf.
  Protobuf reads concatenated encodings as one message, so the split reads exactly what
  parsing the whole would: fields in any order, unknown fields kept, the last occurrence
  of a singular field wins, a repeated one accumulates, and a large field's number with
  another wire type is an unknown field (protobuf's reading too).
* :func:`delimited` writes a length-delimited field around parts it does not copy, so a
  response is its small fields serialised by protobuf followed by its tensors'
  encodings, joined once (``b"".join``) into the bytes grpc sends.

A message that does not parse raises :class:`MalformedMessageError`: a varint longer
than 10 bytes or cut off by the end, a field whose length runs past the end, field
number 0 or past 2^29 - 1, wire types 6 and 7 (none), 3 and 4 (groups: proto2's, never
written by proto3 senders, refused rather than walked). A :class:`Splitter` answers
those, and whatever protobuf refuses in the small fields, as the 400 (gRPC's
INVALID_ARGUMENT) :func:`not_valid` words.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from web.errors import RequestError

#: The most bytes a varint takes (a 64-bit value, 7 bits a byte).
_MAX_VARINT_BYTES = 10
_MAX_FIELD_NUMBER = (1 << 29) - 1
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
#: Top-level fields a :class:`Splitter` walks before it hands the message to protobuf
#: whole, as if unsplit: a request has a few dozen; a message of millions of tiny fields
#: would hold the event loop for seconds in a Python walk, far longer than in protobuf's.
MAX_WALKED_FIELDS = 4096

Buffer = bytes | memoryview
_M = TypeVar("_M", bound=Message)


class MalformedMessageError(ValueError):
    """The bytes are not a protobuf message (the message says where they go wrong)."""


class WireField(NamedTuple):
    """One top-level field: its number, wire type, and where its key, its value (for a
    length-delimited field: its bytes) and the next field start."""

    number: int
    wire_type: int
    start: int
    value: int
    end: int


def fields(message: memoryview) -> Iterator[WireField]:
    """``message``'s top-level fields in wire order (a field given twice, twice).
    Raises :class:`MalformedMessageError` (module doc) when it reaches the fault."""
    end = len(message)
    at = 0
    while at < end:
        start = at
        key, at = _varint(message, at)
        field, wire = key >> 3, key & 7
        if not 0 < field <= _MAX_FIELD_NUMBER:
            raise MalformedMessageError(f"field number {field} at byte {at} is out of range")
        value = at
        if wire == VARINT:
            _, at = _varint(message, at)
        elif wire == FIXED64:
            at += 8
        elif wire == FIXED32:
            at += 4
        elif wire == LENGTH_DELIMITED:
            size, value = _varint(message, at)
            at = value + size
        else:
            raise MalformedMessageError(f"field {field} has wire type {wire}, which is not served")
        if at > end:
            raise MalformedMessageError(f"field {field} runs past the end of the message")
        yield WireField(field, wire, start, value, at)


def not_valid(message: type[Message], exc: Exception) -> RequestError:
    """The 400 (INVALID_ARGUMENT) for a request that is not a valid ``message``."""
    return RequestError(
        400, "bad_message", f"the request is not a valid {message.DESCRIPTOR.name}: {exc}"
    )


@dataclass(frozen=True)
class Split(Generic[_M]):
    """A request parsed without its large bytes fields, and their values as views of the
    wire bytes by field name (every occurrence, in wire order)."""

    message: _M
    views: Mapping[str, list[memoryview]]

    def repeated(self, name: str) -> list[memoryview]:
        """A repeated bytes field as protobuf reads it: every occurrence."""
        return self.views[name]

    def last(self, name: str) -> memoryview:
        """A singular bytes field as protobuf reads it: the last occurrence, else empty."""
        found = self.views[name]
        return found[-1] if found else memoryview(b"")


class Splitter(Generic[_M]):
    """Parses ``message`` requests with the bytes fields ``large`` left as views (module
    doc); built once per message type."""

    def __init__(self, message: type[_M], *large: str) -> None:
        by_name = message.DESCRIPTOR.fields_by_name
        for name in large:
            if by_name[name].type != FieldDescriptor.TYPE_BYTES:
                raise TypeError(f"{message.DESCRIPTOR.name}.{name} is not a bytes field")
        self._message = message
        self._large = {by_name[name].number: name for name in large}

    def __call__(self, wire: bytes) -> Split[_M]:
        """``wire`` split; a message that does not parse is a 400 (:func:`not_valid`)."""
        try:
            return self._split(wire)
        except (MalformedMessageError, DecodeError) as exc:
            raise not_valid(self._message, exc) from None

    def _split(self, wire: bytes) -> Split[_M]:
        data = memoryview(wire)
        views: dict[str, list[memoryview]] = {name: [] for name in self._large.values()}
        small: list[memoryview] = []  # runs of the other fields' encodings
        run_start = 0
        for count, field in enumerate(fields(data)):
            if count == MAX_WALKED_FIELDS:
                return self._parsed_whole(wire)
            name = self._large.get(field.number) if field.wire_type == LENGTH_DELIMITED else None
            if name is not None:
                if run_start < field.start:
                    small.append(data[run_start : field.start])
                views[name].append(data[field.value : field.end])
                run_start = field.end
        if run_start == 0:  # no large field: nothing to leave out
            return Split(self._message.FromString(wire), views)
        if run_start < len(data):
            small.append(data[run_start:])
        return Split(self._message.FromString(b"".join(small)), views)

    def _parsed_whole(self, wire: bytes) -> Split[_M]:
        message = self._message.FromString(wire)
        views: dict[str, list[memoryview]] = {}
        for number, name in self._large.items():
            value = getattr(message, name)
            if message.DESCRIPTOR.fields_by_number[number].is_repeated:
                views[name] = [memoryview(v) for v in value]
            else:
                views[name] = [memoryview(value)]
            message.ClearField(name)
        return Split(message, views)


def varint(value: int) -> bytes:
    """``value`` (0 or more) as a varint."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def delimited(number: int, parts: Sequence[Buffer]) -> list[Buffer]:
    """Length-delimited field ``number`` (a bytes field or a submessage) holding
    ``parts`` back to back: its key and length, then the parts themselves, uncopied."""
    size = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)
    return [varint(number << 3 | LENGTH_DELIMITED) + varint(size), *parts]


def array_bytes(array: np.ndarray) -> memoryview:
    """``array``'s bytes in row-major order, viewed (copied only if not contiguous)."""
    return np.ascontiguousarray(array).data.cast("B")


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
