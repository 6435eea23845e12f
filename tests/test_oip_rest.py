"""The Open Inference Protocol v2 over REST with the real ``tritonclient`` (sync and aio).

A ``lipstream serve`` process is driven by both clients (:class:`TestAServedProcess`):
health, metadata with the model's own tensor names, inference with binary and JSON
tensors on both contracts against onnxruntime, the repository and statistics. In-process
apps cover what needs a hand on the core: a queue held full, a registry that does not
load on demand, and the malformed bodies ``tritonclient`` cannot send (sent raw: each a
400 in the protocol's shape, most of them answered before their tensors were even sent).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import pytest_asyncio
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from aiohttp.test_utils import TestClient, TestServer
from tritonclient.utils import InferenceServerException

from config.settings import Settings
from inference_core.serving.frame_request import FrameRequest
from inference_core.serving.loaded_model import LoadedModel
from tests.live_calls import TIMEOUT_S, until
from tests.oip_models import (
    AUDIO,
    AUDIO_SHAPE,
    BEARER,
    LARGE_BODY_WARNING,
    OUTPUT,
    TOKEN,
    VISUAL,
    S,
    assert_output,
    avatar,
    frames,
    triton_inputs,
)
from tests.server_process import lipstream_serve
from web.app import build_app
from web.app_keys import CORE

HEADER = "Inference-Header-Content-Length"
Client = TestClient[Any, Any]
pytestmark = pytest.mark.filterwarnings(LARGE_BODY_WARNING)


def _settings(root: Path, **sections: Any) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root.parent / "data"), "demo": False},
            "devices": {"kind": "cpu", "count": 1},
            **sections,
        }
    )


def _status(error: pytest.ExceptionInfo[InferenceServerException]) -> str:
    return str(error.value.status())


# --- a lipstream serve process ----------------------------------------------------------


@dataclass
class Served:
    url: str  # host:port, as tritonclient takes it
    model: Path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    tmp = tmp_path_factory.mktemp("served")
    model = avatar(tmp / "avatars")
    settings = {"admin_token": TOKEN}
    async with lipstream_serve(tmp, server=settings, demo=False) as server:
        yield Served(f"127.0.0.1:{server.port}", model)


@pytest.fixture
def sync_client(served: Served) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(served.url) as client:
        yield client


def _stats(client: triton.InferenceServerClient) -> dict[str, Any]:
    (stats,) = client.get_inference_statistics("alice")["model_stats"]
    return dict(stats)


@pytest.mark.asyncio(loop_scope="module")
class TestAServedProcess:
    """``lipstream serve`` on a free port, driven by both clients."""

    async def test_health_and_metadata_carry_the_models_own_names(
        self, served: Served, sync_client: triton.InferenceServerClient
    ) -> None:
        client = sync_client
        assert client.is_server_live()
        assert client.is_server_ready()
        client.unload_model("alice", headers=BEARER)
        assert not client.is_model_ready("alice")  # registered, not loaded
        assert not client.is_model_ready("nobody")  # unknown: false, not an exception
        assert not client.is_model_ready("Bad.Id")
        assert not client.is_model_ready("alice", "3")
        server = client.get_server_metadata()
        assert server["name"] == "lipstream"
        assert {
            "binary_tensor_data",
            "model_repository",
            "statistics",
            "model_configuration",
        } <= set(server["extensions"])

        session = ort.InferenceSession(str(served.model), providers=["CPUExecutionProvider"])
        own = {i.name: [-1, *i.shape[1:]] for i in session.get_inputs()}
        assert list(own) == [AUDIO, VISUAL]  # the file's order; metadata lists visual first
        metadata = client.get_model_metadata("alice")
        assert metadata["versions"] == ["float", "uint8"]
        assert metadata["platform"] == "onnxruntime_onnx"
        assert {i["name"]: i["shape"] for i in metadata["inputs"]} == own
        assert {i["datatype"] for i in metadata["inputs"]} == {"FP32"}
        (output,) = session.get_outputs()
        assert metadata["outputs"] == [
            {"name": output.name, "datatype": "FP32", "shape": [-1, *output.shape[1:]]}
        ]
        uint8 = client.get_model_metadata("alice", "uint8")
        assert uint8["inputs"][0] == {"name": VISUAL, "datatype": "UINT8", "shape": [-1, S, S, 3]}
        assert uint8["outputs"][0] == {"name": OUTPUT, "datatype": "UINT8", "shape": [-1, S, S, 3]}
        assert client.get_model_metadata("alice", "float") == metadata

        config = client.get_model_config("alice")
        assert config["max_batch_size"] == 32
        assert config["input"][0] == {"name": VISUAL, "data_type": "TYPE_FP32", "dims": [6, S, S]}
        assert config["parameters"]["versions"]["string_value"] == "float,uint8"
        assert client.get_model_config("alice", "uint8")["output"][0]["data_type"] == "TYPE_UINT8"
        with pytest.raises(InferenceServerException) as unknown:
            client.get_model_metadata("nobody")
        assert _status(unknown) == "404"
        assert "nobody" in unknown.value.message()

        async with triton_aio.InferenceServerClient(served.url) as aio:
            assert await aio.is_server_live()
            assert await aio.is_server_ready()
            assert not await aio.is_model_ready("nobody")
            assert await aio.get_model_metadata("alice") == metadata
            assert "binary_tensor_data" in (await aio.get_server_metadata())["extensions"]

    async def test_inference_with_binary_and_json_tensors_matches_the_model(
        self, served: Served, sync_client: triton.InferenceServerClient
    ) -> None:
        client = sync_client
        before = _stats(client)
        requests = frames_sent = 0
        for uint8 in (False, True):
            for n in (1, 8):
                for binary in (True, False):
                    visual, audio = frames(n, uint8=uint8, seed=n)
                    # Binary: tritonclient's default (binary inputs, every output as bytes).
                    # JSON: inputs as data, the output asked for as data.
                    outputs = None if binary else [triton.InferRequestedOutput(OUTPUT, False)]
                    result = client.infer(
                        "alice",
                        triton_inputs(visual, audio, binary=binary),
                        outputs=outputs,
                        request_id=f"r{requests}",
                    )
                    response = result.get_response()
                    assert response["id"] == f"r{requests}"
                    assert response["model_version"] == ("uint8" if uint8 else "float")
                    (described,) = response["outputs"]
                    assert ("parameters" in described) is binary
                    assert ("data" in described) is not binary
                    assert_output(served.model, visual, audio, result.as_numpy(OUTPUT))
                    requests += 1
                    frames_sent += n

        async with triton_aio.InferenceServerClient(served.url) as aio:
            # The request compressed on the way (tritonclient's option): lengths count
            # the decoded bytes.
            for version, uint8, compression in (("", False, None), ("uint8", True, "gzip")):
                visual, audio = frames(8, uint8=uint8, seed=9)
                result = await aio.infer(
                    "alice",
                    triton_inputs(visual, audio),
                    model_version=version,
                    outputs=[triton_aio.InferRequestedOutput(OUTPUT)],
                    request_compression_algorithm=compression,
                )
                assert_output(served.model, visual, audio, result.as_numpy(OUTPUT))
                requests += 1
                frames_sent += 8

        after = _stats(client)
        assert after["inference_count"] - before["inference_count"] == frames_sent
        assert after["execution_count"] - before["execution_count"] >= requests
        success = after["inference_stats"]["success"]["count"]
        assert success - before["inference_stats"]["success"]["count"] == requests
        assert after["inference_stats"]["fail"] == before["inference_stats"]["fail"]
        assert after["inference_stats"]["compute_infer"]["ns"] > 0
        assert after["last_inference"] > 0

    async def test_bad_requests_are_refused_with_the_protocols_errors(
        self, served: Served, sync_client: triton.InferenceServerClient
    ) -> None:
        client = sync_client
        before = _stats(client)
        visual, audio = frames(2, uint8=False)
        wrong_shape = triton_inputs(visual[:, :, :, :-1].copy(), audio)
        fp16 = triton.InferInput(VISUAL, list(visual.shape), "FP16")
        fp16.set_data_from_numpy(visual.astype(np.float16))
        wrong_dtype = [fp16, triton_inputs(visual, audio)[1]]
        lying = triton_inputs(visual, audio[:1])
        lying[0].set_shape([1, 6, S, S])  # two frames' bytes declared as one frame
        unnamed = triton_inputs(visual, audio)
        unnamed[0] = triton.InferInput("input", list(visual.shape), "FP32")
        unnamed[0].set_data_from_numpy(visual)
        for inputs, model, status, words in (
            (wrong_shape, "alice", "400", "must have shape [-1,6,320,320]"),
            (wrong_dtype, "alice", "400", "must be FP32, got FP16"),
            (lying, "alice", "400", "binary_data_size is"),
            (unnamed, "alice", "400", f"takes the inputs {VISUAL}"),
            (triton_inputs(visual, audio), "nobody", "404", "nobody"),
        ):
            with pytest.raises(InferenceServerException) as refused:
                client.infer(model, inputs)
            assert _status(refused) == status
            assert words in refused.value.message()
        with pytest.raises(InferenceServerException) as no_version:
            client.infer("alice", triton_inputs(visual, audio), model_version="2")
        assert _status(no_version) == "404"
        with pytest.raises(InferenceServerException) as no_output:
            client.infer(
                "alice",
                triton_inputs(visual, audio),
                outputs=[triton.InferRequestedOutput("faces")],
            )
        assert _status(no_output) == "400"
        # Refused before the core: no request was counted as run or failed.
        after = _stats(client)
        assert after["inference_stats"] == before["inference_stats"]
        assert after["inference_count"] == before["inference_count"]
        good = client.infer("alice", triton_inputs(visual, audio))
        assert_output(served.model, visual, audio, good.as_numpy(OUTPUT))

    async def test_the_repository_loads_and_unloads_through_the_registry(
        self, served: Served, sync_client: triton.InferenceServerClient
    ) -> None:
        client = sync_client
        for change in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as unauthorized:
                change("alice")  # server.admin_token is set: the admin rule applies
            assert _status(unauthorized) == "401"
            assert "bearer token" in unauthorized.value.message()
        client.unload_model("alice", headers=BEARER)
        assert not client.is_model_ready("alice")
        index = client.get_model_repository_index()
        assert index == [{"name": "alice", "state": "UNAVAILABLE", "reason": "not loaded"}]
        client.load_model("alice", headers=BEARER)
        assert client.is_model_ready("alice")
        assert client.get_model_repository_index() == [
            {"name": "alice", "state": "READY", "reason": ""}
        ]
        with pytest.raises(InferenceServerException) as unknown:
            client.load_model("nobody", headers=BEARER)
        assert _status(unknown) == "404"
        with pytest.raises(InferenceServerException) as configured:
            client.load_model("alice", headers=BEARER, config=json.dumps({"backend": "x"}))
        assert _status(configured) == "400"
        assert "only the parameter 'device'" in configured.value.message()

        async with triton_aio.InferenceServerClient(served.url) as aio:
            await aio.unload_model("alice", headers=BEARER)
            assert not await aio.is_model_ready("alice")
            assert await aio.get_model_repository_index() == index
            await aio.load_model("alice", headers=BEARER)
            assert await aio.is_model_ready("alice")
            stats = await aio.get_inference_statistics()
            assert [s["name"] for s in stats["model_stats"]] == ["alice"]


# --- in-process apps ----------------------------------------------------------------------


@asynccontextmanager
async def _serving(settings: Settings) -> AsyncIterator[tuple[Client, str]]:
    """The app on a loopback port: a raw HTTP client and the address tritonclient takes."""
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        yield client, f"127.0.0.1:{client.port}"


class HeldWorker:
    """Holds the device's worker inside its first batch until :meth:`release`: every frame
    after it waits in the queue (patched on ``LoadedModel.run_batch``, as
    ``tests/test_faults.py`` does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self._gate = threading.Event()
        original = LoadedModel.run_batch

        def run_batch(model: LoadedModel, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
            self.entered.set()
            self._gate.wait(TIMEOUT_S)  # bounded: a failing test must not hang the worker
            return original(model, requests)

        monkeypatch.setattr(LoadedModel, "run_batch", run_batch)

    def release(self) -> None:
        self._gate.set()


async def test_a_full_queue_is_503_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = avatar(tmp_path / "avatars")
    settings = _settings(
        tmp_path / "avatars",
        devices={"kind": "cpu", "count": 1, "workers_per_device": 1},
        batching={"queue_size": 1},
    )
    async with (
        _serving(settings) as (http, url),
        triton_aio.InferenceServerClient(url) as client,
    ):
        await client.load_model("alice")  # loaded (and warmed) before the worker is held
        held = HeldWorker(monkeypatch)
        visual, audio = frames(1, uint8=False)
        first = asyncio.create_task(client.infer("alice", triton_inputs(visual, audio)))
        try:
            await until(held.entered.is_set, "the worker to take the first batch")
            # The worker is held: of two frames, one fits the queue and the other does not.
            two = frames(2, uint8=True)
            with pytest.raises(InferenceServerException) as full:
                await client.infer("alice", triton_inputs(*two))
            assert _status(full) == "503"
            assert "queue is full" in full.value.message()
            body = json.dumps(
                {
                    "inputs": [
                        {"name": VISUAL, "datatype": "UINT8", "shape": [2, S, S, 3],
                         "data": two[0].ravel().tolist()},
                        {"name": AUDIO, "datatype": "FP32", "shape": [2, *AUDIO_SHAPE],
                         "data": two[1].ravel().tolist()},
                    ]
                }
            )  # fmt: skip
            raw = await http.post("/v2/models/alice/infer", data=body)
            assert raw.status == 503
            assert raw.headers["Retry-After"] == "1"
            assert "queue is full" in (await raw.json())["error"]
        finally:
            held.release()
        result = await first
        assert_output(model, visual, audio, result.as_numpy(OUTPUT))
        (stats,) = (await client.get_inference_statistics("alice"))["model_stats"]
        assert stats["inference_stats"]["fail"]["count"] == 2
        assert stats["inference_stats"]["success"]["count"] == 1


#: How long the queue test holds the worker with a frame queued behind it: the wait the
#: statistics must show (measured around the hold), not a synchronisation.
HOLD_S = 0.25
MEASURED = ("queue", "compute_input", "compute_infer", "compute_output")


async def test_statistics_measure_the_queue_and_the_parts_of_each_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``queue`` and the ``compute_*`` durations count every frame run, are measured (not
    0), add up to no more than the callers waited, and a frame held in the queue behind a
    busy worker shows the hold in ``queue``."""
    avatar(tmp_path / "avatars")
    settings = _settings(
        tmp_path / "avatars", devices={"kind": "cpu", "count": 1, "workers_per_device": 1}
    )
    requests = 6
    async with (
        _serving(settings) as (http, url),
        triton_aio.InferenceServerClient(url) as client,
    ):

        async def inference_stats() -> dict[str, Any]:
            (stats,) = (await client.get_inference_statistics("alice"))["model_stats"]
            assert isinstance(stats, dict)
            return stats["inference_stats"]  # type: ignore[no-any-return]

        await client.load_model("alice")  # a fresh load: its warm-up runs are not counted
        assert {(await inference_stats())[key]["count"] for key in MEASURED} == {0}
        inputs = triton_inputs(*frames(1, uint8=True))
        started = time.perf_counter_ns()
        for _ in range(requests):
            await client.infer("alice", inputs)
        wall_ns = time.perf_counter_ns() - started
        stats = await inference_stats()
        assert stats["success"]["count"] == requests
        for key in MEASURED:
            assert stats[key]["count"] == requests, key
            assert stats[key]["ns"] > 0, key
        measured_ns = sum(stats[key]["ns"] for key in MEASURED)
        # Each request's wait and run lie inside the time its caller waited for it.
        assert measured_ns <= stats["success"]["ns"] <= wall_ns

        scheduler = http.app[CORE].schedulers[0]
        held = HeldWorker(monkeypatch)
        first = asyncio.create_task(client.infer("alice", inputs))
        try:
            await until(held.entered.is_set, "the worker to take the first frame")
            second = asyncio.create_task(client.infer("alice", inputs))
            await until(lambda: scheduler.queue_depth == 1, "the second frame queued")
            queued = time.perf_counter_ns()
            await asyncio.sleep(HOLD_S)  # the wait under test
            held_ns = time.perf_counter_ns() - queued
        finally:
            held.release()
        await asyncio.gather(first, second)
        after = await inference_stats()
    assert after["queue"]["count"] == requests + 2
    waited_ns = after["queue"]["ns"] - stats["queue"]["ns"]
    assert waited_ns >= held_ns
    # Not a figure per frame: the held frames' mean wait is past the free ones'.
    assert waited_ns / 2 > stats["queue"]["ns"] / requests
    for key in MEASURED[1:]:
        assert after[key]["count"] == requests + 2, key


async def test_a_model_not_loaded_is_refused_until_the_repository_loads_it(
    tmp_path: Path,
) -> None:
    model = avatar(tmp_path / "avatars")
    avatar(tmp_path / "avatars", "bob")
    settings = _settings(tmp_path / "avatars", registry={"load_on_infer": False})
    visual, audio = frames(2, uint8=True)
    async with (
        _serving(settings) as (http, url),
        triton_aio.InferenceServerClient(url) as client,
    ):
        with pytest.raises(InferenceServerException) as refused:
            await client.infer("alice", triton_inputs(visual, audio))
        assert _status(refused) == "503"
        assert "registry.load_on_infer is false" in refused.value.message()
        assert not await client.is_model_ready("alice")
        ready_only = await http.post("/v2/repository/index", json={"ready": True})
        assert await ready_only.json() == []

        await client.load_model("alice")  # from this machine, no token set: the admin rule
        assert await client.is_model_ready("alice")
        assert not await client.is_model_ready("bob")
        ready_only = await http.post("/v2/repository/index", json={"ready": True})
        assert await ready_only.json() == [{"name": "alice", "state": "READY", "reason": ""}]
        result = await client.infer("alice", triton_inputs(visual, audio))
        assert_output(model, visual, audio, result.as_numpy(OUTPUT))

        loaded = await http.post(
            "/v2/repository/models/bob/load", json={"parameters": {"device": 0}}
        )
        assert loaded.status == 200, await loaded.text()
        assert await client.is_model_ready("bob")
        for body, words in (
            ({"parameters": {"device": 3}}, "device 3 does not exist"),
            ({"parameters": {"device": "0"}}, "parameters.device"),
            ({"parameters": {"config": "{}"}}, "only the parameter 'device'"),
        ):
            bad = await http.post("/v2/repository/models/bob/load", json=body)
            assert bad.status == 400
            assert words in (await bad.json())["error"]
        (stats,) = (await client.get_inference_statistics("alice"))["model_stats"]
        # Refused before the core: not a failed inference. One request of two frames ran.
        assert stats["inference_stats"]["fail"]["count"] == 0
        assert stats["inference_stats"]["success"]["count"] == 1
        assert stats["inference_count"] == 2


def _header(inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def _binary(name: str, datatype: str, shape: list[Any], size: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape,
            "parameters": {"binary_data_size": size}}  # fmt: skip


def _declared(n: int = 1, *, visual_size: Any = None, shape: list[Any] | None = None) -> bytes:
    """A float request's JSON header for ``n`` frames (sizes true unless told)."""
    visual_bytes = n * 6 * S * S * 4
    return _header(
        [
            _binary(
                VISUAL,
                "FP32",
                [n, 6, S, S] if shape is None else shape,
                visual_bytes if visual_size is None else visual_size,
            ),
            _binary(AUDIO, "FP32", [n, *AUDIO_SHAPE], n * 32 * 16 * 16 * 4),
        ]
    )


async def _raw_post(port: int, path: str, head: bytes, length: int) -> tuple[int, dict[str, Any]]:
    """POST whose ``Content-Length`` promises ``length`` bytes of which only the JSON header
    ``head`` is sent: an answer proves the server refused before reading the tensors."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {length}\r\n"
            f"{HEADER}: {len(head)}\r\nConnection: close\r\n\r\n".encode()
            + head
        )
        await writer.drain()
        status_line = await reader.readline()
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers["content-length"]))
        return int(status_line.split()[1]), json.loads(body)
    finally:
        writer.close()


async def test_malformed_bodies_are_refused_before_their_tensors_are_read(
    tmp_path: Path,
) -> None:
    model = avatar(tmp_path / "avatars")
    infer = "/v2/models/alice/infer"
    one = frames(1, uint8=False)
    blobs = one[0].tobytes() + one[1].tobytes()
    async with _serving(_settings(tmp_path / "avatars")) as (http, url):
        port = http.port
        assert port is not None
        # Declared, never sent: a lie, or a shape no request may have, is answered at once.
        huge = 10**13
        for head, words in (
            (_declared(visual_size=16), "binary_data_size is 16"),
            (_declared(visual_size=huge), f"binary_data_size is {huge}"),
            (_declared(shape=[10**12, 6, S, S], visual_size=huge), "the batch axis is"),
            (_declared(shape=[2**70, 6, S, S], visual_size=huge), "the batch axis is"),
            (_declared(shape=[1, 6, S, 10**9]), "must have shape"),
            (_declared(shape=[-1, 6, S, S]), "the batch axis is -1"),
            (_declared(shape=[1.5, 6, S, S]), "must be a list of integers"),
            (_declared(shape=["1", 6, S, S]), "must be a list of integers"),
            (_declared(shape=[1] * 10_000), "must have shape"),
            (_declared(shape=[]), "must have shape"),
            (b'{"inputs": [', "not valid JSON"),
            (b"[" * 100_000, "nests too deeply"),
            (b'["inputs"]', "must be a JSON object"),
        ):
            status, body = await _raw_post(port, infer, head, len(head) + huge)
            assert status == 400, (head[:80], body)
            assert isinstance(body["error"], str)
            assert words in body["error"], body

        # Sent whole, and wrong: the header, the sizes, the values.
        head = _declared()
        sent = head + blobs
        gzipped = {HEADER: str(len(head)), "Content-Encoding": "gzip"}
        for data, headers, status, words in (
            (sent, {HEADER: str(len(sent) + 1)}, 400, "cannot run past the body"),
            (sent, {HEADER: "-5"}, 400, "non-negative integer"),
            (sent, {HEADER: "x1"}, 400, "non-negative integer"),
            (sent[:-4], {HEADER: str(len(head))}, 400, "after the JSON header"),
            (sent + b"0000", {HEADER: str(len(head))}, 400, "after the JSON header"),
            (head, {}, 400, f"need the {HEADER} header"),
            (gzip.compress(sent)[:-30], gzipped, 400, "bytes short in the tensors"),
            (gzip.compress(sent + b"00"), gzipped, 400, "runs on past the tensors"),
        ):
            answer = await http.post(infer, data=data, headers=headers)
            assert answer.status == status, await answer.text()
            assert words in (await answer.json())["error"]

        async def truncated() -> AsyncIterator[bytes]:  # chunked: the body just ends
            yield head
            yield blobs[: len(blobs) // 2]

        cut = await http.post(infer, data=truncated(), headers={HEADER: str(len(head))})
        assert cut.status == 400
        assert "bytes short in the tensors" in (await cut.json())["error"]

        def tensor(name: str, datatype: str, shape: list[int], data: Any) -> dict[str, Any]:
            return {"name": name, "datatype": datatype, "shape": shape, "data": data}

        audio = one[1].ravel().tolist()
        regions = np.zeros(S * S * 3, dtype=np.uint8).tolist()
        for inputs, words in (
            ([tensor(VISUAL, "UINT8", [1, S, S, 3], regions[:-1]), tensor(AUDIO, "FP32",
              [1, *AUDIO_SHAPE], audio)], "needs 307200"),
            ([tensor(VISUAL, "UINT8", [1, S, S, 3], [256, *regions[1:]]), tensor(AUDIO, "FP32",
              [1, *AUDIO_SHAPE], audio)], "UINT8 values are 0..255"),
            ([tensor(VISUAL, "UINT8", [1, S, S, 3], [0.5, *regions[1:]]), tensor(AUDIO, "FP32",
              [1, *AUDIO_SHAPE], audio)], "only integers"),
            ([tensor(VISUAL, "UINT8", [1, S, S, 3], regions), tensor(AUDIO, "FP32",
              [1, *AUDIO_SHAPE], ["x", *audio[1:]])], "only numbers"),
            ([tensor(VISUAL, "UINT8", [1, S, S, 3], regions), tensor(AUDIO, "FP32",
              [1, *AUDIO_SHAPE], [[1.0], [2.0, 3.0]])], "nested evenly"),
            ([tensor(VISUAL, "UINT8", [1, S, S, 3], regions), {**tensor(AUDIO, "FP32",
              [1, *AUDIO_SHAPE], audio), "parameters": {"shared_memory_region": "r"}}],
             "shared memory"),
        ):  # fmt: skip
            answer = await http.post(infer, data=_header(inputs))
            assert answer.status == 400, await answer.text()
            assert words in (await answer.json())["error"]

        # JSON data nested as the shape is, mixed with a binary input, the output as bytes.
        visual, audio_window = frames(1, uint8=True, seed=5)
        mixed_head = _header(
            [
                tensor(VISUAL, "UINT8", [1, S, S, 3], visual.tolist()),
                _binary(AUDIO, "FP32", [1, *AUDIO_SHAPE], audio_window.nbytes),
            ],
            id="mixed",
            outputs=[{"name": OUTPUT, "parameters": {"binary_data": True}}],
        )
        answer = await http.post(
            infer, data=mixed_head + audio_window.tobytes(), headers={HEADER: str(len(mixed_head))}
        )
        assert answer.status == 200, await answer.text()
        length = int(answer.headers[HEADER])
        content = await answer.read()
        described = json.loads(content[:length])
        assert described["id"] == "mixed"
        size = described["outputs"][0]["parameters"]["binary_data_size"]
        faces = np.frombuffer(content[length:], np.uint8)
        assert faces.size == size == S * S * 3
        assert_output(model, visual, audio_window, faces.reshape(1, S, S, 3))

        # After all that, the server answers a good request as ever.
        async with triton_aio.InferenceServerClient(url) as client:
            good = await client.infer("alice", triton_inputs(*one))
            assert_output(model, *one, good.as_numpy(OUTPUT))


async def test_protocol_routes_answer_errors_in_the_protocols_shape(tmp_path: Path) -> None:
    avatar(tmp_path / "avatars")
    async with _serving(_settings(tmp_path / "avatars", server={"admin_token": TOKEN})) as (
        http,
        _,
    ):
        for method, path, status in (
            ("GET", "/v2/models/nobody", 404),
            ("GET", "/v2/models/Bad.Id", 400),
            ("GET", "/v2/models/alice/versions/7", 404),
            ("GET", "/v2/models/alice/versions/7/config", 404),
            ("GET", "/v2/models/nobody/stats", 404),
            ("GET", "/v2/models/alice/ready", 400),  # registered, not loaded
            ("POST", "/v2/repository/models/alice/load", 401),  # the admin token is set
            ("POST", "/v2/repository/models/alice/unload", 401),
            ("POST", "/v2/models/nobody/infer", 404),
        ):
            answer = await http.request(method, path)
            assert answer.status == status, (path, await answer.text())
            body = await answer.json()
            assert isinstance(body["error"], str), body
        assert (await http.post("/v2/repository/models/alice/load")).headers[
            "WWW-Authenticate"
        ] == "Bearer"
        loaded = await http.post("/v2/repository/models/alice/load", headers=BEARER)
        assert loaded.status == 200
        assert (await http.get("/v2/models/alice/versions/uint8/ready")).status == 200
        assert (await http.get("/v2/health/ready")).status == 200
        assert (await http.get("/v2/health/live")).status == 200
        bad_index = await http.post("/v2/repository/index", data=b'{"ready": "yes"}')
        assert bad_index.status == 400
        assert isinstance((await bad_index.json())["error"], str)
