"""The seed's ``inference.InferenceService``, called as a seed client calls it.

The client's stubs are generated here by grpcio-tools from our
``web/inference/protos/inference_service.proto`` (as a compositing server built against
the seed would generate them) and imported from the test's own directory; the server is
the in-process app and listener of ``tests/grpc_served.py``. ``InferBatch`` answers
exactly what ``POST /v1/infer`` answers for the same inputs.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tests.grpc_served import (
    MODEL,
    SeedStubs,
    Served,
    float_inputs,
    make_avatar,
    seed_stubs,
    served,
    settings_for,
)
from web.app_keys import DRAINING

OUTPUT_BYTES = 3 * 320 * 320 * 4
LIMIT = 2**31 - 1


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeedStubs]:
    """The stubs protoc makes from our .proto, imported from where it wrote them."""
    with seed_stubs(tmp_path_factory.mktemp("seed_stubs")) as stubs:
        yield stubs


@pytest.fixture
def avatar_root(tmp_path: Path) -> Path:
    root = tmp_path / "avatars"
    make_avatar(root)
    make_avatar(root, "bob")
    return root


@pytest.fixture
async def server(avatar_root: Path) -> AsyncIterator[Served]:
    async with served(settings_for(avatar_root)) as running:
        yield running


@asynccontextmanager
async def seed_client(address: str, stubs: SeedStubs) -> AsyncIterator[Any]:
    """The seed's stub on a channel that takes batches of 32 float frames."""
    options = [("grpc.max_send_message_length", LIMIT), ("grpc.max_receive_message_length", LIMIT)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        yield stubs.services.InferenceServiceStub(channel)


@pytest.fixture
async def stub(server: Served, seed: SeedStubs) -> AsyncIterator[Any]:
    async with seed_client(server.address, seed) as client:
        yield client


def infer_request(seed: SeedStubs, visual: np.ndarray, audio: np.ndarray, **fields: Any) -> Any:
    values: dict[str, Any] = {
        "model_id": MODEL,
        "visual_frames": visual.tobytes(),
        "audio_features": audio.tobytes(),
        "batch_size": visual.shape[0],
        **fields,
    }
    return seed.messages.InferBatchRequest(**values)


async def refused(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value.code(), str(error.value.details())


@pytest.mark.parametrize("n", [1, 8, 25])
async def test_infer_batch_answers_what_v1_infer_answers(
    server: Served, stub: Any, seed: SeedStubs, n: int
) -> None:
    visual, audio = float_inputs(n, seed=n)
    response = await stub.InferBatch(infer_request(seed, visual, audio))
    assert response.success
    assert len(response.outputs) == n
    assert all(len(region.data) == OUTPUT_BYTES for region in response.outputs)
    assert response.inference_time_ms > 0
    assert (response.device, response.gpu_id) == ("cpu:0", -1)  # the CPU is -1

    body = visual.tobytes() + audio.tobytes()
    http = await server.http.post(f"/v1/infer/{MODEL}?batch_size={n}", data=io.BytesIO(body))
    assert http.status == 200, await http.text()
    expected = np.frombuffer(await http.read(), "<f4").reshape(n, 3, 320, 320)
    regions = np.stack(
        [np.frombuffer(r.data, "<f4").reshape(3, 320, 320) for r in response.outputs]
    )
    np.testing.assert_array_equal(regions, expected)
    assert float(regions.min()) >= 0.0
    assert float(regions.max()) <= 1.0


async def test_bad_sizes_and_unknown_models_are_refused_with_what_to_change(
    stub: Any, seed: SeedStubs
) -> None:
    visual, audio = float_inputs(2)
    short = infer_request(seed, visual[:1], audio, batch_size=2)
    code, message = await refused(stub.InferBatch(short))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message == (
        f"visual_frames must be {2 * 6 * 320 * 320 * 4} bytes for batch_size=2 "
        f"(2 x 6x320x320 float32), got {6 * 320 * 320 * 4}"
    )
    long_audio = np.concatenate([audio, audio])
    code, message = await refused(stub.InferBatch(infer_request(seed, visual, long_audio)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"audio_features must be {2 * 32 * 16 * 16 * 4} bytes for batch_size=2" in message
    for batch_size in (0, 33, -1):
        code, message = await refused(
            stub.InferBatch(infer_request(seed, visual, audio, batch_size=batch_size))
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert f"batch_size must be 1 to 32 frames, got {batch_size}" in message
    code, message = await refused(stub.InferBatch(infer_request(seed, visual, audio, model_id="")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, message = await refused(
        stub.InferBatch(infer_request(seed, visual, audio, model_id="nobody"))
    )
    assert code == grpc.StatusCode.NOT_FOUND
    assert "nobody" in message
    nan = visual.copy()
    nan[0, 0, 0, 0] = np.nan
    code, message = await refused(stub.InferBatch(infer_request(seed, nan, audio)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "NaN or infinite" in message
    # the server goes on serving
    assert len((await stub.InferBatch(infer_request(seed, visual, audio))).outputs) == 2


async def test_a_request_that_does_not_parse_is_invalid_argument(
    server: Served, stub: Any, seed: SeedStubs
) -> None:
    visual, audio = float_inputs(1)
    cut = infer_request(seed, visual, audio).SerializeToString()[:1000]
    async with grpc.aio.insecure_channel(server.address) as channel:
        infer = channel.unary_unary("/inference.InferenceService/InferBatch")
        code, message = await refused(infer(cut))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith("the request is not a valid InferBatchRequest: field 2 runs past")
    assert len((await stub.InferBatch(infer_request(seed, visual, audio))).outputs) == 1


async def test_list_models_and_stats_show_the_calls(stub: Any, seed: SeedStubs) -> None:
    messages = seed.messages
    listed = await stub.ListModels(messages.ListModelsRequest())
    assert [(m.model_id, m.loaded, m.state, m.device, m.gpu_id) for m in listed.models] == [
        (MODEL, False, "registered", "", -1),
        ("bob", False, "registered", "", -1),
    ]

    for n in (1, 2, 3):
        await stub.InferBatch(infer_request(seed, *float_inputs(n, seed=n)))
    listed = await stub.ListModels(messages.ListModelsRequest())
    alice, bob = listed.models
    assert (alice.model_id, alice.loaded, alice.state, alice.device) == (
        MODEL,
        True,
        "loaded",
        "cpu:0",
    )
    assert alice.gpu_id == -1
    assert alice.memory_bytes > 0
    assert (alice.stats.requests, alice.stats.failed_requests, alice.stats.frames) == (3, 0, 6)
    assert alice.stats.batches >= 3
    assert alice.stats.inference_ms > 0
    assert alice.stats.last_inference_ms > 0
    assert (bob.loaded, bob.state, bob.device, bob.stats.requests) == (False, "registered", "", 0)

    one = await stub.GetModelStats(messages.GetModelStatsRequest(model_id=MODEL))
    assert [s.model_id for s in one.models] == [MODEL]
    assert one.models[0].frames == 6
    totals = one.totals
    assert (totals.models_registered, totals.models_loaded) == (2, 1)
    assert (totals.requests, totals.failed_requests, totals.frames) == (3, 0, 6)
    assert totals.model_memory_bytes == alice.memory_bytes
    every = await stub.GetModelStats(messages.GetModelStatsRequest())
    assert [s.model_id for s in every.models] == [MODEL, "bob"]
    code, _ = await refused(stub.GetModelStats(messages.GetModelStatsRequest(model_id="nobody")))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_load_model_through_the_registry(stub: Any, seed: SeedStubs) -> None:
    messages = seed.messages
    loaded = await stub.LoadModel(messages.LoadModelRequest(model_id="bob", device_index=0))
    assert loaded.success
    assert (loaded.model.model_id, loaded.model.loaded, loaded.model.device) == (
        "bob",
        True,
        "cpu:0",
    )
    assert loaded.load_ms > 0
    listed = await stub.ListModels(messages.ListModelsRequest())
    assert [m.model_id for m in listed.models if m.loaded] == ["bob"]
    code, message = await refused(
        stub.LoadModel(messages.LoadModelRequest(model_id=MODEL, device_index=4))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "device_index 4 does not exist (devices: 0=cpu:0)" in message
    code, _ = await refused(stub.LoadModel(messages.LoadModelRequest(model_id="nobody")))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_load_model_needs_the_admin_token_when_one_is_set(
    avatar_root: Path, seed: SeedStubs
) -> None:
    settings = settings_for(avatar_root, server={"admin_token": "s3cret"})
    request = seed.messages.LoadModelRequest(model_id=MODEL)
    async with served(settings) as server, seed_client(server.address, seed) as stub:
        code, message = await refused(stub.LoadModel(request))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert "bearer token" in message
        assert not server.core.is_loaded(MODEL)
        loaded = await stub.LoadModel(request, metadata=(("authorization", "Bearer s3cret"),))
        assert loaded.model.loaded
        # reading needs no token
        assert len((await stub.ListModels(seed.messages.ListModelsRequest())).models) == 2


async def test_health_reports_devices_totals_and_the_drain(
    server: Served, stub: Any, seed: SeedStubs
) -> None:
    await stub.InferBatch(infer_request(seed, *float_inputs(2)))
    health = await stub.Health(seed.messages.HealthRequest())
    assert health.healthy
    assert health.status == "serving"
    assert health.version
    (device,) = health.devices
    assert (device.name, device.kind, device.gpu_id) == ("cpu:0", "cpu", -1)
    assert device.memory_used_bytes > 0
    assert device.model_memory_bytes > 0
    assert (device.models_loaded, device.workers_alive, device.queue_size) == (1, 1, 256)
    assert device.queue_depth == 0
    assert (health.totals.models_registered, health.totals.models_loaded) == (2, 1)
    assert (health.totals.requests, health.totals.frames) == (1, 2)
    assert health.live_sessions == 0

    server.app[DRAINING].start()
    health = await stub.Health(seed.messages.HealthRequest())
    assert not health.healthy
    assert health.status == "draining"


def test_the_seed_fields_keep_the_seed_numbers(seed: SeedStubs) -> None:
    """The wire contract a seed client relies on (DESIGN §10), read from the .proto."""
    messages = seed.messages

    def numbers(message: Any) -> dict[str, int]:
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(messages.InferBatchRequest) == {
        "model_id": 1,
        "visual_frames": 2,
        "audio_features": 3,
        "batch_size": 4,
    }
    assert numbers(messages.RawMouthRegion) == {"data": 1}
    response = numbers(messages.InferBatchResponse)
    assert {k: response[k] for k in ("outputs", "inference_time_ms", "success", "gpu_id")} == {
        "outputs": 1,
        "inference_time_ms": 2,
        "success": 3,
        "gpu_id": 6,
    }
    assert 4 not in response.values()
    assert 5 not in response.values()
    assert numbers(messages.LoadModelRequest)["model_id"] == 1
    service = messages.DESCRIPTOR.services_by_name["InferenceService"]
    assert service.full_name == "inference.InferenceService"
    assert sorted(m.name for m in service.methods) == [
        "GetModelStats",
        "Health",
        "InferBatch",
        "ListModels",
        "LoadModel",
    ]
