"""``POST /admin/avatars/import`` through a cluster front reaches every worker.

Two real worker apps (each its own inference core and avatar root, or one root they
share) are served in this process; a Ray runtime that pretends (``tests/fake_ray.py``)
reports them to a real :class:`~web.cluster.front.ClusterFront`, as in
``tests/test_oip_rest_cluster.py``. The front sends the import to each worker in turn
(``web/cluster/avatar_import.py``): on separate roots each imports from the folder on its
own "machine", on a shared root the second registers what the first wrote, and a worker
that cannot import (the folder missing on its machine, or not answering) is named with
its reason.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.package import package_fingerprint
from tests.fake_ray import FakeRuntime, FakeWorker
from tests.test_importers import synctalk_folder
from web.app import build_app
from web.app_keys import CORE
from web.cluster.app import build_front_app
from web.cluster.front import ClusterFront
from web.cluster.placement import WorkerReport
from web.cluster.runtime import RuntimeMode

Client = TestClient[Any, Any]
TOKEN = "import-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
WANTED = {
    "source": "synctalk2d",
    "directory": "may",
    "lipsync": "may/unet_328.onnx",
    "audio_encoder": "may/audio_encoder.onnx",
    "id": "may",
}


@dataclass
class InProcessRuntime(FakeRuntime):
    """Reports that point at worker apps served in this process; a worker named in
    ``silent`` fails its reports (it hangs)."""

    apps: dict[str, tuple[str, web.Application]] = field(default_factory=dict)
    silent: set[str] = field(default_factory=set)
    pids: itertools.count[int] = field(default_factory=itertools.count)

    async def report(self, worker: FakeWorker, name: str) -> WorkerReport:
        if name in self.silent:
            raise ConnectionError("the worker does not answer")
        url, app = self.apps[name]
        core = app[CORE]
        loaded = {m for m in core.model_ids() if core.registry.entry(m).state == "loaded"}
        return WorkerReport(
            name=name,
            incarnation="i0",
            url=url,
            node="127.0.0.1",
            node_id=name,
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
    runtime: InProcessRuntime
    workers: dict[str, web.Application]


@dataclass(frozen=True)
class Machine:
    """One worker's directories: the avatars it serves and the folder imports read."""

    avatars: Path
    incoming: Path


def _settings(machine: Machine, data: Path, **sections: Any) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {
                "root": str(machine.avatars),
                "data_dir": str(data),
                "demo": False,
                "import_root": str(machine.incoming),
            },
            "devices": {"kind": "cpu", "count": 1},
            "server": {"admin_token": TOKEN},
            **sections,
        }
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SyncTalk_2D dataset folder, to be copied to each machine's import root."""
    demo = write_demo_avatar(tmp_path_factory.mktemp("demo") / "demo", count=4)
    return synctalk_folder(demo, tmp_path_factory.mktemp("dataset") / "may")


Harness = Callable[[dict[str, Machine]], AbstractAsyncContextManager[Cluster]]


@pytest.fixture
def cluster(tmp_path: Path) -> Harness:
    """A front over one worker per machine given (by worker name)."""

    @asynccontextmanager
    async def running(machines: dict[str, Machine]) -> AsyncIterator[Cluster]:
        runtime = InProcessRuntime(RuntimeMode.GIVEN)
        async with AsyncExitStack() as stack:
            workers = {}
            for name, machine in machines.items():
                app = build_app(_settings(machine, tmp_path / f"data-{name}"))
                served = await stack.enter_async_context(
                    TestClient(TestServer(app, host="127.0.0.1"))
                )
                runtime.apps[name] = (f"http://127.0.0.1:{served.port}", app)
                workers[name] = app
            front_machine = Machine(tmp_path / "front-avatars", tmp_path / "front-incoming")
            settings = _settings(
                front_machine,
                tmp_path / "data-front",
                cluster={"workers": len(machines), "report_interval_s": 60},
            )
            front = ClusterFront(settings, runtime=runtime)
            http = await stack.enter_async_context(
                TestClient(TestServer(build_front_app(settings, front=front), host="127.0.0.1"))
            )
            yield Cluster(front, http, runtime, workers)

    return running


def _machine(root: Path, source: Path | None) -> Machine:
    """A machine's directories, with the dataset in its import root when ``source``."""
    machine = Machine(root / "avatars", root / "incoming")
    machine.incoming.mkdir(parents=True)
    if source is not None:
        shutil.copytree(source, machine.incoming / "may")
    return machine


def _registered(cluster: Cluster) -> dict[str, bool]:
    return {name: "may" in app[CORE].model_ids() for name, app in cluster.workers.items()}


async def test_on_separate_roots_every_worker_imports_from_its_own_machine(
    cluster: Harness, source: Path, tmp_path: Path
) -> None:
    machines = {name: _machine(tmp_path / name, source) for name in ("w0", "w1")}
    async with cluster(machines) as running:
        assert _registered(running) == {"w0": False, "w1": False}
        response = await running.http.post("/admin/avatars/import", json=WANTED, headers=ADMIN)
        assert response.status == 201, await response.text()
        body = await response.json()
        assert (body["id"], body["frames"]) == ("may", 4)
        assert body["workers"] == {"w0": {"outcome": "imported"}, "w1": {"outcome": "imported"}}
        assert _registered(running) == {"w0": True, "w1": True}
        for machine in machines.values():
            assert (machine.avatars / "may" / "avatar.json").is_file()
        # Each worker serves it: the model loads on the worker it is asked of.
        for name in ("w0", "w1"):
            loaded = await running.http.post(f"/admin/models/may/load?worker={name}", headers=ADMIN)
            assert loaded.status == 200, await loaded.text()


async def test_on_a_shared_root_the_package_is_written_once_and_registered_by_all(
    cluster: Harness, source: Path, tmp_path: Path
) -> None:
    shared = _machine(tmp_path / "shared", source)
    async with cluster({"w0": shared, "w1": shared}) as running:
        response = await running.http.post("/admin/avatars/import", json=WANTED, headers=ADMIN)
        assert response.status == 201, await response.text()
        body = await response.json()
        assert body["workers"] == {"w0": {"outcome": "imported"}, "w1": {"outcome": "registered"}}
        assert _registered(running) == {"w0": True, "w1": True}
        written = package_fingerprint(shared.avatars / "may")
        # One package, nothing staged or replaced beside it.
        assert sorted(p.name for p in shared.avatars.iterdir()) == ["may"]

        again = await running.http.post("/admin/avatars/import", json=WANTED, headers=ADMIN)
        assert again.status == 409  # the first worker refuses: nothing is written
        assert (await again.json())["error"]["code"] == "avatar_exists"
        assert package_fingerprint(shared.avatars / "may") == written

        loaded = await running.http.post("/admin/models/may/load?worker=w1", headers=ADMIN)
        assert loaded.status == 200, await loaded.text()
        await running.front.refresh()
        replace = await running.http.post(
            "/admin/avatars/import", json={**WANTED, "replace": True}, headers=ADMIN
        )
        assert replace.status == 409  # loaded on w1: refused at the front, for every worker
        error = (await replace.json())["error"]
        assert error["code"] == "model_in_use"
        assert "w1" in error["message"]
        assert package_fingerprint(shared.avatars / "may") == written


async def test_the_workers_that_could_not_import_are_named_with_their_reasons(
    cluster: Harness, source: Path, tmp_path: Path
) -> None:
    machines = {
        "w0": _machine(tmp_path / "w0", source),
        "w1": _machine(tmp_path / "w1", None),  # the folder is not on this machine
        "w2": _machine(tmp_path / "w2", source),
    }
    async with cluster(machines) as running:
        running.runtime.silent.add("w2")
        await running.front.refresh()
        response = await running.http.post("/admin/avatars/import", json=WANTED, headers=ADMIN)
        assert response.status == 502, await response.text()
        error = (await response.json())["error"]
        assert error["code"] == "import_incomplete"
        message = error["message"]
        assert "on w0 (imported)" in message
        assert "w1: 422 import_failed" in message
        assert "w2: not answering" in message
        assert "avatars.import_root on its own machine" in message
        assert _registered(running) == {"w0": True, "w1": False, "w2": False}
        assert not (machines["w1"].avatars / "may").exists()


async def test_a_refused_import_is_the_first_workers_answer_and_writes_nothing(
    cluster: Harness, source: Path, tmp_path: Path
) -> None:
    machines = {name: _machine(tmp_path / name, source) for name in ("w0", "w1")}
    async with cluster(machines) as running:
        escape = await running.http.post(
            "/admin/avatars/import", json={**WANTED, "lipsync": "../secret.onnx"}, headers=ADMIN
        )
        assert escape.status == 400
        assert (await escape.json())["error"]["code"] == "bad_path"
        malformed = await running.http.post(
            "/admin/avatars/import", json={**WANTED, "id": "Not An Id"}, headers=ADMIN
        )
        assert malformed.status == 400  # checked at the front
        assert (await malformed.json())["error"]["code"] == "invalid_model_id"
        anonymous = await running.http.post("/admin/avatars/import", json=WANTED)
        assert anonymous.status == 401
        assert _registered(running) == {"w0": False, "w1": False}
        for machine in machines.values():
            assert not machine.avatars.exists() or not any(machine.avatars.iterdir())
