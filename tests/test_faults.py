"""Injected faults on a real server with live calls: each one stays inside what it hit.

Every test runs the real app with in-process aiortc callers (:class:`Caller`) on real
tiny models. Faults are injected through two seams:

* the registry's ``session_factory`` (an :class:`InferenceCore` built by the test and
  handed to ``build_app``), to make a load run out of memory;
* ``LoadedModel.run_batch`` patched on the class (:class:`RunBatchFault`), to make one
  model's inference raise for a number of batches. The scheduler calls ``run_batch`` on
  the loaded model itself, so this is exactly where a broken model or a crashing
  onnxruntime would raise; other models go through the original method untouched.

Assertions are on counts and states, never on the wall clock (``tests/live_calls.py``): a
session a fault did not touch keeps streaming and keeps lip-syncing (the frames that
carried lip-sync against the frames due); frame rates are measured by
``benchmarks/sessions_per_core.py``. Tests that need inference to run keep the session
speaking until what they wait for happened, however long a loaded machine takes.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection

from config.settings import AvatarsSettings, Settings
from inference_core.adapter.onnx_io import open_session
from inference_core.adapter.serving_graph import ServingGraph
from inference_core.assets.builtin import avatar_locator
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.exceptions import ModelOutOfMemoryError
from inference_core.serving.core import InferenceCore
from inference_core.serving.devices import Device, session_config
from inference_core.serving.frame_request import FrameRequest
from inference_core.serving.loaded_model import LoadedModel
from tests.live_calls import SLACK_MARGIN_MS, assert_lip_synced, session_state, until
from tests.media import write_wav
from tests.webrtc_client import Caller
from web.app import build_app
from web.app_keys import CORE, SESSIONS

Client = TestClient[web.Request, web.Application]


@pytest.fixture
def avatar_root(tmp_path: Path) -> Path:
    """``second`` (a demo-style avatar) and ``broken`` (its copy with a corrupt model)."""
    root = tmp_path / "avatars"
    second = write_demo_avatar(root / "second", count=30)
    broken = shutil.copytree(second, root / "broken")
    (broken / "lipsync.onnx").write_bytes(b"this is not an onnx model")
    return root


def _settings(root: Path, session: dict[str, float] | None = None) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root.parent / "data")},
            "devices": {"kind": "cpu", "count": 1},
            "video": {"preset": "ultrafast"},
            "server": {"offer_rate_limit_per_minute": 0},
            "session": session or {},
        }
    )


@pytest.fixture
async def client(avatar_root: Path, loopback: None) -> AsyncIterator[Client]:
    server = TestServer(build_app(_settings(avatar_root)), host="127.0.0.1")
    async with TestClient(server) as test_client:
        yield test_client


@pytest.fixture
async def two_call_client(avatar_root: Path, loopback: None) -> AsyncIterator[Client]:
    """A server for two calls at once with slack (``tests/live_calls.py``): two calls and
    their two in-process callers decoding 720p fill the 2-core machine, and the frames it
    drops for lateness would blur what the test measures, one session's faults against
    the other's lip-sync."""
    settings = _settings(avatar_root, {"pipeline_margin_ms": SLACK_MARGIN_MS})
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as test_client:
        yield test_client


@pytest.fixture
def speech_wav(speech_16k: tuple[np.ndarray, list[tuple[float, float]]], tmp_path: Path) -> bytes:
    pcm, _ = speech_16k
    return write_wav(tmp_path / "speech.wav", pcm, 16_000).read_bytes()


class RunBatchFault:
    """Patches ``LoadedModel.run_batch`` so batches of ``model_id`` raise ``error()``.

    Batches number ``skip`` onwards fail, ``count`` of them; every other batch (and
    every other model) runs the real method. Counts the frames of the failed batches.
    """

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        model_id: str,
        error: Callable[[], BaseException],
        *,
        count: int,
        skip: int = 0,
    ) -> None:
        self.model_id = model_id
        self.left = count
        self.skip = skip
        self.ran = 0  # batches of model_id that ran successfully
        self.failed_frames = 0
        self._lock = threading.Lock()
        original = LoadedModel.run_batch

        def run_batch(model: LoadedModel, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
            if model.model_id == self.model_id:
                with self._lock:
                    fail = self.skip <= 0 and self.left > 0
                    if fail:
                        self.left -= 1
                        self.failed_frames += len(requests)
                    else:
                        self.skip -= 1
                if fail:
                    raise error()
                outputs = original(model, requests)
                with self._lock:
                    self.ran += 1
                return outputs
            return original(model, requests)

        monkeypatch.setattr(LoadedModel, "run_batch", run_batch)


async def _speak(client: Client, session_id: str, wav: bytes, times: int = 1) -> None:
    for _ in range(times):
        response = await client.post(
            f"/sessions/{session_id}/audio", data=wav, headers={"Content-Type": "audio/wav"}
        )
        assert response.status == 202, await response.text()


async def _keep_speaking(client: Client, session_id: str, wav: bytes) -> dict[str, Any]:
    """The session's state, after queueing ``wav`` again if less than 2 s of it is left."""
    state = await session_state(client, session_id)
    if state["queued_audio_s"] < 2.0:
        await _speak(client, session_id, wav)
    return state


async def _connect(client: Client, avatar: str) -> Caller:
    caller = Caller(client, avatar)
    caller.keep_luma = False
    await caller.connect(microphone=None)
    await caller.wait_for_frames(1)
    return caller


async def _offer_status(client: Client, avatar: str) -> tuple[int, dict[str, Any], str | None]:
    """POST a real offer for ``avatar`` and return status, JSON body and Retry-After."""
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        local = pc.localDescription
        response = await client.post(
            "/offer", json={"sdp": local.sdp, "type": local.type, "avatar": avatar}
        )
        body: dict[str, Any] = await response.json()
        return response.status, body, response.headers.get("Retry-After")
    finally:
        await pc.close()


async def _admin_model(client: Client, model_id: str) -> dict[str, Any]:
    listed = await (await client.get("/admin/models")).json()
    (model,) = [m for m in listed["models"] if m["id"] == model_id]
    return dict(model)


@pytest.mark.slow
async def test_a_model_that_fails_to_load_is_refused_and_others_keep_streaming(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caller = await _connect(client, "demo")
    try:
        with caplog.at_level(logging.ERROR, logger="inference_core.serving.registry"):
            status, body, _ = await _offer_status(client, "broken")
        assert status == 500
        assert body["error"]["code"] == "model_load_failed"
        assert "broken" in body["error"]["message"]
        assert "lipsync.onnx" in body["error"]["message"]

        model = await _admin_model(client, "broken")
        assert model["state"] == "failed"
        assert "broken" in model["last_error"]
        assert "lipsync.onnx" in model["last_error"]
        logged = [r for r in caplog.records if "broken failed to load" in r.getMessage()]
        assert len(logged) == 1
        assert logged[0].levelno == logging.ERROR

        # The call went on through the failed load.
        received = len(caller.received.video_times)
        await caller.wait_for_frames(received + 25)
        assert (await session_state(client, caller.session_id))["state"] == "streaming"
        assert [s.avatar_id for s in client.app[SESSIONS].sessions] == ["demo"]
    finally:
        await caller.hang_up()


@pytest.mark.slow
async def test_inference_errors_drop_one_sessions_frames_until_the_fault_stops(
    two_call_client: Client, monkeypatch: pytest.MonkeyPatch, speech_wav: bytes
) -> None:
    client = two_call_client
    fault = RunBatchFault(
        monkeypatch, "second", lambda: RuntimeError("injected inference fault"), count=15
    )
    healthy, faulty = await _connect(client, "demo"), await _connect(client, "second")
    try:
        for caller in (healthy, faulty):
            await _speak(client, caller.session_id, speech_wav, times=2)

        async def recovered() -> bool:
            state = await _keep_speaking(client, faulty.session_id, speech_wav)
            return fault.left == 0 and state["frames_inferred"] >= 10

        await until(recovered, "15 failed batches, then 10 lip-synced frames")
        sent_before = len(faulty.received.video_times)
        await faulty.wait_for_frames(sent_before + 25)  # its video goes on

        bad = await session_state(client, faulty.session_id)
        good = await session_state(client, healthy.session_id)
        assert fault.failed_frames >= 15
        assert bad["frames_dropped"].get("InferenceError") == fault.failed_frames
        assert bad["frames_inferred"] >= 10  # inference came back once the fault stopped
        assert bad["state"] == "streaming"
        # The other session lip-synced its speech through the fault.
        assert_lip_synced(good, due_at_least=25)  # no InferenceError among its drops
        stats = client.app[CORE].schedulers[0].stats()
        assert stats.models["second"].failed == fault.failed_frames
        assert stats.models["demo"].failed == 0
        assert stats.workers_restarted == 0  # an Exception costs a batch, not a worker
    finally:
        for caller in (healthy, faulty):
            await caller.hang_up()


@pytest.mark.slow
async def test_a_worker_dying_mid_call_is_replaced_and_the_call_goes_on(
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
    speech_wav: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The fifth batch of the demo model takes its worker thread down with it.
    fault = RunBatchFault(monkeypatch, "demo", lambda: SystemExit("injected"), count=1, skip=4)
    scheduler = client.app[CORE].schedulers[0]
    worker_names = sorted(
        t.name for t in threading.enumerate() if t.name.startswith(f"lipstream-{scheduler.name}-w")
    )
    caller = await _connect(client, "demo")
    try:
        with caplog.at_level(logging.ERROR, logger="inference_core.serving.scheduler"):
            await _speak(client, caller.session_id, speech_wav, times=2)

            async def recovered() -> bool:
                await _keep_speaking(client, caller.session_id, speech_wav)
                return fault.left == 0 and fault.ran >= 4 + 10

            await until(recovered, "the worker's death, then 10 more batches")
        state = await session_state(client, caller.session_id)
        received = len(caller.received.video_times)
        await caller.wait_for_frames(received + 25)  # the call goes on

        assert scheduler.stats().workers_restarted == 1
        assert state["frames_dropped"].get("InferenceError") == fault.failed_frames
        assert state["frames_inferred"] >= 10  # the call kept lip-syncing after the death
        died = [r for r in caplog.records if "died" in r.getMessage()]
        assert len(died) == 1
        assert died[0].exc_info is not None
        alive = sorted(
            t.name
            for t in threading.enumerate()
            if t.name.startswith(f"lipstream-{scheduler.name}-w")
        )
        assert alive == worker_names  # same names, same count
    finally:
        await caller.hang_up()


class OutOfMemoryOnce:
    """The registry's session-factory seam: real sessions, but listed loads run out of memory."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.calls: list[str] = []
        self.failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, graph: ServingGraph, device: Device) -> ort.InferenceSession:
        assert graph.source is not None
        model_id = graph.source.parent.name
        with self._lock:
            self.calls.append(model_id)
            if self.failures.get(model_id, 0) > 0:
                self.failures[model_id] -= 1
                raise ModelOutOfMemoryError(f"simulated: {model_id} out of memory")
        providers, options = session_config(device, self.settings.devices)
        return open_session(graph.serialized(), providers=providers, options=options)


@pytest.mark.slow
async def test_out_of_memory_on_load_evicts_an_idle_model_then_answers_503(
    avatar_root: Path, loopback: None
) -> None:
    shutil.copytree(avatar_root / "second", avatar_root / "third")
    settings = _settings(avatar_root)
    factory = OutOfMemoryOnce(settings)
    locator = avatar_locator(
        AvatarsSettings(root=avatar_root, data_dir=avatar_root.parent / "data")
    )
    core = InferenceCore(settings, locator, session_factory=factory)
    async with TestClient(TestServer(build_app(settings, core=core), host="127.0.0.1")) as client:
        registry = core.registry
        live = await _connect(client, "demo")
        callers = [live]
        try:
            loaded = await client.post("/admin/models/second/load")
            assert loaded.status == 200, await loaded.text()  # loaded and idle

            factory.failures["third"] = 1
            callers.append(await _connect(client, "third"))  # 200: the retry succeeded
            assert factory.calls[-2:] == ["third", "third"]
            assert registry.entry("second").state == "registered"  # evicted to make room
            assert registry.entry("third").state == "loaded"
            assert registry.evictions["capacity"] == 1

            # Everything loaded is held now: a second out-of-memory has nothing to evict.
            factory.failures["second"] = 2
            status, body, retry_after = await _offer_status(client, "second")
            assert status == 503
            assert body["error"]["code"] == "out_of_memory"
            assert "ran out of device memory" in body["error"]["message"]
            assert retry_after is not None
            assert int(retry_after) > 0
            assert factory.calls[-2:] == ["second", "second"]
            model = await _admin_model(client, "second")
            assert model["state"] == "failed"
            assert "out of memory" in model["last_error"]
            assert registry.evictions["capacity"] == 1  # held models were never victims

            for caller in callers:  # both live calls went on through all of it
                received = len(caller.received.video_times)
                await caller.wait_for_frames(received + 10)
            assert sorted(s.avatar_id for s in client.app[SESSIONS].sessions) == [
                "demo",
                "third",
            ]
        finally:
            for caller in callers:
                await caller.hang_up()
