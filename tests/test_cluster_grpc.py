"""The gRPC front doors through a cluster front, with ``tritonclient.grpc`` and seed stubs.

Two real worker apps (each its own inference core and its own gRPC listener, as a Ray
worker opens them) are served in this process; a Ray runtime that pretends
(``tests/fake_ray.py``) reports them, gRPC ports included, to a real
:class:`~web.cluster.front.ClusterFront`, whose gRPC listener
(``web/cluster/grpc_front.py``) relays to the workers' over real gRPC exactly as over
Ray's workers. The wire scan that reads a request's model without parsing it
(``web/cluster/grpc_wire.py``) is checked against protobuf's own parser.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as triton_aio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from config.settings import Settings
from tests.fake_ray import FakeRuntime, FakeWorker
from tests.grpc_served import SeedStubs, seed_stubs
from tests.oip_models import AUDIO, OUTPUT, TOKEN, VISUAL, assert_output, avatar, frames
from tests.server_process import lipstream_serve
from web.app import build_app
from web.app_keys import CORE, DOOR
from web.cluster.app import build_front_app
from web.cluster.front import ClusterFront
from web.cluster.grpc_front import start_front_grpc
from web.cluster.grpc_wire import MalformedMessageError, string_field
from web.cluster.placement import WorkerReport
from web.cluster.runtime import RuntimeMode
from web.inference.grpc_server import GrpcListener, message_limits, start_inference_grpc
from web.inference.protos import grpc_service_pb2 as oip
from web.schemas.inference import MAX_REQUEST_FRAMES

BEARER = {"authorization": f"Bearer {TOKEN}"}  # gRPC metadata keys are lower-case
LIMIT = 2**31 - 1
TIMEOUT_S = 60.0


@dataclass
class ServedWorker:
    url: str
    app: web.Application
    grpc: GrpcListener

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc.port}"

    async def door_requests(self, model: str = "alice") -> int:
        """Protocol requests this worker's own door ran for ``model``."""
        (figures,) = await self.app[DOOR].statistics(model)
        return figures.requests.success_count


@dataclass
class GrpcWorkersRuntime(FakeRuntime):
    """Reports that point at worker apps served in this process: each worker's URL, gRPC
    port and loaded models. ``silent``: every report fails (the workers hang)."""

    served: dict[str, ServedWorker] = field(default_factory=dict)
    silent: bool = False
    pids: itertools.count[int] = field(default_factory=itertools.count)

    async def report(self, worker: FakeWorker, name: str) -> WorkerReport:
        if self.silent:
            raise ConnectionError("the worker does not answer")
        served = self.served[name]
        core = served.app[CORE]
        loaded = {m for m in core.model_ids() if core.registry.entry(m).state == "loaded"}
        return WorkerReport(
            name=name,
            incarnation="i0",
            url=served.url,
            node="127.0.0.1",
            node_id="n",
            pid=next(self.pids),
            models=frozenset(loaded),
            live_sessions=0,
            room_places=3,
            room_share=0.5,
            grpc_port=served.grpc.port,
        )


@dataclass
class Cluster:
    front: ClusterFront
    address: str  # the front's gRPC listener
    runtime: GrpcWorkersRuntime
    workers: dict[str, ServedWorker]
    model: Path  # alice's ONNX model


def _settings(root: Path, data: str, admin_token: str | None, **sections: Any) -> Settings:
    server = {"admin_token": admin_token} if admin_token is not None else {}
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root.parent / data), "demo": False},
            "devices": {"kind": "cpu", "count": 1},
            "server": server,
            **sections,
        }
    )


@asynccontextmanager
async def running_cluster(tmp_path: Path, admin_token: str | None) -> AsyncIterator[Cluster]:
    """A front of two in-process workers; the workers take the front's admin token, as
    Ray's workers do (the operator's when set, else one the front made)."""
    root = tmp_path / "avatars"
    model = avatar(root)
    avatar(root, "bob")
    runtime = GrpcWorkersRuntime(RuntimeMode.GIVEN)
    # Reports are pulled when a test says so (front.refresh()), not on a timer; a loaded
    # 2-core machine gets time to answer the fan-out calls.
    cluster = {"workers": 2, "report_interval_s": 60, "report_timeout_s": 20}
    settings = _settings(root, "data-front", admin_token, cluster=cluster)
    front = ClusterFront(settings, runtime=runtime)
    worker_token = front.worker_admin_token.get_secret_value()
    async with AsyncExitStack() as stack:
        for name in ("w0", "w1"):
            app = build_app(_settings(root, f"data-{name}", worker_token))
            http = await stack.enter_async_context(TestClient(TestServer(app, host="127.0.0.1")))
            listener = await start_inference_grpc(app, "127.0.0.1", 0)
            stack.push_async_callback(listener.close, None)
            runtime.served[name] = ServedWorker(f"http://127.0.0.1:{http.port}", app, listener)
        front_app = build_front_app(settings, front=front)
        await stack.enter_async_context(TestClient(TestServer(front_app, host="127.0.0.1")))
        listener = await start_front_grpc(front_app, "127.0.0.1", 0)
        stack.push_async_callback(listener.close, None)
        yield Cluster(front, f"127.0.0.1:{listener.port}", runtime, runtime.served, model)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path, TOKEN) as running:
        yield running


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeedStubs]:
    """The stubs a seed client makes from our .proto (as tests/test_seed_grpc.py does)."""
    with seed_stubs(tmp_path_factory.mktemp("seed_stubs")) as stubs:
        yield stubs


@asynccontextmanager
async def triton(address: str) -> AsyncIterator[triton_aio.InferenceServerClient]:
    client = triton_aio.InferenceServerClient(address)
    try:
        yield client
    finally:
        await client.close()


@asynccontextmanager
async def channel(address: str) -> AsyncIterator[grpc.aio.Channel]:
    """A channel that sends and takes the largest messages (hand-made requests)."""
    options = [("grpc.max_send_message_length", LIMIT), ("grpc.max_receive_message_length", LIMIT)]
    async with grpc.aio.insecure_channel(address, options=options) as opened:
        yield opened


def triton_inputs(visual: np.ndarray, audio: np.ndarray) -> list[triton_aio.InferInput]:
    datatype = "UINT8" if visual.dtype == np.uint8 else "FP32"
    tensors = [
        triton_aio.InferInput(VISUAL, list(visual.shape), datatype),
        triton_aio.InferInput(AUDIO, list(audio.shape), "FP32"),
    ]
    tensors[0].set_data_from_numpy(visual)
    tensors[1].set_data_from_numpy(audio)
    return tensors


def status(error: InferenceServerException) -> str:
    return str(error.status())


# -- the wire scan ---------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_the_scan_finds_the_model_after_other_fields_of_every_wire_type() -> None:
    tensors = oip.ModelInferRequest(
        id="r1", model_version="uint8", raw_input_contents=[b"\x01" * 100_000, b"\x02" * 7]
    )
    tensors.inputs.add(name=VISUAL, datatype="UINT8", shape=[1, 320, 320, 3])
    # protobuf reads concatenated messages as one: here the name comes after the tensors
    wire = (
        tensors.SerializeToString() + oip.ModelInferRequest(model_name="alice").SerializeToString()
    )
    assert oip.ModelInferRequest.FromString(wire).model_name == "alice"
    assert string_field(wire, 1) == "alice"
    assert string_field(memoryview(wire), 1) == "alice"

    load = oip.RepositoryModelLoadRequest(repository_name="models", model_name="bob")
    load.parameters["device"].int64_param = 3
    assert string_field(load.SerializeToString(), 2) == "bob"
    assert string_field(load.SerializeToString(), 1) == "models"

    every_type = (
        _varint(3 << 3 | 0) + _varint(2**63)  # a varint of 10 bytes
        + _varint(4 << 3 | 1) + bytes(8)  # fixed64
        + _varint(5 << 3 | 5) + bytes(4)  # fixed32
        + _varint(1 << 3 | 0) + _varint(7)  # field 1 as a varint: not the string field
        + _varint(1 << 3 | 2) + _varint(5) + b"alice"
        + _varint(900 << 3 | 2) + _varint(3) + b"xyz"
    )  # fmt: skip
    assert string_field(every_type, 1) == "alice"
    # As protobuf reads it: the last occurrence wins.
    twice = every_type + oip.ModelReadyRequest(name="carol").SerializeToString()
    assert string_field(twice, 1) == oip.ModelReadyRequest.FromString(twice).name == "carol"


def test_the_scan_answers_the_default_when_the_field_is_missing() -> None:
    assert string_field(b"", 1) == ""
    assert string_field(oip.ModelReadyRequest(version="uint8").SerializeToString(), 1) == ""
    assert string_field(oip.RepositoryModelLoadRequest(model_name="a").SerializeToString(), 1) == ""


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        (b"\x80", "a varint runs past the end"),  # the key itself cut off
        (b"\x08", "a varint runs past the end"),  # a varint field with no value
        (b"\x08\xff\xff", "a varint runs past the end"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "a varint is longer than 10 bytes"),
        (b"\x0a\x05abc", "field 1 runs past the end"),
        (b"\x12" + _varint(2**40) + b"abc", "field 2 runs past the end"),
        (b"\x09\x00\x00", "field 1 runs past the end"),  # fixed64 cut short
        (b"\x0d\x00", "field 1 runs past the end"),  # fixed32 cut short
        (b"\x0e\x00", "wire type 6"),
        (b"\x0f\x00", "wire type 7"),
        (b"\x0b\x0c", "wire type 3"),  # a group: proto3 never writes one
        (b"\x02\x00", "field number 0"),
        (b"\x0a\x02\xff\xfe", "field 1 is not UTF-8"),
    ],
)
def test_the_scan_refuses_a_message_that_does_not_parse(wire: bytes, why: str) -> None:
    with pytest.raises(MalformedMessageError, match=why):
        string_field(wire, 1)
    if why != "wire type 3":  # protobuf walks groups; the scan refuses them (its doc)
        with pytest.raises(DecodeError):
            oip.ModelReadyRequest.FromString(wire)


# -- through the front -----------------------------------------------------------------------


async def test_health_metadata_and_a_models_calls_go_where_it_is_loaded(cluster: Cluster) -> None:
    w0, w1 = cluster.workers["w0"], cluster.workers["w1"]
    async with triton(cluster.address) as client:
        assert await client.is_server_live()
        assert await client.is_server_ready()
        server = await client.get_server_metadata()
        assert server.name == "lipstream"
        assert "model_repository" in server.extensions
        model = await client.get_model_metadata("alice")  # read by a worker, loads nothing
        assert [t.name for t in model.inputs] == [VISUAL, AUDIO]
        config = (await client.get_model_config("alice", "uint8")).config
        assert config.input[0].data_type == model_config_pb2.TYPE_UINT8
        assert not await client.is_model_ready("alice")
        assert not await client.is_model_ready("nobody")  # an answer, not an error

        await client.load_model("alice", headers=BEARER)  # placement: equal room, w0
        await cluster.front.refresh()
        assert w0.app[CORE].is_loaded("alice")
        assert not w1.app[CORE].is_loaded("alice")
        assert await client.is_model_ready("alice")

        float8 = frames(8, uint8=False, seed=1)
        result = await client.infer("alice", triton_inputs(*float8), request_id="f8")
        assert result.get_response().id == "f8"
        assert_output(cluster.model, *float8, result.as_numpy(OUTPUT))
        uint8 = frames(3, uint8=True, seed=2)
        result = await client.infer("alice", triton_inputs(*uint8))
        assert_output(cluster.model, *uint8, result.as_numpy(OUTPUT))
        # Both ran on the worker holding the model, and answer what it answers directly.
        assert [await w.door_requests() for w in (w0, w1)] == [2, 0]
        async with triton(w0.address) as direct:
            again = await direct.infer("alice", triton_inputs(*uint8))
        np.testing.assert_array_equal(again.as_numpy(OUTPUT), result.as_numpy(OUTPUT))


async def test_the_largest_request_passes_both_hops_and_a_larger_one_stops_at_the_front(
    cluster: Cluster,
) -> None:
    limits = message_limits()
    largest = frames(MAX_REQUEST_FRAMES, uint8=False, seed=5)  # ≈ 80 MB in, 39 MB out
    async with triton(cluster.address) as client:
        result = await client.infer("alice", triton_inputs(*largest))
        assert_output(cluster.model, *largest, result.as_numpy(OUTPUT))
    request = oip.ModelInferRequest(
        model_name="alice", raw_input_contents=[bytes(limits.receive_bytes)]
    )
    async with channel(cluster.address) as raw:
        infer = raw.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await infer(request.SerializeToString())
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert [await w.door_requests() for w in cluster.workers.values()] == [1, 0]


async def test_a_stream_goes_to_its_models_worker_and_on_after_a_failed_request(
    cluster: Cluster,
) -> None:
    batches = {f"r{i}": frames(1 + i % 3, uint8=i % 2 == 1, seed=10 + i) for i in range(5)}
    bad = frames(1, uint8=False)[1]  # the audio as the visual input: the wrong shape

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i, (request_id, tensors) in enumerate(batches.items()):
            if i == 2:
                yield {"model_name": "alice", "inputs": triton_inputs(bad, bad), "request_id": "x"}
            yield {
                "model_name": "alice",
                "inputs": triton_inputs(*tensors),
                "request_id": request_id,
            }

    answers: dict[str, np.ndarray] = {}
    errors: list[str] = []
    async with triton(cluster.address) as client, asyncio.timeout(TIMEOUT_S):
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                errors.append(str(error.message()))
            else:
                answers[result.get_response().id] = result.as_numpy(OUTPUT)
    assert len(errors) == 1
    assert "must have shape" in errors[0]
    assert sorted(answers) == sorted(batches)
    for request_id, tensors in batches.items():
        assert_output(cluster.model, *tensors, answers[request_id])
    # Nothing held alice: placement chose w0 for the whole stream.
    assert [await w.door_requests() for w in cluster.workers.values()] == [5, 0]


async def test_the_repository_and_statistics_cover_every_worker(cluster: Cluster) -> None:
    w0, w1 = cluster.workers["w0"], cluster.workers["w1"]
    async with triton(cluster.address) as client, channel(cluster.address) as raw:
        await client.load_model("alice", headers=BEARER)  # placement: w0
        # On a named device: the front's devices are w0's then w1's, so 1 is w1's cpu:0.
        load = service_pb2.RepositoryModelLoadRequest(model_name="alice")
        load.parameters["device"].int64_param = 1
        stub = service_pb2_grpc.GRPCInferenceServiceStub(raw)
        await stub.RepositoryModelLoad(load, metadata=tuple(BEARER.items()))
        await cluster.front.refresh()
        assert all(w.app[CORE].is_loaded("alice") for w in (w0, w1))

        for worker, n in ((w0, 1), (w1, 2)):  # each worker runs frames of its own
            async with triton(worker.address) as direct:
                await direct.infer("alice", triton_inputs(*frames(n, uint8=True)))
        (alice,) = (await client.get_inference_statistics("alice", "uint8")).model_stats
        assert (alice.name, alice.version) == ("alice", "uint8")
        assert alice.inference_count == 3  # frames: 1 + 2
        assert alice.inference_stats.success.count == 2  # requests: one on each
        for key in ("queue", "compute_input", "compute_infer", "compute_output"):
            measured = getattr(alice.inference_stats, key)  # per frame, summed
            assert (measured.count, measured.ns > 0) == (3, True), key
        assert alice.execution_count >= 2
        every = (await client.get_inference_statistics()).model_stats
        assert [(s.name, s.inference_count) for s in every] == [("alice", 3), ("bob", 0)]
        index = (await client.get_model_repository_index()).models
        assert [(m.name, m.state, m.reason) for m in index] == [
            ("alice", "READY", ""),
            ("bob", "UNAVAILABLE", "not loaded"),
        ]

        await client.unload_model("alice", headers=BEARER)  # everywhere it is loaded
        await cluster.front.refresh()
        assert not any(w.app[CORE].is_loaded("alice") for w in (w0, w1))
        ready = await stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
        assert list(ready.models) == []


async def test_loads_take_the_operators_token_and_the_workers_get_the_fronts(
    cluster: Cluster, tmp_path: Path
) -> None:
    async with triton(cluster.address) as client:
        for headers in (None, {"authorization": "Bearer wrong"}):
            with pytest.raises(InferenceServerException) as refused:
                await client.load_model("alice", headers=headers)
            assert status(refused.value) == "StatusCode.UNAUTHENTICATED"
            with pytest.raises(InferenceServerException) as refused:
                await client.unload_model("alice", headers=headers)
            assert status(refused.value) == "StatusCode.UNAUTHENTICATED"
        assert not any(w.app[CORE].is_loaded("alice") for w in cluster.workers.values())
        with pytest.raises(InferenceServerException) as unknown:  # the worker's refusal
            await client.load_model("nobody", headers=BEARER)
        assert status(unknown.value) == "StatusCode.NOT_FOUND"

    # No operator token: a loopback caller is let in by the front, and the workers take
    # the token only the front knows.
    async with (
        running_cluster(tmp_path / "open", None) as open_cluster,
        triton(open_cluster.address) as client,
    ):
        await client.load_model("alice")
        await open_cluster.front.refresh()
        assert open_cluster.workers["w0"].app[CORE].is_loaded("alice")
        with pytest.raises(InferenceServerException) as forwarded:  # a proxy's caller
            await client.unload_model("alice", headers={"x-forwarded-for": "203.0.113.9"})
        assert status(forwarded.value) == "StatusCode.PERMISSION_DENIED"
        await client.unload_model("alice")
        await open_cluster.front.refresh()
        assert not open_cluster.workers["w0"].app[CORE].is_loaded("alice")


async def test_errors_come_back_as_the_workers_sent_them(cluster: Cluster) -> None:
    async with triton(cluster.address) as client:
        for call in (
            client.infer("nobody", triton_inputs(*frames(1, uint8=True))),
            client.get_model_metadata("nobody"),
            client.get_inference_statistics("nobody"),  # refused by every worker
        ):
            with pytest.raises(InferenceServerException) as unknown:
                await call
            assert status(unknown.value) == "StatusCode.NOT_FOUND"
            assert "nobody" in str(unknown.value.message())
    async with channel(cluster.address) as raw:
        infer = raw.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.aio.AioRpcError) as malformed:
            await infer(b"\x0a\x05ali")  # the name's length runs past the end
        assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid ModelInferRequest: field 1 runs past" in str(malformed.value.details())


async def test_no_worker_answering_is_unavailable_and_a_failed_worker_is_named(
    cluster: Cluster,
) -> None:
    w0 = cluster.workers["w0"]
    async with triton(cluster.address) as client:
        await client.load_model("alice", headers=BEARER)
        await cluster.front.refresh()
        # w0's listener goes away while its report still names it: the call fails there.
        await w0.grpc.close(None)
        with pytest.raises(InferenceServerException) as failed:
            await client.infer("alice", triton_inputs(*frames(1, uint8=True)))
        assert status(failed.value) == "StatusCode.UNAVAILABLE"
        assert str(failed.value.message()).startswith("worker w0: ")
        # Back on a new port (as a restarted worker): the front calls it there.
        w0.grpc = await start_inference_grpc(w0.app, "127.0.0.1", 0)
        try:
            await cluster.front.refresh()
            assert await client.is_model_ready("alice")
            cluster.runtime.silent = True
            await cluster.front.refresh()  # no worker answers now
            assert await client.is_server_live()
            assert not await client.is_server_ready()
            for call in (
                client.infer("alice", triton_inputs(*frames(1, uint8=True))),
                client.get_model_repository_index(),
                client.get_inference_statistics(),
            ):
                with pytest.raises(InferenceServerException) as unavailable:
                    await call
                assert status(unavailable.value) == "StatusCode.UNAVAILABLE"
                assert "no worker is answering (0 of 2)" in str(unavailable.value.message())
        finally:
            await w0.grpc.close(None)
    async with channel(cluster.address) as raw:
        ready = raw.unary_unary("/inference.GRPCInferenceService/ModelReady")
        call = ready(oip.ModelReadyRequest(name="alice").SerializeToString())
        with pytest.raises(grpc.aio.AioRpcError) as unavailable:
            await call
        assert ("retry-after", "5") in list(unavailable.value.trailing_metadata())


async def test_a_worker_that_fails_during_a_stream_is_named(cluster: Cluster) -> None:
    visual, audio = frames(1, uint8=True)
    request = service_pb2.ModelInferRequest(model_name="alice", id="a")
    request.inputs.add(name=VISUAL, datatype="UINT8", shape=list(visual.shape))
    request.inputs.add(name=AUDIO, datatype="FP32", shape=list(audio.shape))
    request.raw_input_contents.extend([visual.tobytes(), audio.tobytes()])
    async with channel(cluster.address) as raw, asyncio.timeout(TIMEOUT_S):
        stream = service_pb2_grpc.GRPCInferenceServiceStub(raw).ModelStreamInfer()
        await stream.write(request)
        answer = await stream.read()
        assert (answer.error_message, answer.infer_response.id) == ("", "a")
        await cluster.workers["w0"].grpc.close(None)  # the stream's worker goes away
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stream.read()
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert str(failed.value.details()).startswith("worker w0: ")


# -- the seed's service ----------------------------------------------------------------------


def infer_batch(seed: SeedStubs, n: int, model: str = "alice", rng_seed: int = 0) -> Any:
    visual, audio = frames(n, uint8=False, seed=rng_seed)
    return seed.messages.InferBatchRequest(
        model_id=model,
        visual_frames=visual.tobytes(),
        audio_features=audio.tobytes(),
        batch_size=n,
    )


async def test_the_seeds_service_through_the_front(cluster: Cluster, seed: SeedStubs) -> None:
    w0, w1 = cluster.workers["w0"], cluster.workers["w1"]
    messages = seed.messages
    async with channel(cluster.address) as through, channel(w0.address) as direct:
        front = seed.services.InferenceServiceStub(through)
        request = infer_batch(seed, 4, rng_seed=3)
        answer = await front.InferBatch(request)  # nothing holds alice: placement, w0
        assert (answer.success, answer.device, len(answer.outputs)) == (True, "cpu:0", 4)
        same = await seed.services.InferenceServiceStub(direct).InferBatch(request)
        assert [r.data for r in answer.outputs] == [r.data for r in same.outputs]
        assert [await w.door_requests() for w in (w0, w1)] == [2, 0]

        # bob on w1's device, by its index in the front's devices (w0's, then w1's).
        loaded = await front.LoadModel(
            messages.LoadModelRequest(model_id="bob", device_index=1),
            metadata=tuple(BEARER.items()),
        )
        assert (loaded.model.model_id, loaded.model.device) == ("bob", "w1/cpu:0")
        assert w1.app[CORE].is_loaded("bob")
        await cluster.front.refresh()

        listed = await front.ListModels(messages.ListModelsRequest())
        assert [(m.model_id, m.loaded, m.device) for m in listed.models] == [
            ("alice", True, "w0/cpu:0"),
            ("bob", True, "w1/cpu:0"),
        ]
        alice = listed.models[0]
        assert (alice.stats.requests, alice.stats.frames) == (2, 8)
        assert alice.memory_bytes > 0

        stats = await front.GetModelStats(messages.GetModelStatsRequest(model_id="alice"))
        assert [(s.model_id, s.requests, s.frames) for s in stats.models] == [("alice", 2, 8)]
        totals = stats.totals
        assert (totals.models_registered, totals.models_loaded) == (2, 2)
        assert (totals.requests, totals.frames) == (2, 8)

        health = await front.Health(messages.HealthRequest())
        assert (health.healthy, health.status) == (True, "serving")
        assert [d.name for d in health.devices] == ["w0/cpu:0", "w1/cpu:0"]
        assert [d.models_loaded for d in health.devices] == [1, 1]
        assert (health.totals.models_loaded, health.totals.requests) == (2, 2)

        for call in (
            front.InferBatch(infer_batch(seed, 1, model="nobody")),
            front.GetModelStats(messages.GetModelStatsRequest(model_id="nobody")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await call
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await front.LoadModel(messages.LoadModelRequest(model_id="alice"))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as no_device:
            await front.LoadModel(
                messages.LoadModelRequest(model_id="alice", device_index=2),
                metadata=tuple(BEARER.items()),
            )
        assert no_device.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "0=w0/0, 1=w1/0" in str(no_device.value.details())


# -- lipstream serve --workers ---------------------------------------------------------------


@pytest.mark.slow
async def test_lipstream_serve_with_workers_serves_grpc_through_its_front(tmp_path: Path) -> None:
    """The real thing: a front on a local Ray runtime, two worker processes with their
    own listeners, the front's on ``server.grpc_port``, closed on SIGTERM."""
    async with lipstream_serve(
        tmp_path, "--workers", "2", server={"drain_timeout_s": 5}, startup_timeout_s=180.0
    ) as server:
        async with triton(server.grpc_address) as client:
            assert await client.is_server_ready()
            index = (await client.get_model_repository_index()).models
            assert [(m.name, m.state) for m in index] == [("demo", "UNAVAILABLE")]
            meta = await client.get_model_metadata("demo", "uint8")
            inputs = []
            for tensor in meta.inputs:  # zeros of the model's own names and shapes, 2 frames
                shape = [2, *tensor.shape[1:]]
                dtype = np.uint8 if tensor.datatype == "UINT8" else np.float32
                inputs.append(triton_aio.InferInput(tensor.name, shape, tensor.datatype))
                inputs[-1].set_data_from_numpy(np.zeros(shape, dtype))
            result = await client.infer("demo", inputs, model_version="uint8")
            assert result.as_numpy(meta.outputs[0].name).shape[0] == 2
            (stats,) = (await client.get_inference_statistics("demo")).model_stats
            assert (stats.inference_count, stats.inference_stats.success.count) == (2, 1)
        log = server.log()
        assert "cluster: 2 of 2 workers up" in log
        assert f"gRPC listening on 127.0.0.1:{server.grpc_port}" in log
        server.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT_S):
            assert await server.proc.wait() == 0, server.log()
        assert f"gRPC listener on 127.0.0.1:{server.grpc_port} closed" in server.log()
