"""The Open Inference Protocol v2 over gRPC, called by Triton's own clients.

``tritonclient.grpc`` (sync, run in a thread: the server shares the test's event loop)
and ``tritonclient.grpc.aio`` against the in-process app and listener of
``tests/grpc_served.py``; one test starts ``lipstream serve`` itself. Hand-made requests
(typed contents, wrong byte sizes) go through the stub Triton generated from its own
proto. The committed protobuf modules are checked against what ``scripts/gen_protos.sh``
makes, and our proto against Triton's field by field.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from google.protobuf.descriptor import Descriptor, EnumDescriptor
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inference_core.adapter.lipsync import LipSyncAdapter
from inference_core.adapter.spec import AdapterSpec
from inference_core.avatars.exceptions import AvatarNotFoundError
from inference_core.exceptions import (
    CapacityError,
    DeadlineExceededError,
    ModelInputError,
    ModelInUseError,
    ModelLoadError,
    ModelOutOfMemoryError,
    QueueFullError,
    ShuttingDownError,
)
from inference_core.serving.frame_request import FrameRequest
from inference_core.serving.loaded_model import LoadedModel
from tests.grpc_served import (
    AUDIO,
    AUDIO_NAME,
    MODEL,
    OUTPUT_NAME,
    REGION,
    VISUAL,
    VISUAL_NAME,
    Served,
    float_inputs,
    make_avatar,
    served,
    settings_for,
    uint8_inputs,
)
from tests.live_calls import until
from tests.server_process import lipstream_serve
from web.cluster import worker as worker_module
from web.errors import RequestError, classify
from web.inference.grpc_server import message_limits
from web.inference.grpc_status import status_for
from web.inference.protos import grpc_service_pb2

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 60.0


@pytest.fixture
def avatar_root(tmp_path: Path) -> Path:
    root = tmp_path / "avatars"
    make_avatar(root)
    return root


@pytest.fixture
async def server(avatar_root: Path) -> AsyncIterator[Served]:
    async with served(settings_for(avatar_root)) as running:
        yield running


@pytest.fixture
async def client(server: Served) -> AsyncIterator[triton_aio.InferenceServerClient]:
    aio = triton_aio.InferenceServerClient(server.address)
    try:
        yield aio
    finally:
        await aio.close()


@contextmanager
def sync_client(address: str) -> Iterator[triton.InferenceServerClient]:
    blocking = triton.InferenceServerClient(address)
    try:
        yield blocking
    finally:
        blocking.close()


def float_request(
    module: Any, visual: np.ndarray, audio: np.ndarray
) -> list[Any]:  # tritonclient's InferInput of ``module`` (grpc or grpc.aio)
    inputs = [
        module.InferInput(VISUAL_NAME, list(visual.shape), "FP32"),
        module.InferInput(AUDIO_NAME, list(audio.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(visual)
    inputs[1].set_data_from_numpy(audio)
    return inputs


def uint8_request(module: Any, regions: np.ndarray, audio: np.ndarray) -> list[Any]:
    inputs = [
        module.InferInput(AUDIO_NAME, list(audio.shape), "FP32"),  # any order: by name
        module.InferInput(VISUAL_NAME, list(regions.shape), "UINT8"),
    ]
    inputs[0].set_data_from_numpy(audio)
    inputs[1].set_data_from_numpy(regions)
    return inputs


def onnx_float(root: Path, visual: np.ndarray, audio: np.ndarray) -> np.ndarray:
    """What a plain onnxruntime session makes of the model's own float inputs."""
    session = ort.InferenceSession(
        str(root / MODEL / "lipsync.onnx"), providers=["CPUExecutionProvider"]
    )
    (output,) = session.run([OUTPUT_NAME], {VISUAL_NAME: visual, AUDIO_NAME: audio})
    assert isinstance(output, np.ndarray)
    return output


def serving_uint8(root: Path, regions: np.ndarray, audio: np.ndarray) -> np.ndarray:
    """What the serving graph makes of BGR regions (as tests/test_infer_api.py checks)."""
    adapter = LipSyncAdapter.from_path(root / MODEL / "lipsync.onnx", AdapterSpec())
    return adapter.run(regions, audio)


def status_of(error: InferenceServerException) -> str:
    return str(error.status())


# -- the protobuf code -----------------------------------------------------------------------


def test_the_committed_modules_are_what_the_script_generates(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen_protos.sh"), str(tmp_path)],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
    )
    protos = ROOT / "web" / "inference" / "protos"
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "grpc_service_pb2.py",
        "grpc_service_pb2.pyi",
        "inference_service_pb2.py",
        "inference_service_pb2.pyi",
    ]
    for name in names:
        assert (tmp_path / name).read_bytes() == (protos / name).read_bytes(), (
            f"{name} differs from what scripts/gen_protos.sh makes: run it and commit"
        )


def test_our_proto_is_field_compatible_with_tritons() -> None:
    """Every message, field, enum value and method of ours is Triton's, number for number
    (and our modules share no descriptor pool with tritonclient's)."""
    ours = grpc_service_pb2.DESCRIPTOR
    theirs = service_pb2.DESCRIPTOR.pool
    assert ours.pool is not theirs
    assert model_config_pb2.DESCRIPTOR.pool is theirs

    def same_message(mine: Descriptor) -> None:
        other = theirs.FindMessageTypeByName(mine.full_name)
        for field in mine.fields:
            match = other.fields_by_name[field.name]
            assert (field.number, field.type, field.is_repeated) == (
                match.number,
                match.type,
                match.is_repeated,
            ), field.full_name
            if field.message_type is not None:
                assert field.message_type.full_name == match.message_type.full_name
            if field.enum_type is not None:
                assert field.enum_type.full_name == match.enum_type.full_name
        for nested in mine.nested_types:
            same_message(nested)
        for enum in mine.enum_types:
            same_enum(enum)

    def same_enum(mine: EnumDescriptor) -> None:
        other = theirs.FindEnumTypeByName(mine.full_name)
        assert {v.name: v.number for v in mine.values}.items() <= {
            v.name: v.number for v in other.values
        }.items()

    for message in ours.message_types_by_name.values():
        same_message(message)
    for enum in ours.enum_types_by_name.values():
        same_enum(enum)
    (service,) = ours.services_by_name.values()
    other_service = theirs.FindServiceByName(service.full_name)
    assert service.full_name == "inference.GRPCInferenceService"
    assert len(service.methods) == 12
    for method in service.methods:
        match = other_service.methods_by_name[method.name]
        assert method.input_type.full_name == match.input_type.full_name
        assert method.output_type.full_name == match.output_type.full_name
        assert (method.client_streaming, method.server_streaming) == (
            match.client_streaming,
            match.server_streaming,
        )


def test_message_limits_fit_the_largest_request_and_no_more() -> None:
    limits = message_limits()
    frame_in = (6 * 320 * 320 + 32 * 16 * 16) * 4
    assert frame_in == 2_490_368
    assert 32 * frame_in < limits.receive_bytes <= 32 * frame_in + 64 * 1024  # ≈ 79.8 MB
    assert 32 * 3 * 320 * 320 * 4 < limits.send_bytes <= 32 * 3 * 320 * 320 * 4 + 64 * 1024


# -- health, metadata, configuration --------------------------------------------------------


async def test_health_and_metadata_through_the_sync_client(server: Served) -> None:
    def calls() -> dict[str, Any]:
        with sync_client(server.address) as c:
            return {
                "live": c.is_server_live(),
                "ready": c.is_server_ready(),
                "model_ready_before": c.is_model_ready(MODEL),
                "unknown_ready": c.is_model_ready("nobody"),
                "bad_version_ready": c.is_model_ready(MODEL, "7"),
                "server": c.get_server_metadata(as_json=True),
                "float": c.get_model_metadata(MODEL, as_json=True),
                "uint8": c.get_model_metadata(MODEL, "uint8", as_json=True),
                "config": c.get_model_config(MODEL, as_json=True)["config"],
                "uint8_config": c.get_model_config(MODEL, "uint8", as_json=True)["config"],
            }

    got = await asyncio.to_thread(calls)
    assert got["live"]
    assert got["ready"]
    assert got["model_ready_before"] is False  # registered, not loaded yet: metadata loads nothing
    assert got["unknown_ready"] is False  # an answer, not an error
    assert got["bad_version_ready"] is False
    assert got["server"]["name"] == "lipstream"
    assert {"binary_tensor_data", "model_repository", "statistics"} <= set(
        got["server"]["extensions"]
    )
    meta = got["float"]
    assert meta["name"] == MODEL
    assert meta["versions"] == ["float", "uint8"]
    assert meta["platform"] == "onnxruntime_onnx"
    # MessageToJson writes int64 as strings
    shapes = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]}
    assert shapes == {VISUAL_NAME: ("FP32", [-1, *VISUAL]), AUDIO_NAME: ("FP32", [-1, *AUDIO])}
    (output,) = meta["outputs"]
    assert (output["name"], output["datatype"]) == (OUTPUT_NAME, "FP32")
    uint8 = {
        t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in got["uint8"]["inputs"]
    }
    assert uint8[VISUAL_NAME] == ("UINT8", [-1, *REGION])
    assert got["uint8"]["outputs"][0]["datatype"] == "UINT8"
    config = got["config"]
    assert config["name"] == MODEL
    assert config["max_batch_size"] == 32
    inputs = {i["name"]: i for i in config["input"]}
    assert inputs[VISUAL_NAME]["data_type"] == "TYPE_FP32"
    assert inputs[VISUAL_NAME]["format"] == "FORMAT_NCHW"
    assert [int(d) for d in inputs[VISUAL_NAME]["dims"]] == list(VISUAL)
    assert [int(d) for d in inputs[AUDIO_NAME]["dims"]] == list(AUDIO)
    assert config["output"][0]["data_type"] == "TYPE_FP32"
    uint8_inputs_config = {i["name"]: i for i in got["uint8_config"]["input"]}
    assert uint8_inputs_config[VISUAL_NAME]["format"] == "FORMAT_NHWC"
    assert uint8_inputs_config[VISUAL_NAME]["data_type"] == "TYPE_UINT8"


# -- inference -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 8])
async def test_infer_matches_onnxruntime_float_and_uint8(
    client: triton_aio.InferenceServerClient, avatar_root: Path, n: int
) -> None:
    visual, audio = float_inputs(n, seed=n)
    wanted = [triton_aio.InferRequestedOutput(OUTPUT_NAME)]
    result = await client.infer(
        MODEL, float_request(triton_aio, visual, audio), outputs=wanted, request_id=f"f{n}"
    )
    response = result.get_response()
    assert (response.id, response.model_version) == (f"f{n}", "float")
    out = result.as_numpy(OUTPUT_NAME)
    assert out is not None
    assert out.dtype == np.float32
    assert out.shape == (n, 3, 320, 320)
    np.testing.assert_allclose(out, onnx_float(avatar_root, visual, audio), atol=1e-5)

    regions, audio8 = uint8_inputs(n, seed=n)
    faces = (await client.infer(MODEL, uint8_request(triton_aio, regions, audio8))).as_numpy(
        OUTPUT_NAME
    )
    assert faces is not None
    assert faces.shape == (n, *REGION)
    np.testing.assert_array_equal(faces, serving_uint8(avatar_root, regions, audio8))
    assert await client.is_model_ready(MODEL)  # loaded by the first request


async def test_the_sync_client_infers_too(server: Served, avatar_root: Path) -> None:
    visual, audio = float_inputs(2, seed=5)

    def infer() -> Any:
        with sync_client(server.address) as c:
            inputs = float_request(triton, visual, audio)
            return c.infer(MODEL, inputs, model_version="float").as_numpy(OUTPUT_NAME)

    out = await asyncio.to_thread(infer)
    assert out is not None
    np.testing.assert_allclose(out, onnx_float(avatar_root, visual, audio), atol=1e-5)


async def test_typed_contents_are_accepted_as_raw_ones_are(
    server: Served, avatar_root: Path
) -> None:
    visual, audio = float_inputs(1, seed=9)
    request = service_pb2.ModelInferRequest(model_name=MODEL, id="typed")
    v = request.inputs.add(name=VISUAL_NAME, datatype="FP32", shape=visual.shape)
    v.contents.fp32_contents.extend(visual.ravel().tolist())
    a = request.inputs.add(name=AUDIO_NAME, datatype="FP32", shape=audio.shape)
    a.contents.fp32_contents.extend(audio.ravel().tolist())
    regions, audio8 = uint8_inputs(1, seed=9)
    request8 = service_pb2.ModelInferRequest(model_name=MODEL, model_version="uint8")
    r = request8.inputs.add(name=VISUAL_NAME, datatype="UINT8", shape=regions.shape)
    r.contents.uint_contents.extend(regions.ravel().tolist())
    a8 = request8.inputs.add(name=AUDIO_NAME, datatype="FP32", shape=audio8.shape)
    a8.contents.fp32_contents.extend(audio8.ravel().tolist())
    async with _channel(server.address) as stub:
        response = await stub.ModelInfer(request)
        response8 = await stub.ModelInfer(request8)
    assert response.id == "typed"
    out = np.frombuffer(response.raw_output_contents[0], "<f4").reshape(1, 3, 320, 320)
    np.testing.assert_allclose(out, onnx_float(avatar_root, visual, audio), atol=1e-5)
    faces = np.frombuffer(response8.raw_output_contents[0], np.uint8).reshape(1, *REGION)
    np.testing.assert_array_equal(faces, serving_uint8(avatar_root, regions, audio8))


async def test_a_stream_answers_every_request_by_id_and_goes_on_after_an_error(
    client: triton_aio.InferenceServerClient, avatar_root: Path
) -> None:
    batches = {f"r{i}": float_inputs(1 + i % 3, seed=20 + i) for i in range(6)}
    bad_visual = np.zeros((1, 6, 32, 32), np.float32)  # the wrong frame size

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i, (request_id, (visual, audio)) in enumerate(batches.items()):
            if i == 3:  # mid-stream: the stream must go on after it
                yield {
                    "model_name": MODEL,
                    "inputs": float_request(triton_aio, bad_visual, audio[:1]),
                    "request_id": "bad",
                }
            yield {
                "model_name": MODEL,
                "inputs": float_request(triton_aio, visual, audio),
                "request_id": request_id,
            }

    answers: dict[str, np.ndarray] = {}
    errors: list[str] = []
    async with asyncio.timeout(TIMEOUT_S):
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                errors.append(error.message())
                continue
            out = result.as_numpy(OUTPUT_NAME)
            assert out is not None
            answers[result.get_response().id] = out
    assert len(errors) == 1
    assert "must have shape [-1,6,320,320], got [1, 6, 32, 32]" in errors[0]
    assert sorted(answers) == sorted(batches)
    for request_id, (visual, audio) in batches.items():
        np.testing.assert_allclose(
            answers[request_id], onnx_float(avatar_root, visual, audio), atol=1e-5
        )


# -- the repository and statistics ----------------------------------------------------------


async def test_load_unload_and_statistics_through_the_registry(avatar_root: Path) -> None:
    settings = settings_for(avatar_root, registry={"load_on_infer": False})
    async with served(settings) as server:
        client = triton_aio.InferenceServerClient(server.address)
        try:
            visual, audio = float_inputs(2)
            with pytest.raises(InferenceServerException) as refused:
                await client.infer(MODEL, float_request(triton_aio, visual, audio))
            assert status_of(refused.value) == "StatusCode.UNAVAILABLE"
            assert "is not loaded and registry.load_on_infer is false" in str(
                refused.value.message()
            )
            index = await client.get_model_repository_index(as_json=True)
            assert index["models"] == [
                {"name": MODEL, "state": "UNAVAILABLE", "reason": "not loaded"}
            ]

            await client.load_model(MODEL)
            assert await client.is_model_ready(MODEL)
            index = await client.get_model_repository_index(as_json=True)
            assert index["models"] == [{"name": MODEL, "state": "READY"}]
            before = _statistics(await client.get_inference_statistics(MODEL, as_json=True))

            for n in (1, 2, 3):
                await client.infer(MODEL, float_request(triton_aio, *float_inputs(n, seed=n)))
            after = _statistics(await client.get_inference_statistics(MODEL, as_json=True))
            assert after["success"] == before["success"] + 3  # requests
            assert after["inference_count"] == before["inference_count"] + 6  # frames
            assert after["execution_count"] > before["execution_count"]  # batches
            assert after["compute_infer_count"] == after["inference_count"]  # per frame
            assert after["fail"] == before["fail"]
            assert after["last_inference"] > 0

            every = await client.get_inference_statistics(as_json=True)
            assert [m["name"] for m in every["model_stats"]] == [MODEL]

            await client.unload_model(MODEL)
            assert not await client.is_model_ready(MODEL)
            for call in (
                client.unload_model("nobody"),
                client.load_model("nobody"),
                client.get_inference_statistics("nobody"),
            ):
                with pytest.raises(InferenceServerException) as unknown:
                    await call
                assert status_of(unknown.value) == "StatusCode.NOT_FOUND"
        finally:
            await client.close()


async def test_load_on_a_device_and_admin_access(avatar_root: Path) -> None:
    settings = settings_for(avatar_root, server={"admin_token": "s3cret"})
    async with served(settings) as server, _channel(server.address) as stub:
        request = service_pb2.RepositoryModelLoadRequest(model_name=MODEL)
        request.parameters["device"].int64_param = 0
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.RepositoryModelLoad(request, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert not server.core.is_loaded(MODEL)
        token = (("authorization", "Bearer s3cret"),)
        await stub.RepositoryModelLoad(request, metadata=token)
        assert (await server.core.snapshot()).model(MODEL).device == "cpu:0"  # type: ignore[union-attr]

        request.parameters["device"].int64_param = 3
        with pytest.raises(grpc.aio.AioRpcError) as bad_device:
            await stub.RepositoryModelLoad(request, metadata=token)
        assert bad_device.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "device 3 does not exist" in str(bad_device.value.details())

        unload = service_pb2.RepositoryModelUnloadRequest(model_name=MODEL)
        with pytest.raises(grpc.aio.AioRpcError) as unauthenticated:
            await stub.RepositoryModelUnload(unload)
        assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await stub.RepositoryModelUnload(unload, metadata=token)
        assert not server.core.is_loaded(MODEL)


def _statistics(answer: dict[str, Any]) -> dict[str, int]:
    """One model's counters from get_inference_statistics(as_json=True) (uint64 as str)."""
    (model,) = answer["model_stats"]
    stats = model.get("inference_stats", {})

    def count(key: str) -> int:
        return int(stats.get(key, {}).get("count", 0))

    return {
        "success": count("success"),
        "fail": count("fail"),
        "compute_infer_count": count("compute_infer"),
        "inference_count": int(model.get("inference_count", 0)),
        "execution_count": int(model.get("execution_count", 0)),
        "last_inference": int(model.get("last_inference", 0)),
    }


# -- errors ----------------------------------------------------------------------------------


async def test_errors_come_back_as_the_status_that_says_what_went_wrong(
    client: triton_aio.InferenceServerClient, server: Served
) -> None:
    visual, audio = float_inputs(1)

    async def refused(call: Any) -> tuple[str, str]:
        with pytest.raises(InferenceServerException) as error:
            await call
        return status_of(error.value), str(error.value.message())

    wrong_shape = float_request(triton_aio, np.zeros((1, 6, 32, 32), np.float32), audio)
    code, message = await refused(client.infer(MODEL, wrong_shape))
    assert code == "StatusCode.INVALID_ARGUMENT"
    assert f"input '{VISUAL_NAME}'" in message

    wrong_dtype = [
        triton_aio.InferInput(VISUAL_NAME, list(visual.shape), "FP64"),
        triton_aio.InferInput(AUDIO_NAME, list(audio.shape), "FP32"),
    ]
    wrong_dtype[0].set_data_from_numpy(visual.astype(np.float64))
    wrong_dtype[1].set_data_from_numpy(audio)
    code, message = await refused(client.infer(MODEL, wrong_dtype))
    assert code == "StatusCode.INVALID_ARGUMENT"
    assert "must be FP32, got FP64" in message

    code, message = await refused(client.infer("nobody", float_request(triton_aio, visual, audio)))
    assert code == "StatusCode.NOT_FOUND"
    code, message = await refused(
        client.infer(MODEL, float_request(triton_aio, visual, audio), model_version="3")
    )
    assert code == "StatusCode.NOT_FOUND"
    assert "no version '3'" in message
    code, message = await refused(client.get_model_metadata("nobody"))
    assert code == "StatusCode.NOT_FOUND"
    code, message = await refused(
        client.infer(
            MODEL,
            float_request(triton_aio, visual, audio),
            outputs=[triton_aio.InferRequestedOutput("mask")],
        )
    )
    assert code == "StatusCode.INVALID_ARGUMENT"
    assert "one output, 'output'" in message

    # Byte sizes that disagree with the declared shapes: tritonclient never sends them,
    # so the request is made by hand and sent through Triton's own stub.
    short = service_pb2.ModelInferRequest(model_name=MODEL)
    short.inputs.add(name=VISUAL_NAME, datatype="FP32", shape=visual.shape)
    short.inputs.add(name=AUDIO_NAME, datatype="FP32", shape=audio.shape)
    short.raw_input_contents.extend([visual.tobytes()[:-4], audio.tobytes()])
    missing = service_pb2.ModelInferRequest()
    missing.CopyFrom(short)
    del missing.raw_input_contents[1]
    async with _channel(server.address) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as size:
            await stub.ModelInfer(short)
        assert size.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"input '{VISUAL_NAME}' must be {visual.nbytes} bytes" in str(size.value.details())
        with pytest.raises(grpc.aio.AioRpcError) as count:
            await stub.ModelInfer(missing)
        assert count.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "raw_input_contents holds 1 entries for 2 inputs" in str(count.value.details())
    # ... and the server still serves
    assert (await client.infer(MODEL, float_request(triton_aio, visual, audio))).as_numpy(
        OUTPUT_NAME
    ) is not None


async def test_a_request_that_does_not_parse_is_invalid_argument_and_ends_no_stream(
    server: Served,
) -> None:
    """ModelInfer and ModelStreamInfer read the wire bytes themselves
    (``web/inference/grpc_wire.py``): bytes that are no ModelInferRequest are refused as
    the checks refuse a bad request, and a stream answers them and goes on."""
    visual, audio = float_inputs(1)
    good = grpc_service_pb2.ModelInferRequest(model_name=MODEL, id="good")
    good.inputs.add(name=VISUAL_NAME, datatype="FP32", shape=visual.shape)
    good.inputs.add(name=AUDIO_NAME, datatype="FP32", shape=audio.shape)
    good.raw_input_contents.extend([visual.tobytes(), audio.tobytes()])
    cut = good.SerializeToString()[:-10]  # raw_input_contents[1] runs past the end
    limit = 2**31 - 1
    options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    async with grpc.aio.insecure_channel(server.address, options=options) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await infer(cut)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "the request is not a valid ModelInferRequest: field 7 runs past the end" in str(
            refused.value.details()
        )
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        call = stream(iter([cut, good.SerializeToString()]))
        answers = [grpc_service_pb2.ModelStreamInferResponse.FromString(a) async for a in call]
    assert len(answers) == 2
    failed = next(a for a in answers if a.error_message)
    assert "not a valid ModelInferRequest" in failed.error_message
    (served_answer,) = [a.infer_response for a in answers if not a.error_message]
    assert served_answer.id == "good"
    assert len(served_answer.raw_output_contents[0]) == 3 * 320 * 320 * 4


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ModelInputError("bad frame"), grpc.StatusCode.INVALID_ARGUMENT),
        (RequestError(413, "bad_body_size", "too long"), grpc.StatusCode.INVALID_ARGUMENT),
        (RequestError(401, "unauthorized", "token"), grpc.StatusCode.UNAUTHENTICATED),
        (RequestError(403, "forbidden", "local only"), grpc.StatusCode.PERMISSION_DENIED),
        (AvatarNotFoundError("no such avatar"), grpc.StatusCode.NOT_FOUND),
        (ModelInUseError("held by 2 calls"), grpc.StatusCode.FAILED_PRECONDITION),
        (QueueFullError("queue is full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (ModelOutOfMemoryError("out of memory"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (CapacityError("no room"), grpc.StatusCode.UNAVAILABLE),
        (ShuttingDownError("stopping"), grpc.StatusCode.UNAVAILABLE),
        (RequestError(503, "model_not_ready", "load it"), grpc.StatusCode.UNAVAILABLE),
        (DeadlineExceededError("too late"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (ModelLoadError("corrupt"), grpc.StatusCode.INTERNAL),
        (KeyError("a bug"), grpc.StatusCode.INTERNAL),
    ],
)
def test_one_table_maps_errors_to_status_codes(error: Exception, code: grpc.StatusCode) -> None:
    assert status_for(classify(error)) == code


class Gate:
    """Holds every batch of the model until opened: ``LoadedModel.run_batch`` patched on
    the class. ``entered`` is set once a batch is waiting at the gate."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        original = LoadedModel.run_batch

        def run_batch(model: LoadedModel, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
            self.entered.set()
            self.opened.wait(TIMEOUT_S)
            return original(model, requests)

        monkeypatch.setattr(LoadedModel, "run_batch", run_batch)


async def test_a_full_queue_is_resource_exhausted_and_the_queued_requests_succeed(
    avatar_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue_size = 3
    settings = settings_for(avatar_root, batching={"queue_size": queue_size, "max_batch_size": 1})
    async with served(settings) as server:
        client = triton_aio.InferenceServerClient(server.address)
        try:
            await client.load_model(MODEL)
            gate = Gate(monkeypatch)
            scheduler = server.core.schedulers[0]

            def infer(seed: int) -> asyncio.Task[Any]:
                inputs = float_request(triton_aio, *float_inputs(1, seed=seed))
                return asyncio.create_task(client.infer(MODEL, inputs), name=f"infer-{seed}")

            # One batch held running at the gate, then a full queue behind it.
            admitted = [infer(0)]
            await asyncio.to_thread(gate.entered.wait, TIMEOUT_S)
            admitted += [infer(seed) for seed in range(1, 1 + queue_size)]
            await until(lambda: scheduler.queue_depth == queue_size, "a full queue")
            # Every request now finds the queue full, whatever the order they arrive in.
            refused = await asyncio.gather(
                *(infer(seed) for seed in range(10, 18)), return_exceptions=True
            )
            gate.opened.set()
            results = await asyncio.gather(*admitted)
        finally:
            await client.close()
    assert len(refused) == 8
    for error in refused:
        assert isinstance(error, InferenceServerException)
        assert status_of(error) == "StatusCode.RESOURCE_EXHAUSTED"
        assert "queue is full" in str(error.message())
    assert all(r.as_numpy(OUTPUT_NAME) is not None for r in results)


#: How long the queue test holds the worker with a frame queued behind it: the wait the
#: statistics must show (measured around the hold), not a synchronisation.
HOLD_S = 0.25
MEASURED = ("queue", "compute_input", "compute_infer", "compute_output")


async def test_statistics_measure_the_queue_and_the_parts_of_each_run(
    avatar_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``queue`` and the ``compute_*`` durations count every frame run, are measured (not
    0), add up to no more than the callers waited, and a frame held in the queue behind a
    busy worker shows the hold in ``queue``."""
    requests = 6
    async with served(settings_for(avatar_root)) as server:
        client = triton_aio.InferenceServerClient(server.address)
        try:

            async def inference_stats() -> Any:
                answer = await client.get_inference_statistics(MODEL)
                (model,) = answer.model_stats
                return model.inference_stats

            await client.load_model(MODEL)  # a fresh load: its warm-up runs are not counted
            fresh = await inference_stats()
            assert {getattr(fresh, key).count for key in MEASURED} == {0}
            inputs = uint8_request(triton_aio, *uint8_inputs(1))
            started = time.perf_counter_ns()
            for _ in range(requests):
                await client.infer(MODEL, inputs)
            wall_ns = time.perf_counter_ns() - started
            free = await inference_stats()
            assert free.success.count == requests
            for key in MEASURED:
                assert getattr(free, key).count == requests, key
                assert getattr(free, key).ns > 0, key
            measured_ns = sum(getattr(free, key).ns for key in MEASURED)
            # Each request's wait and run lie inside the time its caller waited for it.
            assert measured_ns <= free.success.ns <= wall_ns

            scheduler = server.core.schedulers[0]
            gate = Gate(monkeypatch)
            first = asyncio.create_task(client.infer(MODEL, inputs))
            try:
                await until(gate.entered.is_set, "the worker to take the first frame")
                second = asyncio.create_task(client.infer(MODEL, inputs))
                await until(lambda: scheduler.queue_depth == 1, "the second frame queued")
                queued = time.perf_counter_ns()
                await asyncio.sleep(HOLD_S)  # the wait under test
                held_ns = time.perf_counter_ns() - queued
            finally:
                gate.opened.set()
            await asyncio.gather(first, second)
            after = await inference_stats()
        finally:
            await client.close()
    assert after.queue.count == requests + 2
    waited_ns = after.queue.ns - free.queue.ns
    assert waited_ns >= held_ns
    # Not a figure per frame: the held frames' mean wait is past the free ones'.
    assert waited_ns / 2 > free.queue.ns / requests
    for key in MEASURED[1:]:
        assert getattr(after, key).count == requests + 2, key


async def test_an_oversized_message_is_refused_while_a_stream_goes_on(
    client: triton_aio.InferenceServerClient, server: Served
) -> None:
    limit = message_limits().receive_bytes
    visual, audio = float_inputs(1)
    feed: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[dict[str, Any]]:
        while (item := await feed.get()) is not None:
            yield item

    def request(request_id: str) -> dict[str, Any]:
        inputs = float_request(triton_aio, visual, audio)
        return {"model_name": MODEL, "inputs": inputs, "request_id": request_id}

    async with asyncio.timeout(TIMEOUT_S):
        answers = client.stream_infer(requests())
        feed.put_nowait(request("before"))
        result, error = await anext(answers)
        assert error is None
        assert result.get_response().id == "before"

        # 33 float frames: past the limit, so grpc refuses it before any of our code (which
        # would have said INVALID_ARGUMENT: a request carries at most 32 frames).
        huge_visual = np.zeros((33, *VISUAL), np.float32)
        huge_audio = np.zeros((33, *AUDIO), np.float32)
        assert huge_visual.nbytes + huge_audio.nbytes > limit
        with pytest.raises(InferenceServerException) as refused:
            await client.infer(MODEL, float_request(triton_aio, huge_visual, huge_audio))
        assert status_of(refused.value) == "StatusCode.RESOURCE_EXHAUSTED"
        assert str(limit) in str(refused.value.message())
        del huge_visual, huge_audio

        feed.put_nowait(request("after"))
        result, error = await anext(answers)
        assert error is None
        assert result.get_response().id == "after"
        feed.put_nowait(None)
        assert await client.is_server_live()


# -- lipstream serve ------------------------------------------------------------------------


@pytest.mark.slow
async def test_lipstream_serve_opens_grpc_refuses_oversized_messages_and_closes_on_sigterm(
    tmp_path: Path,
) -> None:
    async with lipstream_serve(tmp_path) as server:
        client = triton_aio.InferenceServerClient(server.grpc_address)
        try:
            assert await client.is_server_ready()
            index = await client.get_model_repository_index(as_json=True)
            model = index["models"][0]["name"]
            meta = await client.get_model_metadata(model, as_json=True)
            assert meta["versions"] == ["float", "uint8"]
        finally:
            await client.close()

        # grpc reads a message's length first: 200 MB past the limit is refused without
        # the server ever holding it (its peak resident memory barely moves).
        oversized = 200 * 1024 * 1024
        request = service_pb2.ModelInferRequest(model_name="demo")
        request.raw_input_contents.append(bytes(oversized))
        peak_before = _peak_rss(server.proc.pid)
        async with _channel(server.grpc_address) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ModelInfer(request)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (await stub.ServerLive(service_pb2.ServerLiveRequest())).live
        del request
        assert _peak_rss(server.proc.pid) - peak_before < oversized // 4
        assert f"gRPC listening on 127.0.0.1:{server.grpc_port}" in server.log()
        server.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT_S):
            assert await server.proc.wait() == 0
        assert f"gRPC listener on 127.0.0.1:{server.grpc_port} closed" in server.log()


def _peak_rss(pid: int) -> int:
    """A process's peak resident memory in bytes (Linux: VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


@asynccontextmanager
async def _channel(address: str) -> AsyncIterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """Triton's generated stub, on a channel with tritonclient's message limits."""
    limit = 2**31 - 1  # as tritonclient sets it
    options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


async def test_a_cluster_worker_serves_grpc_on_a_port_of_its_own(
    avatar_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker (run here without Ray) opens its gRPC listener on a port the OS picks, not
    on the front's ``server.grpc_port``, and reports it for the front to route to."""
    monkeypatch.setattr(worker_module, "configure_logging", lambda level, fmt: None)
    settings = settings_for(avatar_root)
    worker = worker_module.Worker(settings, "w0")
    try:
        report = await worker.report()
        assert report.grpc_port is not None
        assert report.grpc_port != settings.server.grpc_port
        client = triton_aio.InferenceServerClient(f"127.0.0.1:{report.grpc_port}")
        try:
            assert await client.is_server_ready()
            visual, audio = float_inputs(1)
            result = await client.infer(MODEL, float_request(triton_aio, visual, audio))
            assert result.as_numpy(OUTPUT_NAME) is not None
        finally:
            await client.close()
    finally:
        await worker.stop()
    off = settings_for(avatar_root, server={"grpc_port": None})
    worker = worker_module.Worker(off, "w1")
    try:
        assert (await worker.report()).grpc_port is None
    finally:
        await worker.stop()
