"""A front and two worker processes on a real local Ray cluster of two nodes: real aiortc
calls through the front, placed by model affinity and room, controlled through it; a
worker killed, a worker hung and a node lost mid-call while the other worker's call keeps
streaming (``docs/design/cluster.md`` §14)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import ray
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection
from prometheus_client.parser import text_string_to_metric_families
from ray.cluster_utils import Cluster

from benchmarks.chromium import caller_page
from config.settings import Settings
from tests.live_calls import (
    SLACK_MARGIN_MS,
    TIMEOUT_S,
    assert_lip_synced,
    speech_frames,
    until,
)
from tests.livekit_room import Agent
from tests.livekit_server import run_livekit
from tests.media import resample_linear, speech_with_pauses, write_wav
from tests.packages import make_package
from tests.webrtc_client import Caller
from tests.whep_viewer import Viewer
from web.cluster.app import FRONT, build_front_app
from web.cluster.front import ClusterFront
from web.cluster.placement import parse_session_id

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

MAX_SESSIONS_PER_WORKER = 3


NODE = {"num_cpus": 2, "num_gpus": 1, "object_store_memory": 80 * 1024 * 1024}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    """Two Ray nodes on this machine, each with one logical GPU: a worker declared one GPU
    fits on each node, so the two workers land on different nodes."""
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def front(
    ray_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[TestClient[Any, Any]]:
    root = tmp_path_factory.mktemp("cluster")
    make_package(root / "alice")
    make_package(root / "bob")
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
            "devices": {"kind": "cpu", "count": 1},
            "video": {"preset": "ultrafast"},
            "server": {"ice_loopback_only": True, "max_sessions": MAX_SESSIONS_PER_WORKER},
            # Slack (tests/live_calls.py): the lip-synced call shares the two cores with
            # two more 720p calls, a model loaded for a switch, two workers and the three
            # callers decoding in this process (52 of 55 frames due at the default margin
            # under a busy loop); what these tests ask is where calls go and that control
            # reaches them.
            "session": {"pipeline_margin_ms": SLACK_MARGIN_MS},
            "livekit": {"allow_private": True},  # its test server is on loopback
            # A healthy worker's report must not miss its timeout on a loaded machine.
            "cluster": {
                "workers": 2,
                "cpus_per_worker": 1,
                "gpus_per_worker": 1,
                "report_timeout_s": 3.0,
            },
        }
    )
    async with TestClient(TestServer(build_front_app(settings), host="127.0.0.1")) as client:
        yield client


def _cluster(client: TestClient[Any, Any]) -> ClusterFront:
    return client.app[FRONT]  # type: ignore[no-any-return]


def _worker_of(caller: Caller) -> str:
    address = parse_session_id(caller.session_id)
    assert address is not None, caller.session_id
    return address.worker


async def _one_call_per_worker(front: TestClient[Any, Any]) -> list[Caller]:
    """An alice call and a bob call on different workers, whatever earlier tests loaded:
    with no model loaded anywhere, each new avatar goes to the emptier worker."""
    cluster = _cluster(front)
    await cluster.refresh()  # so the unloads reach every worker that holds a model
    for avatar in ("alice", "bob"):
        unloaded = await front.post(f"/admin/models/{avatar}/unload")
        assert unloaded.status in (200, 409), await unloaded.text()  # 409: loaded nowhere
    calls = [Caller(front, "alice"), Caller(front, "bob")]
    for caller in calls:
        await cluster.refresh()
        await caller.connect()
        await caller.wait_for_frames(3)
    assert _worker_of(calls[0]) != _worker_of(calls[1])
    return calls


async def test_workers_report_and_the_front_is_ready(front: TestClient[Any, Any]) -> None:
    ready = await front.get("/ready")
    assert ready.status == 200, await ready.text()
    assert (await ready.json())["workers"] == {"up": 2, "total": 2}
    listed = (await (await front.get("/admin/workers")).json())["workers"]
    assert [w["name"] for w in listed] == ["w0", "w1"]
    assert all(w["answering"] for w in listed)
    pids = {w["report"]["pid"] for w in listed}
    assert len(pids) == 2
    assert os.getpid() not in pids  # each worker is its own process
    # Each worker was declared one GPU: each has its node's, as Ray set it.
    assert [w["report"]["gpus"] for w in listed] == ["0", "0"]
    assert len({w["report"]["node_id"] for w in listed}) == 2  # one worker per node
    # Pages any worker serves come through the front.
    avatars = await front.get("/avatars")
    assert avatars.status == 200
    assert {a["id"] for a in (await avatars.json())["avatars"]} == {"alice", "bob"}


async def test_bad_input_is_refused_at_the_front(front: TestClient[Any, Any]) -> None:
    bad_json = await front.post("/offer", data=b"{not json", headers={"Content-Type": "x"})
    assert bad_json.status == 400
    assert (await bad_json.json())["error"]["code"] == "bad_json"
    bad_sdp = await front.post("/offer", json={"sdp": "v=0", "type": "offer", "avatar": "alice"})
    assert bad_sdp.status == 400, await bad_sdp.text()
    for session_id in ("nope", "w9-abcd-token", "w0"):
        gone = await front.get(f"/sessions/{session_id}")
        assert gone.status == 404
        assert (await gone.json())["error"]["code"] == "session_not_found"
    assert sum(w.report.live_sessions for w in _cluster(front).workers.values() if w.report) == 0


async def test_calls_are_placed_by_model_then_room_and_controlled_through_the_front(
    front: TestClient[Any, Any], tmp_path: Path
) -> None:
    cluster = _cluster(front)
    pcm, spans = speech_with_pauses(tmp_path, ("one two three four five six",), 0.5)
    wav = write_wav(tmp_path / "mic.wav", pcm, 16_000)
    first, second, other = Caller(front, "alice"), Caller(front, "alice"), Caller(front, "bob")
    try:
        await first.connect(microphone=wav)
        await first.wait_for_frames(3)
        await cluster.refresh()
        await second.connect()
        await second.wait_for_frames(3)
        # The second alice call goes where alice's model is loaded.
        assert _worker_of(second) == _worker_of(first)
        await cluster.refresh()
        await other.connect()
        await other.wait_for_frames(3)
        # bob is loaded nowhere: the worker with more room (no calls) takes it.
        assert _worker_of(other) != _worker_of(first)
        assert first.received.video_codec == "video/H264"

        # Session control reaches the right worker.
        said = await front.post(f"/sessions/{other.session_id}/say", json={"text": "hello"})
        assert said.status == 202, await said.text()
        interrupted = await front.post(f"/sessions/{other.session_id}/interrupt")
        assert interrupted.status == 200, await interrupted.text()
        # A switch of avatar goes to the worker holding the call, which loads the model.
        switched = await front.post(
            f"/sessions/{other.session_id}/avatar", json={"avatar": "alice"}
        )
        assert switched.status == 200, await switched.text()
        assert (await switched.json())["previous"] == "bob"
        moved = await (await front.get(f"/sessions/{other.session_id}")).json()
        assert moved["avatar"] == "alice"
        await other.wait_for_frames(len(other.received.video_times) + 25)  # it streams on

        # The microphone call is lip-synced through its worker.
        async def spoken() -> dict[str, Any] | None:
            state = await (await front.get(f"/sessions/{first.session_id}")).json()
            return state if state["frames_inferred"] > 0 else None

        state = await until(spoken, "lip-synced frames on the microphone call")
        assert state["session_id"] == first.session_id
        await first.wait_for_media(sum(end for _, end in spans[-1:]) + 0.5)
        state = await (await front.get(f"/sessions/{first.session_id}")).json()
        assert_lip_synced(state, due_at_least=0.5 * speech_frames(spans))
    finally:
        for caller in (first, second, other):
            await caller.hang_up()
    ended = await front.get(f"/sessions/{other.session_id}")
    assert ended.status == 404


async def test_audio_streams_and_events_flow_through_the_front(
    front: TestClient[Any, Any], tmp_path: Path
) -> None:
    """The WebSocket and the server-sent events of a session on a worker, through the front:
    relayed both ways as they flow, refusals with the worker's own status and code."""
    caller = Caller(front, "alice")
    await caller.connect()
    try:
        await caller.wait_for_frames(3)
        sid = caller.session_id
        sse = await front.get(f"/sessions/{sid}/events")
        assert sse.status == 200
        assert sse.headers["Content-Type"] == "text/event-stream"
        ws = await front.ws_connect(f"/sessions/{sid}/audio/stream?format=s16le&rate=16000")
        busy = await front.get(f"/sessions/{sid}/audio/stream?format=s16le&rate=16000")
        assert busy.status == 409
        assert (await busy.json())["error"]["code"] == "stream_busy"
        bad = await front.get(f"/sessions/{sid}/audio/stream?format=s24le&rate=16000")
        assert (await bad.json())["error"]["code"] == "bad_stream_format"
        ready = await ws.receive_json()
        assert ready["type"] == "ready"
        assert ready["session_id"] == sid
        pcm, _ = speech_with_pauses(tmp_path, ("hello through the front",), pause_s=0.05)
        for start in range(0, len(pcm), 1600):
            await ws.send_bytes((pcm[start : start + 1600] * 32767).astype("<i2").tobytes())
        await ws.send_json({"type": "end"})
        seen: list[str] = []
        while "speech_ended" not in seen:
            seen.append((await ws.receive_json(timeout=TIMEOUT_S))["type"])
        assert "speech_started" in seen
        await ws.send_bytes(b"\x00")  # half a sample: told, and the stream stays open
        while (error := await ws.receive_json(timeout=TIMEOUT_S))["type"] != "error":
            pass
        assert error["code"] == "bad_frame"
        hung_up = await front.delete(f"/sessions/{sid}")
        assert hung_up.status == 200
        while (closing := await ws.receive(timeout=TIMEOUT_S)).type != WSMsgType.CLOSE:
            assert closing.type not in (WSMsgType.CLOSED, WSMsgType.ERROR), closing
        assert closing.data == 1000  # the worker's close code, passed on
        text = (await sse.read()).decode()  # relayed until the session ended
        for kind in ("queued_ms", "speech_started", "speech_ended", "session_ended"):
            assert f"event: {kind}" in text, text[-500:]
    finally:
        await caller.close()


async def test_a_callerless_session_is_placed_and_watched_through_the_front(
    front: TestClient[Any, Any], tmp_path: Path
) -> None:
    cluster = _cluster(front)
    anchor = Caller(front, "bob")
    try:
        await anchor.connect()
        await anchor.wait_for_frames(3)
        await cluster.refresh()
        created = await front.post("/sessions", json={"avatar": "bob"})
        assert created.status == 201, await created.text()
        sid = (await created.json())["session_id"]
        assert created.headers["Location"] == f"/sessions/{sid}"
        address = parse_session_id(sid)
        assert address is not None
        assert address.worker == _worker_of(anchor)  # placed where bob's model is
        viewer = Viewer(front, sid)
        try:
            await viewer.watch()  # the answer, its Location, through the front
            assert viewer.location.startswith(f"/sessions/{sid}/whep/")
            await until(lambda: len(viewer.watched.pictures) >= 25, "25 pictures")
            assert await viewer.leave() == 200
        finally:
            await viewer.close()
        refused = await front.post("/sessions", json={"avatar": "Bad.Id"})
        assert refused.status == 400
        publisher = RTCPeerConnection()  # a WHIP publisher, placed where bob's model is
        try:
            publisher.addTransceiver("audio", direction="sendonly")
            await publisher.setLocalDescription(await publisher.createOffer())
            published = await front.post(
                "/whip/bob",
                data=publisher.localDescription.sdp,
                headers={"Content-Type": "application/sdp"},
            )
            assert published.status == 201, await published.text()
            location = published.headers["Location"]
            whip_address = parse_session_id(location.removeprefix("/sessions/"))
            assert whip_address is not None
            assert whip_address.worker == _worker_of(anchor)
            assert (await front.delete(location)).status == 200
        finally:
            await publisher.close()
        assert (await front.delete(f"/sessions/{sid}")).status == 200
        # Placement reads the workers' reports: the last, with three sessions on the
        # anchor's worker, left it no room on two cores (seen running this test alone).
        await cluster.refresh()
        await _livekit_placed(front, tmp_path, _worker_of(anchor))
    finally:
        await anchor.hang_up()

    async def emptied() -> bool:  # the next test places calls by the workers' reports
        await cluster.refresh()
        reports = [w.report for w in cluster.workers.values()]
        return all(r is not None and r.live_sessions == 0 for r in reports)

    await until(emptied, "both workers to report no session")


async def _livekit_placed(front: TestClient[Any, Any], tmp_path: Path, worker: str) -> None:
    """A LiveKit agent's avatar, posted to the front, joins its room from the worker
    that holds bob's model."""
    with run_livekit(tmp_path / "livekit") as livekit:
        agent = Agent(livekit, "room-front")
        await agent.connect()
        try:
            body = {"livekit_url": livekit.url, "avatar": "bob"}
            refused = await front.post(
                "/livekit/sessions", json={**body, "livekit_token": "not-a-token"}
            )
            assert (await refused.json())["error"]["code"] == "bad_livekit_token"
            created = await front.post(
                "/livekit/sessions", json={**body, "livekit_token": agent.avatar_token()}
            )
            assert created.status == 201, await created.text()
            answer = await created.json()
            address = parse_session_id(answer["session_id"])
            assert address is not None
            assert address.worker == worker
            await until(lambda: "avatar-room-front" in agent.room.remote_participants, "the avatar")
            assert (await front.delete(f"/sessions/{answer['session_id']}")).status == 200
        finally:
            await agent.close()


async def test_a_full_cluster_refuses_with_retry_after(front: TestClient[Any, Any]) -> None:
    cluster = _cluster(front)
    pending = [Caller(front, "alice") for _ in range(2 * MAX_SESSIONS_PER_WORKER)]
    try:
        for caller in pending:  # answered but never connected: each holds a place
            await caller.connect_without_answer()
        assert {_worker_of(c) for c in pending} == {"w0", "w1"}
        await cluster.refresh()
        extra = Caller(front, "bob")
        pc_offer = await front.post(
            "/offer",
            json={"sdp": await _offer_sdp(extra), "type": "offer", "avatar": "bob"},
        )
        assert pc_offer.status == 503, await pc_offer.text()
        assert pc_offer.headers["Retry-After"] == "5"
        assert (await pc_offer.json())["error"]["code"] == "too_many_sessions"
        await extra.close()
    finally:
        for caller in pending:
            await caller.hang_up()


async def _offer_sdp(caller: Caller) -> str:
    caller.pc.addTransceiver("video", direction="recvonly")
    await caller.pc.setLocalDescription(await caller.pc.createOffer())
    return str(caller.pc.localDescription.sdp)


async def test_a_killed_worker_loses_its_calls_and_the_other_keeps_streaming(
    front: TestClient[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    cluster = _cluster(front)
    victim, survivor = await _one_call_per_worker(front)
    try:
        lost = _worker_of(victim)
        assert _worker_of(survivor) != lost
        before = cluster.workers[lost].report
        assert before is not None
        os.kill(before.pid, signal.SIGKILL)
        # Before any report shows it: an offer for alice tries the dead worker first (it
        # held alice's model), finds it not answering and goes to the other one.
        at_once = Caller(front, "alice")
        with caplog.at_level(logging.WARNING, logger="web.cluster.app"):
            await at_once.connect()
        assert _worker_of(at_once) == _worker_of(survivor)
        assert f"cluster: worker {lost} did not answer" in caplog.text
        await at_once.hang_up()

        async def restarted() -> bool:
            await cluster.refresh()
            report = cluster.workers[lost].report
            return report is not None and report.incarnation != before.incarnation

        await until(restarted, f"Ray to restart worker {lost}")
        assert cluster.workers[lost].restarts == 1  # counted, and served by /metrics
        scraped = await (await front.get("/metrics")).text()
        assert "lipstream_cluster_worker_restarts_total 1.0" in scraped
        gone = await front.get(f"/sessions/{victim.session_id}")
        assert gone.status == 410
        assert (await gone.json())["error"]["code"] == "session_lost"
        # The other worker's call kept going: it receives frames after the kill.
        received = len(survivor.video_indices)
        await survivor.wait_for_frames(received + 10)
        state = await front.get(f"/sessions/{survivor.session_id}")
        assert state.status == 200
        # New calls are taken again, by a worker that answers.
        fresh = Caller(front, "alice")
        await fresh.connect()
        await fresh.wait_for_frames(3)
        await fresh.hang_up()
    finally:
        await victim.close()
        await survivor.hang_up()


async def test_a_hung_worker_is_skipped_and_the_front_keeps_answering(
    front: TestClient[Any, Any],
) -> None:
    cluster = _cluster(front)
    await cluster.refresh()
    hung = cluster.workers["w0"].report
    assert hung is not None
    os.kill(hung.pid, signal.SIGSTOP)  # the process stops answering anything
    try:
        await cluster.refresh()  # returns within cluster.report_timeout_s
        assert not cluster.workers["w0"].answering
        ready = await (await front.get("/ready")).json()
        assert ready["workers"] == {"up": 1, "total": 2}
        caller = Caller(front, "alice")  # alice's model may be on w0: w1 takes the call
        await caller.connect()
        await caller.wait_for_frames(3)
        assert _worker_of(caller) == "w1"
        await caller.hang_up()
    finally:
        os.kill(hung.pid, signal.SIGCONT)

    async def answering() -> bool:
        await cluster.refresh()
        return cluster.workers["w0"].answering

    await until(answering, "the resumed worker to answer again")
    report = cluster.workers["w0"].report
    assert report is not None
    assert report.incarnation == hung.incarnation  # the same process, not a restart


async def test_a_lost_node_takes_its_worker_and_the_other_node_serves_on(
    front: TestClient[Any, Any], ray_cluster: Cluster
) -> None:
    cluster = _cluster(front)
    await cluster.refresh()
    (node,) = ray_cluster.worker_nodes
    doomed = next(
        w for w in cluster.workers.values() if w.report and w.report.node_id == node.node_id
    )
    survivor = next(w for w in cluster.workers.values() if w is not doomed)
    calls = await _one_call_per_worker(front)
    try:
        (kept,) = [c for c in calls if _worker_of(c) == survivor.name]
        ray_cluster.remove_node(node)

        async def gone() -> bool:
            await cluster.refresh()
            return not doomed.answering

        await until(gone, f"the front to see worker {doomed.name} gone")
        ready = await (await front.get("/ready")).json()
        assert ready["workers"] == {"up": 1, "total": 2}
        # The surviving node's call goes on, and new calls go there.
        received = len(kept.video_indices)
        await kept.wait_for_frames(received + 10)
        fresh = Caller(front, "alice")
        await fresh.connect()
        await fresh.wait_for_frames(3)
        assert _worker_of(fresh) == survivor.name
        await fresh.hang_up()
    finally:
        for caller in calls:
            await caller.close()
        ray_cluster.add_node(**NODE)  # Ray restarts the lost worker on the new node

    async def back() -> bool:
        await cluster.refresh()
        return doomed.answering

    await until(back, f"worker {doomed.name} to come back on a new node")


async def test_admin_and_metrics_cover_every_worker(front: TestClient[Any, Any]) -> None:
    one, two = await _one_call_per_worker(front)
    try:
        where = {one.session_id: _worker_of(one), two.session_id: _worker_of(two)}

        listed = await (await front.get("/admin/sessions")).json()
        assert {s["id"]: s["worker"] for s in listed["sessions"]} == where
        assert listed["unavailable"] == {}
        stats = await (await front.get("/admin/stats")).json()
        assert stats["global"]["live_sessions"] == 2
        assert (stats["global"]["workers_answering"], stats["global"]["workers"]) == (2, 2)
        assert set(stats["workers"]) == {"w0", "w1"}
        # One process's shape over both workers (what the admin page reads).
        assert [d["name"] for d in stats["devices"]] == ["w0/cpu:0", "w1/cpu:0"]
        assert [m["id"] for m in stats["models"]] == ["alice", "bob"]
        assert stats["global"]["models_registered"] == 2

        async def charted() -> dict[tuple[str, str, str], Any] | None:
            history = await (await front.get("/admin/history")).json()
            by_key = {(s["scope"], s["subject"], s["name"]): s for s in history["series"]}
            calls = {("session", sid, "fps") for sid in where}
            summed = by_key.get(("server", "server", "live_sessions"), {"v": []})
            return by_key if calls <= by_key.keys() and 2 in summed["v"] else None

        # The charts' history over both workers: each call, each worker's device, and the
        # workers' live sessions summed at one sample time.
        series = await until(charted, "both calls in the front's /admin/history")
        for worker in ("w0", "w1"):
            assert ("device", f"{worker}/cpu:0", "busy_share") in series
            assert ("server", worker, "live_sessions") in series
        assert max(series[("server", "server", "live_sessions")]["v"]) == 2  # never more
        assert 0 <= stats["cache"]["hit_rate"] <= 1
        loaded_on = {m["id"]: m["loaded_on"] for m in stats["models"]}
        assert loaded_on["alice"] == [where[one.session_id]]
        models = (await (await front.get("/admin/models")).json())["models"]
        assert sorted((m["id"], m["worker"]) for m in models) == [
            ("alice", "w0"),
            ("alice", "w1"),
            ("bob", "w0"),
            ("bob", "w1"),
        ]
        # A load can target a worker: bob on alice's worker.
        target = where[one.session_id]
        loaded = await front.post(f"/admin/models/bob/load?worker={target}")
        assert loaded.status == 200, await loaded.text()
        models = (await (await front.get("/admin/models")).json())["models"]
        states = {(m["id"], m["worker"]): m["state"] for m in models}
        assert states[("bob", target)] == "loaded"
        unknown = await front.post("/admin/models/bob/load?worker=w7")
        assert unknown.status == 404
        # The admin page's device index names a worker's device: device 1 is w1's cpu:0.
        by_index = await front.post("/admin/models/alice/load", json={"device": 1})
        assert by_index.status == 200, await by_index.text()
        assert [m["worker"] for m in (await by_index.json())["models"]] == ["w1"]
        bad = await front.post("/admin/models/alice/load", json={"device": 9})
        assert bad.status == 400
        assert "0=w0/0, 1=w1/0" in (await bad.json())["error"]["message"]

        scraped = await front.get("/metrics")
        assert scraped.status == 200
        families = {f.name: f for f in text_string_to_metric_families(await scraped.text())}
        live = [s for s in families["lipstream_sessions_live"].samples]
        assert sorted(s.labels["worker"] for s in live) == ["w0", "w1"]
        assert sum(s.value for s in live) == 2
        workers = {
            s.labels["state"]: s.value for s in families["lipstream_cluster_workers"].samples
        }
        assert workers == {"answering": 2, "not_answering": 0}
        for family in families.values():
            for sample in family.samples:
                assert one.session_id not in sample.labels.values()

        # The operator's admin rule holds at the front: a proxied request is not local.
        proxied = await front.get("/admin/sessions", headers={"X-Forwarded-For": "203.0.113.9"})
        assert proxied.status == 403
        ended = await front.delete(f"/admin/sessions/{one.session_id}")
        assert ended.status == 200, await ended.text()
        assert (await front.get(f"/sessions/{one.session_id}")).status == 404
    finally:
        await one.close()
        await two.hang_up()


async def test_a_second_front_shares_the_workers_and_leaves_them_running(
    front: TestClient[Any, Any],
) -> None:
    cluster = _cluster(front)
    await cluster.refresh()
    before = {n: w.report for n, w in cluster.workers.items()}
    second_app = build_front_app(cluster.settings)
    async with TestClient(TestServer(second_app, host="127.0.0.1")) as second:
        listed = (await (await second.get("/admin/workers")).json())["workers"]
        pids = {n: r.pid for n, r in before.items() if r is not None}
        assert {w["name"]: w["report"]["pid"] for w in listed} == pids  # the same processes
        caller = Caller(second, "alice")
        await caller.connect()
        await caller.wait_for_frames(3)
        # No shared state: the first front routes the second front's session by its id.
        state = await front.get(f"/sessions/{caller.session_id}")
        assert state.status == 200, await state.text()
        await caller.hang_up()
    # The second front is gone; the workers it found serve the first one as before.
    await cluster.refresh()
    for name, worker in cluster.workers.items():
        assert worker.answering, name
        assert worker.report is not None
        old = before[name]
        assert old is not None
        assert worker.report.incarnation == old.incarnation


async def test_the_demo_page_calls_through_the_front_in_a_real_browser(
    front: TestClient[Any, Any], tmp_path: Path
) -> None:
    """Debian's Chromium loads the page from the front; its call (page, avatars, offer,
    hang-up) goes through the front to a worker, and the worker's lips move."""
    pcm, _ = speech_with_pauses(tmp_path, ("one two three four five six seven",), 0.5)
    mic = write_wav(tmp_path / "mic48k.wav", resample_linear(pcm, 16_000, 48_000), 48_000)
    async with caller_page(tmp_path / "profile", mic) as page:
        page.set_default_timeout(TIMEOUT_S * 1000)
        await page.goto(f"{front.make_url('/')}?raw_audio=1")
        await page.get_by_label("Avatar", exact=True).select_option("alice")
        await page.get_by_role("button", name="Start with microphone").click()
        await page.wait_for_function(
            "() => window.lipstreamStats.state === 'connected'"
            " && window.lipstreamStats.framesDecoded > 0"
        )
        assert (await page.evaluate("() => window.lipstreamStats.codec")) == "video/H264"

        async def spoken() -> bool:
            listed = (await (await front.get("/admin/sessions")).json())["sessions"]
            assert len(listed) == 1, listed
            state = await (await front.get(f"/sessions/{listed[0]['id']}")).json()
            return bool(state["frames_inferred"] > 0)

        await until(spoken, "the browser's microphone to move the avatar's lips")
        await page.get_by_role("button", name="Hang up").click()

        async def hung_up() -> bool:
            return not (await (await front.get("/admin/sessions")).json())["sessions"]

        await until(hung_up, "the page's hang-up to end the session on its worker")


async def test_the_admin_page_works_through_the_front(
    front: TestClient[Any, Any], tmp_path: Path
) -> None:
    caller = Caller(front, "bob")
    await caller.connect()
    try:
        await caller.wait_for_frames(3)
        mic = write_wav(tmp_path / "silence.wav", np.zeros(4800, dtype=np.int16), 48_000)
        errors: list[object] = []
        async with caller_page(tmp_path / "profile", mic) as page:
            page.set_default_timeout(TIMEOUT_S * 1000)
            page.on("pageerror", lambda error: errors.append(error))
            await page.goto(str(front.make_url("/admin")))
            await page.wait_for_function(
                f"() => document.getElementById('sessions').textContent"
                f".includes('{caller.session_id[:10]}')"
            )
            devices = await page.evaluate("() => document.getElementById('devices').textContent")
            assert "w0/cpu:0" in devices
            assert "w1/cpu:0" in devices
        assert not errors, errors
    finally:
        await caller.hang_up()
