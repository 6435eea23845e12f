"""An inference request and response of the Open Inference Protocol over REST, on the wire.

A request is a JSON header (``{"id"?, "inputs": [...], "outputs"?, "parameters"?}``)
optionally followed by the inputs' bytes: the **binary tensor extension**, which
``tritonclient`` uses by default. There, the ``Inference-Header-Content-Length`` header
gives the JSON's length, each input sent as bytes has ``parameters.binary_data_size``,
and the blobs follow the JSON in input order (little-endian, row-major, unpadded). An
input without ``binary_data_size`` carries its values as JSON ``data`` (flat or nested).
Outputs come back as JSON ``data`` unless asked for as bytes (per output
``parameters.binary_data``, or for all ``parameters.binary_data_output``); then the
answer carries the same header and each output its ``binary_data_size``.

A request is read in two steps, each deciding how much more may be read before any
tensor data is touched. :func:`read_header` reads the JSON alone (its length from
:func:`header_length`, bounded by :func:`json_limit`) and :func:`parse_request` its
structure; the caller then checks the declared tensors against the model's contract.
:func:`read_tensors` checks each ``binary_data_size`` against the contract and the body
that is left (:func:`binary_sizes`), and only then reads exactly the blobs' bytes, into
one buffer that each input is a view of. :func:`send_response` writes the answer, an
output asked for as bytes straight from the array's buffer. Malformed requests are
:class:`~web.errors.RequestError` 400s naming what is wrong.

Why one module of about 430 lines: each step of reading a request sets the bound of the
next (the header length bounds the JSON, the JSON the blobs), and the answer mirrors how
the request was encoded; split, those bounds would travel between modules.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import StreamReader, web

from web.errors import RequestError
from web.inference.contract import Contract, DeclaredTensor, TensorInfo

HEADER_LENGTH = "Inference-Header-Content-Length"
#: The JSON around the tensors' values (names, shapes, parameters): what a request needs
#: besides its data, with room to spare.
ENVELOPE_BYTES = 64 * 1024
#: The most JSON text one value may take: a float sent as a double's shortest repr
#: (``-2.2250738585072014e-308``, 24 characters, what ``tritonclient`` sends for FP32),
#: its comma, and room for spaces and nesting brackets; an integer of one byte: ``255,``.
_FLOAT_TEXT = 32
_INT_TEXT = 8
_WRITE_CHUNK = 1 << 20


@dataclass(frozen=True)
class RequestedInput:
    """An input as the JSON declares it: its bytes follow (``binary_size``) or ``data``."""

    declared: DeclaredTensor
    binary_size: int | None
    data: object = None


@dataclass(frozen=True)
class InferRequest:
    """A parsed request header. ``binary_outputs``: the requested output's encoding
    (per output, else ``binary_data_output``, else JSON)."""

    id: str | None
    inputs: tuple[RequestedInput, ...]
    outputs: tuple[str, ...]  # empty: every output
    binary_outputs: bool

    @property
    def declared(self) -> list[DeclaredTensor]:
        return [i.declared for i in self.inputs]


def header_length(value: str | None, content_length: int | None) -> int | None:
    """The JSON's length from ``Inference-Header-Content-Length`` (None: no header), or 400
    for a value that is not a non-negative integer or that runs past the body."""
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or not text.isascii() or len(text) > 18:
        raise _bad(f"{HEADER_LENGTH} must be a non-negative integer, got {value[:32]!r}")
    length = int(text)
    if content_length is not None and length > content_length:
        raise _bad(
            f"{HEADER_LENGTH} is {length} but the body is {content_length} bytes: "
            "the JSON header cannot run past the body",
            code="bad_header_length",
        )
    return length


def json_limit(contracts: Sequence[Contract]) -> int:
    """The most JSON text a request to one of ``contracts`` may need: every value of its
    largest request written as JSON (at most ``_FLOAT_TEXT`` bytes for a float, ``_INT_TEXT``
    for an integer) plus the envelope. For a unet_328 model that is 32 frames of 622,592
    float values: about 640 MB, the JSON form of an 80 MB binary request. A client that
    sends that much should send bytes (the binary extension, ``tritonclient``'s default):
    the cap only keeps a body from being larger than any valid request could be."""

    def text(contract: Contract) -> int:
        return contract.max_frames * sum(
            math.prod(t.frame_shape) * (_INT_TEXT if t.dtype.kind in "iu" else _FLOAT_TEXT)
            for t in contract.inputs
        )

    return ENVELOPE_BYTES + max(text(c) for c in contracts)


def parse_json(text: bytes | bytearray, what: str) -> dict[str, Any]:
    """A JSON object, or 400 (invalid JSON, not an object, nested past Python's limit)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        reason = "it nests too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise _bad(f"{what} is not valid JSON: {reason}", code="bad_json") from None
    if not isinstance(data, dict):
        raise _bad(f"{what} must be a JSON object", code="bad_json")
    return data


def parse_request(header: Mapping[str, Any]) -> InferRequest:
    """The request's structure: ids, names, datatypes, integer shapes and how each input's
    values come (400 naming the first thing wrong). Values are not looked at."""
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _bad("'id' must be a string")
    parameters = _object(header.get("parameters"), "'parameters'")
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise _bad("'inputs' must be a non-empty list of tensors")
    parsed = tuple(_input(i, item) for i, item in enumerate(inputs))
    default_binary = _flag(parameters, "binary_data_output", "'parameters'")
    outputs = header.get("outputs")
    names: list[str] = []
    binary = default_binary
    if outputs is not None:
        if not isinstance(outputs, list):
            raise _bad("'outputs' must be a list of {name, parameters?}")
        for i, item in enumerate(outputs):
            what = f"outputs[{i}]"
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise _bad(f"{what} must be an object with a 'name'")
            own = _object(item.get("parameters"), f"{what}.parameters")
            _refuse_unsupported(own, what)
            if "classification" in own:
                raise _bad(f"{what}: classification is not supported: lip-sync outputs are faces")
            if "binary_data" in own:
                binary = _flag(own, "binary_data", f"{what}.parameters")
            names.append(item["name"])
    return InferRequest(request_id, parsed, tuple(names), binary)


def check_outputs(request: InferRequest, contract: Contract) -> None:
    """400 when the request names an output the model does not have."""
    for name in request.outputs:
        if name != contract.output.name:
            raise _bad(
                f"model {contract.model_id!r} has one output, {contract.output.name!r}; "
                f"the request asks for {name[:64]!r}"
            )


def binary_sizes(
    request: InferRequest, contract: Contract, n: int, after_header: int | None
) -> list[tuple[str, int]]:
    """The blobs that follow the JSON, in order, each checked against the contract's bytes
    for ``n`` frames; their sum against ``after_header`` (the body's bytes after the JSON,
    None when the length is not known in advance). 400 for a size that is wrong: nothing
    of the blobs has been read yet."""
    blobs = []
    for item in request.inputs:
        if item.binary_size is None:
            continue
        name = item.declared.name
        expected = contract.input_bytes(name, n)
        if item.binary_size != expected:
            raise _bad(
                f"input {name!r}: binary_data_size is {item.binary_size}, but "
                f"{item.declared.datatype} {list(item.declared.shape)} is {expected} bytes",
                code="bad_input_size",
            )
        blobs.append((name, expected))
    total = sum(size for _, size in blobs)
    if after_header is not None and after_header != total:
        raise _bad(
            f"the body holds {after_header} bytes after the JSON header, but the inputs' "
            f"binary_data_size add up to {total}",
            code="bad_body_size",
        )
    return blobs


def json_values(tensor: TensorInfo, n: int, data: object) -> np.ndarray:
    """An input's JSON ``data`` (flat or nested) as ``tensor``'s dtype, ``[n, *frame]``:
    400 for values that are not numbers of its kind, out of its range, or too few or
    too many."""
    what = f"input {tensor.name!r}"
    if not isinstance(data, list):
        raise _bad(f"{what}: 'data' must be a list of numbers (flat or nested)")
    try:
        values = np.array(data)
    except (ValueError, TypeError, OverflowError):
        raise _bad(f"{what}: 'data' must be a list of numbers, nested evenly") from None
    integer = tensor.dtype.kind in "iu"
    if values.dtype.kind not in ("iu" if integer else "iuf"):
        kind = "integers" if integer else "numbers"
        raise _bad(f"{what}: 'data' must hold only {kind} for {tensor.datatype}", code="bad_values")
    count = n * math.prod(tensor.frame_shape)
    if values.size != count:
        raise _bad(
            f"{what}: 'data' holds {values.size} values; shape "
            f"{[n, *tensor.frame_shape]} needs {count}",
            code="bad_input_size",
        )
    if integer and values.size:
        limits = np.iinfo(tensor.dtype)  # type: ignore[type-var]  # an integer dtype here
        if values.min() < limits.min or values.max() > limits.max:
            raise _bad(
                f"{what}: {tensor.datatype} values are {limits.min}..{limits.max}",
                code="bad_values",
            )
    return values.astype(tensor.dtype).reshape((n, *tensor.frame_shape))


@dataclass(frozen=True)
class EncodedResponse:
    """The JSON (the whole body, or the header when ``payload`` follows it)."""

    json: bytes
    payload: memoryview | None  # the output's bytes, viewed on the array (no copy)


def encode_response(
    contract: Contract, request: InferRequest, outputs: np.ndarray
) -> EncodedResponse:
    """The answer to ``request``: its output as JSON ``data`` or, when asked for, as bytes
    after the JSON (``binary_data_size``)."""
    output = contract.output
    described: dict[str, Any] = {
        "name": output.name,
        "datatype": output.datatype,
        "shape": list(outputs.shape),
    }
    payload = None
    if request.binary_outputs:
        payload = np.ascontiguousarray(outputs, dtype=output.dtype).data.cast("B")
        described["parameters"] = {"binary_data_size": payload.nbytes}
    else:
        described["data"] = outputs.ravel().tolist()
    body: dict[str, Any] = {"model_name": contract.model_id, "model_version": contract.version}
    if request.id is not None:
        body["id"] = request.id
    body["outputs"] = [described]
    text = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    return EncodedResponse(text, payload)


def _input(index: int, item: object) -> RequestedInput:
    what = f"inputs[{index}]"
    if not isinstance(item, dict):
        raise _bad(f"{what} must be an object with name, datatype, shape")
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    if not isinstance(name, str) or not isinstance(datatype, str):
        raise _bad(f"{what} must have a string 'name' and 'datatype'")
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise _bad(f"{what} ({name[:64]!r}): 'shape' must be a list of integers")
    parameters = _object(item.get("parameters"), f"{what}.parameters")
    _refuse_unsupported(parameters, what)
    size = parameters.get("binary_data_size")
    has_data = "data" in item
    if size is None and not has_data:
        raise _bad(f"{what} ({name[:64]!r}) has neither 'data' nor binary_data_size")
    if size is not None and (has_data or not _is_int(size) or size < 0):
        raise _bad(
            f"{what} ({name[:64]!r}): binary_data_size must be a non-negative integer, "
            "and the input then has no 'data'"
        )
    declared = DeclaredTensor(name, datatype, tuple(shape))
    return RequestedInput(declared, size, item.get("data"))


def _refuse_unsupported(parameters: Mapping[str, Any], what: str) -> None:
    if "shared_memory_region" in parameters:
        raise _bad(f"{what}: shared memory is not supported: send the tensor in the body")


def _object(value: object, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{what} must be a JSON object")
    return value


def _flag(parameters: Mapping[str, Any], key: str, what: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise _bad(f"{what}.{key} must be true or false")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(message: str, *, code: str = "bad_input") -> RequestError:
    return RequestError(400, code, message)


# --- reading and writing ------------------------------------------------------------------


@dataclass(frozen=True)
class RequestHeader:
    """A request read up to its tensors' bytes: its JSON, parsed, and that JSON's length
    when the binary extension's header gave it (None: the body is all JSON)."""

    request: InferRequest
    length: int | None


def body_length(request: web.Request) -> int | None:
    """The body's length as it is read: ``Content-Length``, unless the body is chunked or
    compressed (aiohttp decodes gzip and deflate as it reads, and the protocol's lengths
    count decoded bytes; ``tritonclient`` compresses on request): then unknown."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    return request.content_length if encoding == "identity" else None


async def read_header(request: web.Request, limit: int) -> RequestHeader:
    """The request's JSON, at most ``limit`` bytes (413 past it), parsed; nothing after it
    is read."""
    size = body_length(request)
    length = header_length(request.headers.get(HEADER_LENGTH), size)
    what = "the JSON body" if length is None else "the JSON header"
    text = await _read_text(request.content, size if length is None else length, limit, what)
    parsed = parse_request(parse_json(text, "the request"))
    if length is None and any(i.binary_size is not None for i in parsed.inputs):
        raise _bad(
            f"inputs with binary_data_size need the {HEADER_LENGTH} header",
            code="bad_header_length",
        )
    return RequestHeader(parsed, length)


async def read_tensors(
    request: web.Request, header: RequestHeader, contract: Contract, n: int
) -> dict[str, memoryview]:
    """Each input's bytes by name, once the declared sizes passed :func:`binary_sizes`:
    the blobs read into one buffer sized for them and viewed per input (no copy), the
    JSON ``data`` converted. 400 for a body that ends sooner or runs on."""
    size = body_length(request)
    after = None if header.length is None or size is None else size - header.length
    blobs = binary_sizes(header.request, contract, n, 0 if header.length is None else after)
    view = memoryview(await _read_exactly(request.content, sum(s for _, s in blobs), "the tensors"))
    if size is None and await request.content.read(1):
        raise _bad("the body runs on past the tensors it declares", code="bad_body_size")
    tensors: dict[str, memoryview] = {}
    offset = 0
    for name, blob in blobs:
        tensors[name] = view[offset : offset + blob]
        offset += blob
    for item in header.request.inputs:
        if item.binary_size is None:
            name = item.declared.name
            tensor = contract.visual if name == contract.visual.name else contract.audio
            tensors[name] = json_values(tensor, n, item.data).data.cast("B")
    return tensors


async def _read_text(stream: StreamReader, size: int | None, limit: int, what: str) -> bytes:
    """``size`` bytes of JSON (None: to the body's end), at most ``limit`` (413 past it;
    400 when the body ends sooner). Kept as the chunks arrive and joined once, so nothing
    is held for bytes a client only declared."""
    if size is not None and size > limit:
        raise RequestError(413, "body_too_large", f"{what} is {size} bytes; at most {limit}")
    wanted = limit + 1 if size is None else size
    chunks: list[bytes] = []
    got = 0
    while got < wanted:
        chunk = await stream.read(wanted - got)
        if not chunk:
            if size is None:
                break
            raise _bad(f"the body ended {size - got} bytes short in {what}", code="bad_body_size")
        chunks.append(chunk)
        got += len(chunk)
    if got > limit:
        raise RequestError(413, "body_too_large", f"{what} is over the limit of {limit} bytes")
    return b"".join(chunks)


async def _read_exactly(stream: StreamReader, size: int, what: str) -> bytearray:
    """Exactly ``size`` bytes (checked against the contract before: at most the largest
    request's) into one buffer allocated for them (400 when the body ends sooner): one
    copy from the socket's chunks, none after."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    filled = 0
    while filled < size:
        chunk = await stream.read(size - filled)
        if not chunk:
            raise _bad(
                f"the body ended {size - filled} bytes short in {what}", code="bad_body_size"
            )
        view[filled : filled + len(chunk)] = chunk
        filled += len(chunk)
    return buffer


async def send_response(
    request: web.Request, contract: Contract, parsed: InferRequest, outputs: np.ndarray
) -> web.StreamResponse:
    """The answer (:func:`encode_response`): all JSON, or the JSON then the output's bytes,
    written from the array's buffer."""
    encoded = encode_response(contract, parsed, outputs)
    response = web.StreamResponse()
    size = len(encoded.json)
    if encoded.payload is None:
        response.content_type = "application/json"
    else:
        response.content_type = "application/octet-stream"
        response.headers[HEADER_LENGTH] = str(size)
        size += encoded.payload.nbytes
    response.content_length = size
    await response.prepare(request)
    for part in (memoryview(encoded.json), encoded.payload):
        # Megabytes: written in slices so the transport's flow control paces us.
        for start in range(0, 0 if part is None else part.nbytes, _WRITE_CHUNK):
            assert part is not None
            await response.write(part[start : start + _WRITE_CHUNK])
    await response.write_eof()
    return response
