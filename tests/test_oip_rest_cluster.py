"""The Open Inference Protocol v2 over REST through a cluster front, with ``tritonclient``.

Two real worker apps (each its own inference core) are served in this process; a Ray
runtime that pretends (``tests/fake_ray.py``) reports them to a real
:class:`~web.cluster.front.ClusterFront`, so the front routes, relays and aggregates over
real HTTP exactly as over Ray's workers. The front answers health and server metadata
itself, sends a model's requests to a worker holding it, and sums the repository and the
statistics over the workers (``web/cluster/inference_protocol.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http.aio as triton_aio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from tritonclient.utils import InferenceServerException

from config.settings import Settings
from tests.fake_ray import FakeRuntime, FakeWorker
from tests.oip_models import (
    BEARER,
    LARGE_BODY_WARNING,
    OUTPUT,
    TOKEN,
    VISUAL,
    assert_output,
    avatar,
    frames,
    triton_inputs,
)
from web.app import build_app
from web.app_keys import CORE, DOOR
from web.cluster.app import build_front_app
from web.cluster.front import ClusterFront
from web.cluster.placement import WorkerReport
from web.cluster.runtime import RuntimeMode

Client = TestClient[Any, Any]

pytestmark = pytest.mark.filterwarnings(LARGE_BODY_WARNING)


@dataclass
class InProcessRuntime(FakeRuntime):
    """Reports that point at worker apps served in this process: each worker's URL and
    the models its core has loaded. ``silent``: every report fails (the workers hang)."""

    apps: dict[str, tuple[str, web.Application]] = field(default_factory=dict)
    silent: bool = False
    pids: itertools.count[int] = field(default_factory=itertools.count)

    async def report(self, worker: FakeWorker, name: str) -> WorkerReport:
        if self.silent:
            raise ConnectionError("the worker does not answer")
        url, app = self.apps[name]
        core = app[CORE]
        loaded = {m for m in core.model_ids() if core.registry.entry(m).state == "loaded"}
        return WorkerReport(
            name=name,
            incarnation="i0",
            url=url,
            node="127.0.0.1",
            node_id="n",
            pid=next(self.pids),
            models=frozenset(loaded),
            live_sessions=0,
            room_places=3,
            room_share=0.5,
        )


@dataclass
class Cluster:
    front: ClusterFront
    http: Client  # the front's
    url: str  # the front's, as tritonclient takes it
    runtime: InProcessRuntime
    workers: dict[str, web.Application]
    model: Path

    async def door_requests(self, name: str) -> int:
        """Protocol requests the worker's own door ran for alice."""
        (figures,) = await self.workers[name][DOOR].statistics("alice")
        return figures.requests.success_count


def _settings(root: Path, data: str, **sections: Any) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root.parent / data), "demo": False},
            "devices": {"kind": "cpu", "count": 1},
            "server": {"admin_token": TOKEN},
            **sections,
        }
    )


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    root = tmp_path / "avatars"
    model = avatar(root)
    avatar(root, "bob")
    runtime = InProcessRuntime(RuntimeMode.GIVEN)
    async with AsyncExitStack() as stack:
        workers = {}
        for name in ("w0", "w1"):
            app = build_app(_settings(root, f"data-{name}"))
            served = await stack.enter_async_context(TestClient(TestServer(app, host="127.0.0.1")))
            runtime.apps[name] = (f"http://127.0.0.1:{served.port}", app)
            workers[name] = app
        # Reports are pulled when a test says so (front.refresh()), not on a timer.
        settings = _settings(root, "data-front", cluster={"workers": 2, "report_interval_s": 60})
        front = ClusterFront(settings, runtime=runtime)
        http = await stack.enter_async_context(
            TestClient(TestServer(build_front_app(settings, front=front), host="127.0.0.1"))
        )
        yield Cluster(front, http, f"127.0.0.1:{http.port}", runtime, workers, model)


async def test_the_front_serves_health_and_routes_a_models_requests_where_it_is_loaded(
    cluster: Cluster,
) -> None:
    async with triton_aio.InferenceServerClient(cluster.url) as client:
        assert await client.is_server_live()
        assert await client.is_server_ready()
        metadata = await client.get_server_metadata()
        assert "binary_tensor_data" in metadata["extensions"]
        model = await client.get_model_metadata("alice")  # read by a worker, unloaded
        assert model["inputs"][0]["name"] == VISUAL
        config = await client.get_model_config("alice", "uint8")
        assert config["input"][0]["data_type"] == "TYPE_UINT8"
        assert not await client.is_model_ready("alice")
        assert not await client.is_model_ready("nobody")

        await client.load_model("alice", headers=BEARER)  # placement: the emptier, w0
        await cluster.front.refresh()
        assert cluster.workers["w0"][CORE].is_loaded("alice")
        assert not cluster.workers["w1"][CORE].is_loaded("alice")
        assert await client.is_model_ready("alice")

        float8 = frames(8, uint8=False, seed=1)
        result = await client.infer("alice", triton_inputs(*float8))  # bytes both ways
        assert_output(cluster.model, *float8, result.as_numpy(OUTPUT))
        uint8 = frames(1, uint8=True, seed=2)
        result = await client.infer(
            "alice",
            triton_inputs(*uint8, binary=False),
            outputs=[triton_aio.InferRequestedOutput(OUTPUT, binary_data=False)],
        )
        assert_output(cluster.model, *uint8, result.as_numpy(OUTPUT))
        # Both went to the worker holding the model.
        assert [await cluster.door_requests(w) for w in ("w0", "w1")] == [2, 0]

        (stats,) = (await client.get_inference_statistics("alice"))["model_stats"]
        assert stats["inference_count"] == 9
        assert stats["inference_stats"]["success"]["count"] == 2
        assert await client.get_model_repository_index() == [
            {"name": "alice", "state": "READY", "reason": ""},
            {"name": "bob", "state": "UNAVAILABLE", "reason": "not loaded"},
        ]


async def test_the_repository_and_statistics_cover_every_worker(cluster: Cluster) -> None:
    http = cluster.http
    loaded = await http.post("/v2/repository/models/alice/load", headers=BEARER)
    assert loaded.status == 200, await loaded.text()  # placement: the emptier, w0
    # Then on a named device: the front's device list is w0's devices then w1's, so
    # index 1 is w1's device 0 (where a plain load would not go: w0 holds the model).
    on_w1 = {"parameters": {"device": 1}}
    loaded = await http.post("/v2/repository/models/alice/load", json=on_w1, headers=BEARER)
    assert loaded.status == 200, await loaded.text()
    await cluster.front.refresh()
    assert all(app[CORE].is_loaded("alice") for app in cluster.workers.values())

    for name, n in (("w0", 1), ("w1", 2)):  # each worker runs frames of its own
        url = cluster.runtime.apps[name][0].removeprefix("http://")
        async with triton_aio.InferenceServerClient(url) as worker:
            await worker.infer("alice", triton_inputs(*frames(n, uint8=True)))
    async with triton_aio.InferenceServerClient(cluster.url) as client:
        (stats,) = (await client.get_inference_statistics("alice", "uint8"))["model_stats"]
        assert stats["inference_count"] == 3
        assert stats["inference_stats"]["success"]["count"] == 2
        for key in ("queue", "compute_input", "compute_infer", "compute_output"):
            measured = stats["inference_stats"][key]  # per frame, summed over the workers
            assert measured["count"] == 3, key
            assert measured["ns"] > 0, key
        every = (await client.get_inference_statistics())["model_stats"]
        assert [(s["name"], s["inference_count"]) for s in every] == [("alice", 3), ("bob", 0)]

        await client.unload_model("alice", headers=BEARER)  # everywhere it is loaded
        await cluster.front.refresh()
        assert not any(app[CORE].is_loaded("alice") for app in cluster.workers.values())
        assert not await client.is_model_ready("alice")
        ready = await http.post("/v2/repository/index", json={"ready": True})
        assert await ready.json() == []


async def test_the_front_answers_errors_in_the_protocols_shape(cluster: Cluster) -> None:
    http = cluster.http
    device_5 = b'{"parameters": {"device": 5}}'
    configured = b'{"parameters": {"config": "{}"}}'
    for method, path, status, headers, body in (
        ("GET", "/v2/models/nobody", 404, {}, None),  # the worker's answer, relayed
        ("GET", "/v2/models/nobody/stats", 404, {}, None),
        ("GET", "/v2/models/Bad.Id/stats", 400, {}, None),
        ("GET", "/v2/models/alice/versions/9", 404, {}, None),
        ("POST", "/v2/repository/models/alice/load", 401, {}, None),  # the operator's rule
        ("POST", "/v2/repository/models/nobody/load", 404, BEARER, None),  # the worker's
        ("POST", "/v2/repository/models/alice/load", 400, BEARER, device_5),  # the front's
        ("POST", "/v2/repository/models/alice/load", 400, BEARER, configured),  # the worker's
    ):
        answer = await http.request(method, path, headers=headers, data=body)
        assert answer.status == status, (path, await answer.text())
        assert isinstance((await answer.json())["error"], str)

    cluster.runtime.silent = True
    await cluster.front.refresh()  # no worker answers now
    async with triton_aio.InferenceServerClient(cluster.url) as client:
        assert await client.is_server_live()
        assert not await client.is_server_ready()
        with pytest.raises(InferenceServerException) as unavailable:
            await client.get_model_metadata("alice")
        assert unavailable.value.status() == "503"
    answer = await http.post("/v2/models/alice/infer", data=b"{}")
    assert answer.status == 503
    assert answer.headers["Retry-After"] == "5"
    assert "no worker is answering" in (await answer.json())["error"]
    ready = await http.get("/v2/health/ready")
    assert "none of the 2 workers is answering" in (await ready.json())["error"]
