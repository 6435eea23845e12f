"""The tensor doors' wire code against protobuf's own parser and serialiser.

A request split by :class:`~web.inference.grpc_wire.Splitter` must read exactly as
``FromString`` reads the whole message (fields repeated, given twice, out of order,
unknown, empty; typed contents instead of raw; every truncation of a message), with its
tensors left as views of the bytes; a response written around the output array must
parse, and serialise, as the one protobuf builds. The front's model scan, which walks
with the same walker, is checked in ``tests/test_cluster_grpc.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from google.protobuf.message import DecodeError, Message

from web.errors import RequestError
from web.inference import grpc_wire
from web.inference.grpc_wire import MAX_WALKED_FIELDS, Split, Splitter, delimited, varint
from web.inference.oip_grpc import infer_response
from web.inference.protos import grpc_service_pb2 as oip
from web.inference.protos import inference_service_pb2 as seed
from web.inference.seed_grpc import batch_response

INFER = Splitter(oip.ModelInferRequest, "raw_input_contents")
BATCH = Splitter(seed.InferBatchRequest, "visual_frames", "audio_features")


def _key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def _unknown_fields() -> bytes:
    """Fields of every wire type that neither message has, and raw_input_contents' and
    visual_frames' numbers as varints (another wire type: unknown to protobuf too)."""
    return (
        _key(50, 0) + varint(2**63)
        + _key(51, 1) + bytes(range(8))
        + _key(52, 5) + bytes(range(4))
        + _key(900, 2) + varint(3) + b"xyz"
        + _key(7, 0) + varint(5)
        + _key(2, 0) + varint(6)
    )  # fmt: skip


def _tritonclient_request() -> oip.ModelInferRequest:
    request = oip.ModelInferRequest(model_name="alice", model_version="float", id="r1")
    request.parameters["priority"].int64_param = 3
    request.inputs.add(name="visual", datatype="FP32", shape=[1, 6, 4, 4])
    request.inputs.add(name="audio", datatype="FP32", shape=[1, 2])
    request.outputs.add(name="output")
    request.raw_input_contents.extend([bytes(range(96)) * 4, b"\x01" * 8])
    return request


def _infer_requests() -> dict[str, bytes]:
    whole = _tritonclient_request()
    first = whole.SerializeToString()
    tensors = oip.ModelInferRequest(raw_input_contents=[b"\x07" * 33, b""]).SerializeToString()
    typed = oip.ModelInferRequest(model_name="alice", id="typed")
    typed.inputs.add(name="visual", datatype="FP32").contents.fp32_contents.extend([1.5, 2.0])
    no_name = oip.ModelInferRequest(id="r2", raw_input_contents=[b"x"]).SerializeToString()
    return {
        "as tritonclient sends it": first,
        "the tensors first": tensors + oip.ModelInferRequest(model_name="bob").SerializeToString(),
        "everything twice": first + first,
        "a second name, more tensors": first + no_name + tensors,
        "unknown fields between": _unknown_fields() + first + _unknown_fields(),
        "empty tensors": oip.ModelInferRequest(raw_input_contents=[b"", b""]).SerializeToString(),
        "typed contents": typed.SerializeToString(),
        "nothing": b"",
        "tensors only": tensors,
    }


def _batch_requests() -> dict[str, bytes]:
    def batch(**fields: object) -> bytes:
        return seed.InferBatchRequest(**fields).SerializeToString()

    first = batch(model_id="alice", visual_frames=b"\x01" * 40, audio_features=b"\x02" * 12)
    return {
        "as a seed client sends it": first + batch(batch_size=4),
        "visual twice: the last wins": first + batch(visual_frames=b"\x03" * 7, batch_size=2),
        "fields out of order": batch(batch_size=1) + batch(audio_features=b"a") + first,
        "an empty last visual": first + _key(2, 2) + varint(0),
        "no audio": batch(model_id="alice", visual_frames=b"v", batch_size=1),
        "unknown fields between": _unknown_fields() + first + _unknown_fields(),
        "nothing": b"",
    }


def _joined(split: Split[Message], fill: Callable[[Message, Split[Message]], None]) -> Message:
    """A copy of the split message with its views put back as protobuf holds them."""
    message = type(split.message)()
    message.CopyFrom(split.message)
    fill(message, split)
    return message


def _fill_infer(message: Message, split: Split[Message]) -> None:
    assert isinstance(message, oip.ModelInferRequest)
    message.raw_input_contents.extend(bytes(v) for v in split.repeated("raw_input_contents"))


def _fill_batch(message: Message, split: Split[Message]) -> None:
    assert isinstance(message, seed.InferBatchRequest)
    message.visual_frames = bytes(split.last("visual_frames"))
    message.audio_features = bytes(split.last("audio_features"))


def _assert_reads_as_protobuf(
    splitter: Splitter[Message], message: type[Message], wire: bytes, fill: Callable[..., None]
) -> Split[Message]:
    expected = message.FromString(wire)
    split = splitter(wire)
    got = _joined(split, fill)
    assert got == expected
    # Unknown fields too, in their order: the serialised forms agree byte for byte.
    assert got.SerializeToString() == expected.SerializeToString()
    return split


@pytest.mark.parametrize("case", list(_infer_requests()))
def test_a_split_infer_request_reads_as_protobuf_reads_it(case: str) -> None:
    wire = _infer_requests()[case]
    split = _assert_reads_as_protobuf(INFER, oip.ModelInferRequest, wire, _fill_infer)
    assert not split.message.raw_input_contents
    for view in split.repeated("raw_input_contents"):
        assert view.obj is wire  # a view of the bytes grpc handed over, not a copy


@pytest.mark.parametrize("case", list(_batch_requests()))
def test_a_split_batch_request_reads_as_protobuf_reads_it(case: str) -> None:
    wire = _batch_requests()[case]
    split = _assert_reads_as_protobuf(BATCH, seed.InferBatchRequest, wire, _fill_batch)
    for name in ("visual_frames", "audio_features"):
        assert getattr(split.message, name) == b""
        assert all(view.obj is wire for view in split.repeated(name))


def test_the_big_fields_are_found_where_tritonclient_puts_them() -> None:
    wire = _tritonclient_request().SerializeToString()
    split = INFER(wire)
    assert [bytes(v) for v in split.repeated("raw_input_contents")] == [
        bytes(range(96)) * 4,
        b"\x01" * 8,
    ]
    assert split.message.model_name == "alice"
    assert [t.name for t in split.message.inputs] == ["visual", "audio"]
    assert split.message.parameters["priority"].int64_param == 3


def test_a_message_of_very_many_fields_is_parsed_whole_with_the_same_result() -> None:
    many = b"".join(_key(60, 0) + varint(i) for i in range(MAX_WALKED_FIELDS + 10))
    wire = many + _tritonclient_request().SerializeToString() + many
    _assert_reads_as_protobuf(INFER, oip.ModelInferRequest, wire, _fill_infer)
    batch = seed.InferBatchRequest(model_id="a", visual_frames=b"v", batch_size=1)
    wire = many + batch.SerializeToString()
    split = _assert_reads_as_protobuf(BATCH, seed.InferBatchRequest, wire, _fill_batch)
    assert bytes(split.last("visual_frames")) == b"v"


@pytest.mark.parametrize(
    ("splitter", "message", "fill"),
    [
        (INFER, oip.ModelInferRequest, _fill_infer),
        (BATCH, seed.InferBatchRequest, _fill_batch),
    ],
)
def test_every_truncation_is_refused_or_read_as_protobuf_reads_it(
    splitter: Splitter[Message], message: type[Message], fill: Callable[..., None]
) -> None:
    if message is oip.ModelInferRequest:
        whole = _tritonclient_request().SerializeToString()
    else:
        whole = _batch_requests()["as a seed client sends it"]
    refused = 0
    for cut in range(len(whole)):
        wire = whole[:cut]
        try:
            message.FromString(wire)
        except DecodeError:
            with pytest.raises(RequestError) as error:
                splitter(wire)
            assert error.value.status == 400
            assert error.value.code == "bad_message"
            assert f"the request is not a valid {message.DESCRIPTOR.name}: " in str(error.value)
            refused += 1
        else:  # cut between fields: a shorter message
            _assert_reads_as_protobuf(splitter, message, wire, fill)
    assert refused > len(whole) // 2


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        (_key(7, 2) + varint(10) + b"short", "field 7 runs past the end"),
        (_key(2, 2) + varint(2**40) + b"abc", "field 2 runs past the end"),
        (_key(7, 2) + varint(1) + b"x" + b"\x80", "a varint runs past the end"),
        (_key(7, 6) + b"\x00", "wire type 6"),
        (_key(1, 2) + varint(2) + b"\xff\xfe" + _key(7, 2) + varint(1) + b"x", "Error parsing"),
        (b"\x02\x00", "field number 0"),
    ],
)
def test_a_malformed_request_is_a_bad_message(wire: bytes, why: str) -> None:
    with pytest.raises(DecodeError):
        oip.ModelInferRequest.FromString(wire)
    with pytest.raises(RequestError, match=why) as error:
        INFER(wire)
    assert (error.value.status, error.value.code) == (400, "bad_message")


def test_groups_are_refused_as_the_front_refuses_them() -> None:
    # protobuf walks proto2's groups as unknown fields; no proto3 sender writes one, and
    # the walker refuses them (the front's scan, tests/test_cluster_grpc.py, alike).
    wire = _key(60, 3) + _key(60, 4) + _tritonclient_request().SerializeToString()
    assert oip.ModelInferRequest.FromString(wire).model_name == "alice"
    with pytest.raises(RequestError, match="wire type 3"):
        INFER(wire)


def test_only_bytes_fields_can_be_left_as_views() -> None:
    with pytest.raises(TypeError, match="model_name is not a bytes field"):
        Splitter(oip.ModelInferRequest, "model_name")


# -- responses -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
@pytest.mark.parametrize("frames", [1, 3])
def test_an_infer_response_is_what_protobuf_would_write(dtype: type, frames: int) -> None:
    outputs = np.random.default_rng(frames).random((frames, 3, 5, 7)).astype(dtype) * 9
    head = oip.ModelInferResponse(model_name="alice", model_version="float", id="r1")
    head.outputs.add(name="output", datatype="FP32", shape=[frames, 3, 5, 7])
    expected = oip.ModelInferResponse()
    expected.CopyFrom(head)
    expected.raw_output_contents.append(outputs.tobytes())

    parts = infer_response(head, outputs)
    wire = b"".join(parts)
    assert wire == expected.SerializeToString()
    assert oip.ModelInferResponse.FromString(wire) == expected
    assert any(isinstance(p, memoryview) and p.obj is outputs for p in parts)  # not copied
    # On a stream, wrapped as ModelStreamInferResponse.infer_response (field 2).
    stream = oip.ModelStreamInferResponse.FromString(b"".join(delimited(2, parts)))
    assert stream == oip.ModelStreamInferResponse(infer_response=expected)


def test_a_response_from_an_array_that_is_not_contiguous_is_its_row_major_bytes() -> None:
    outputs = np.arange(2 * 3 * 4, dtype=np.float32).reshape(4, 3, 2).transpose(2, 1, 0)
    wire = b"".join(infer_response(oip.ModelInferResponse(), outputs))
    (raw,) = oip.ModelInferResponse.FromString(wire).raw_output_contents
    assert raw == outputs.tobytes()


@pytest.mark.parametrize("frames", [1, 4])
def test_a_batch_response_is_what_protobuf_would_write(frames: int) -> None:
    outputs = np.random.default_rng(frames).random((frames, 3, 6, 6), dtype=np.float32)
    rest = seed.InferBatchResponse(inference_time_ms=12.5, success=True, gpu_id=-1, device="cpu:0")
    expected = seed.InferBatchResponse(
        outputs=[seed.RawMouthRegion(data=frame.tobytes()) for frame in outputs],
        inference_time_ms=12.5,
        success=True,
        gpu_id=-1,
        device="cpu:0",
    )
    wire = batch_response(rest, outputs)
    assert wire == expected.SerializeToString()
    assert seed.InferBatchResponse.FromString(wire) == expected


def test_varints_and_delimited_fields_encode_as_protobuf_does() -> None:
    assert varint(0) == b"\x00"
    for value in (1, 127, 128, 300, 2**31, 2**64 - 1):
        # ModelStats.frames is field 4, a uint64: its key, then the value as a varint
        assert seed.ModelStats(frames=value).SerializeToString() == _key(4, 0) + varint(value)
    big = b"\x05" * 200  # a length of two varint bytes
    wire = b"".join(delimited(7, [big[:50], memoryview(big)[50:]]))
    assert wire == oip.ModelInferRequest(raw_input_contents=[big]).SerializeToString()
    assert grpc_wire.array_bytes(np.zeros((2, 2), np.uint8)).tobytes() == bytes(4)
