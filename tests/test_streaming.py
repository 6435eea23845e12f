"""Live sessions end to end: an in-process aiortc caller talks to the real server.

The tests wait for the call's media to reach a point of the session timeline and count
what happened (``tests/live_calls.py``); frame rates are measured by the benchmarks.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from compositor.yuv import bgr_to_i420
from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.package import AvatarPackage
from streaming.audio_rates import AUDIO_CHUNK_S
from streaming.live.manager import SessionManager
from streaming.webrtc.pacing import CATCH_UP_S
from tests.live_calls import (
    SLACK_MARGIN_MS,
    assert_lip_synced,
    session_state,
    speech_frames,
    until,
)
from tests.media import speech_with_pauses, write_wav
from tests.webrtc_client import Caller
from web.app import build_app
from web.app_keys import CORE, SESSIONS

FPS = 25
CHUNK = 960  # samples of one 20 ms audio chunk at 48 kHz


@pytest.fixture
async def client(tmp_path: Path, loopback: None) -> AsyncIterator[TestClient[object, object]]:
    root = tmp_path / "avatars"
    write_demo_avatar(root / "second", count=30)
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(tmp_path / "data")},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as test_client:
        yield test_client


def _manager(client: TestClient[object, object]) -> SessionManager:
    manager: SessionManager = client.app[SESSIONS]  # type: ignore[index]
    return manager


def _package(client: TestClient[object, object], avatar: str) -> AvatarPackage:
    entry = client.app[CORE].registry.entry(avatar)  # type: ignore[index]
    assert entry.model is not None
    package: AvatarPackage = entry.model.package
    return package


class MouthProbe:
    """How far each received frame's mouth differs from the avatar's own (closed) mouth."""

    def __init__(self, package: AvatarPackage) -> None:
        self.package = package
        self.raw_luma = [
            bgr_to_i420(cv2.imread(str(p)))[: package.manifest.frame_size[1]]
            for p in package.frame_paths
        ]

    def box(self, avatar_index: int) -> tuple[slice, slice]:
        x1, y1, x2, _ = (int(v) for v in self.package.rects[avatar_index])
        side = x2 - x1
        cx, cy = x1 + side // 2, y1 + int(0.42 * side)
        return slice(cy - side // 8, cy + side // 8), slice(cx - side // 5, cx + side // 5)

    def diff(self, index: int, luma: np.ndarray) -> float:
        count = self.package.frame_count
        period = 2 * (count - 1)
        avatar_index = index % period if index % period < count else period - index % period
        rows, cols = self.box(avatar_index)
        raw = self.raw_luma[avatar_index][rows, cols].astype(np.int16)
        return float(np.abs(luma[rows, cols].astype(np.int16) - raw).mean())


async def test_call_lip_syncs_microphone_speech(
    client: TestClient[object, object], tmp_path: Path
) -> None:
    pcm, spans = speech_with_pauses(
        tmp_path, ("hello there my friend, how are you doing today",), pause_s=2.5
    )
    duration = len(pcm) / 16_000
    # 48 kHz stereo, as a browser would send it.
    t = np.arange(len(pcm) * 3) / 3
    up = np.interp(t, np.arange(len(pcm)), pcm).astype(np.float32)
    wav = write_wav(tmp_path / "mic.wav", np.repeat(up, 2), 48_000, channels=2)
    caller = Caller(client, own_remb=False)  # the subject is lip-sync at 720p, not the link
    await caller.connect(microphone=wav)
    try:
        await caller.wait_for_media(duration + 1.0)
        received = caller.received
        assert received.video_codec == "video/H264"
        assert received.size == (1280, 720)
        # Frames come on the 25 fps session timeline, in order: a busy server skips a
        # late slot, it never stretches the timeline.
        assert all(pts % (90_000 // FPS) == 0 for pts in received.video_pts)
        assert all(a < b for a, b in itertools.pairwise(caller.video_indices))
        # The same audio comes back, on its 20 ms slots, for the whole call.
        audio_slots = {pts // CHUNK for pts, _ in received.audio_energy}
        assert len(audio_slots) >= 0.5 * duration * 50, f"{len(audio_slots)} audio chunks"

        probe = MouthProbe(_package(client, "demo"))
        diffs = {i: probe.diff(i, y) for i, y in received.luma.items()}
        (start, end), slack = spans[0], 0.3  # the caller's audio starts within ~slack
        speaking = [d for i, d in diffs.items() if start + slack < i / FPS < end - slack]
        resting = [d for i, d in diffs.items() if end + 1.0 + slack < i / FPS < end + 2.5 - slack]
        pre = [d for i, d in diffs.items() if 0.5 < i / FPS < start - slack]
        assert speaking
        assert resting
        assert np.mean(np.array(speaking) > 8) > 0.5, f"mouth still while speaking: {speaking}"
        assert max(resting + pre) < 4, f"mouth moved in silence: {resting + pre}"
        # Returned audio is loud during the speech and quiet before it.
        energy = dict(received.audio_energy)
        loud = [e for pts, e in energy.items() if start + slack < pts / 48_000 < end - slack]
        quiet = [e for pts, e in energy.items() if 0.2 < pts / 48_000 < start - slack]
        assert np.mean(loud) > 10 * max(np.mean(quiet), 1e-4)
        # Lips and sound in sync: the mouth opens when the returned speech starts.
        audio_onset = min(pts for pts, e in energy.items() if e > 0.02) / 48_000
        video_onset = min(i for i, d in diffs.items() if d > 8) / FPS
        # (Should it fail: what the server skipped, and where each track's first
        # received frame and the gaps in the audio were, say whether an anchor moved.)
        sent = _manager(client).get(caller.session_id).peer.sent()
        gaps = [(a, b) for a, b in itertools.pairwise(sorted(energy)) if b - a > CHUNK]
        why = (audio_onset, video_onset, sent, caller.video_indices[:3], gaps[:5])
        assert abs(video_onset - audio_onset) <= 0.08, why
        state = await session_state(client, caller.session_id)
        assert_lip_synced(state, due_at_least=0.5 * speech_frames(spans))
    finally:
        await caller.hang_up()
    assert _manager(client).sessions == []
    entry = client.app[CORE].registry.entry("demo")  # type: ignore[index]
    assert entry.model is not None
    assert entry.model.refcount == 0  # the session let go of its model


async def test_say_audio_push_and_interrupt(
    client: TestClient[object, object], tmp_path: Path
) -> None:
    caller = Caller(client)
    await caller.connect(microphone=None)  # audio only from the HTTP APIs
    try:
        await caller.wait_for_frames(5)
        sid = caller.session_id
        said = await client.post(f"/sessions/{sid}/say", json={"text": "hello, how are you"})
        assert said.status == 202, await said.text()
        assert (await said.json())["duration_ms"] > 500

        stats = _manager(client).get(sid).stats

        async def spoke_the_text() -> bool:
            state = await session_state(client, sid)
            sent = len(stats.sending_ms["encode"]) >= 10  # lip-synced frames out
            return state["frames_inferred"] > 10 and state["queued_audio_s"] == 0 and sent

        await until(spoke_the_text, "the avatar to speak the whole text")
        # Where the added delay went: the stages account for all of it (within a frame).
        added = (await session_state(client, sid))["added_delay_ms"]
        assert set(added["stages"]) == {"features", "prepare", "inference", "compose"}
        assert added["mean"] > 0
        assert abs(sum(added["stages"].values()) - added["mean"]) <= 1000 / FPS
        # Then each frame waits for its slot (one tick + the margin after its audio was
        # complete; a track up to CATCH_UP_S late still sends it). Composed frames are
        # encoded ahead, as soon as the frame before is out, so they leave at their slot
        # (encode ~0); one composed after that is encoded at its slot. Frames go out in
        # the order they were made: the first ones made are the ones sent.
        session = _manager(client).get(sid)
        waits = list(stats.sending_ms["slot_wait"])
        made = list(stats.processing_ms)[: len(waits)]
        to_slot = (sum(made) + sum(waits)) / len(waits)
        budget_ms = session.delay_s * 1000 - session.lookahead_ms
        assert budget_ms - 1 <= to_slot <= budget_ms + CATCH_UP_S * 1000
        assert 0 <= added["sending"]["encode"] < 1000 / FPS

        phrase = "this is a long sentence that keeps on going and going for quite a good while"
        pcm, [(start, end)] = speech_with_pauses(tmp_path, (phrase,), 0.1)
        clip_s = len(pcm) / 16_000
        body = write_wav(tmp_path / "push.wav", pcm, 16_000).read_bytes()
        session = _manager(client).get(sid)
        pushed = await client.post(
            f"/sessions/{sid}/audio", data=body, headers={"Content-Type": "audio/wav"}
        )
        assert pushed.status == 202, await pushed.text()

        async def in_the_speech() -> bool:
            # The timeline has played what is no longer queued. Interrupt in the middle of
            # the sentence, a session delay into it: the caller has seen the mouth move by
            # then, and the voice is loud in the audio encoder's look-ahead.
            at = clip_s - (await session_state(client, sid))["queued_audio_s"]
            assert at < end - 1.0, f"the timeline passed the sentence's middle: {at:.2f} s"
            return at >= start + session.delay_s + 0.3

        await until(in_the_speech, "the pushed sentence to be half played", poll_s=0.02)
        stopped = await client.post(f"/sessions/{sid}/interrupt")
        assert stopped.status == 200
        assert (await stopped.json())["dropped_ms"] > 500
        # Every slot from here on is sent after the interrupt.
        sent = session.peer.sent()
        assert sent.audio_next is not None  # the caller negotiated audio
        cut_video, cut_audio = sent.video_next, sent.audio_next
        # Frames and packets made before the interrupt would be sent up to a session
        # delay later: watch past that.
        video_to = cut_video + 5 + round(session.delay_s * FPS) + 15
        audio_to = cut_audio + 10 + round(session.delay_s * 50) + 30
        received = caller.received

        def watched() -> bool:
            energy = received.audio_energy
            return (
                caller.video_indices[-1] >= video_to
                and bool(energy)
                and energy[-1][0] // CHUNK >= audio_to
            )

        await until(watched, "the media of a session delay after the interrupt")

        probe = MouthProbe(_package(client, "demo"))

        def mouth(index: int) -> float:
            return probe.diff(index, received.luma[index])

        # It was speaking when interrupted: in the last second the caller got before it.
        heard = [rms for pts, rms in received.audio_energy if 0 < cut_audio - pts // CHUNK <= 50]
        seen = [mouth(i) for i in caller.video_indices if 0 < cut_video - i <= FPS]
        assert max(heard) > 0.02
        assert max(seen) > 8
        # The voice stops with the interrupt (20 ms packets, from 200 ms on), and stays
        # off: what was encoded but not sent yet is silenced, and no speech left in the
        # Opus encoder's look-ahead comes out a session delay later.
        after = [rms for pts, rms in received.audio_energy if pts // CHUNK >= cut_audio + 10]
        assert len(after) >= 30
        assert max(after) < 0.002, [round(r, 3) for r in after]
        # The mouth rests from 200 ms after the interrupt, also a session delay later.
        tail = [i for i in caller.video_indices if i >= cut_video + 5]
        assert len(tail) >= 15
        assert max(mouth(i) for i in tail) < 4
    finally:
        await caller.hang_up()


async def test_unanswered_call_times_out_and_unused_tracks_stay_bounded(
    tmp_path: Path, loopback: None
) -> None:
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "data")},
            # Long enough for the answered call to connect on a loaded machine.
            "session": {"ice_timeout_s": 4.0},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        sessions = _manager(client)
        ghost = Caller(client)
        await ghost.connect_without_answer()
        video_only = Caller(client)
        video_only.audio = False
        await video_only.connect(microphone=None)
        try:
            await until(
                lambda: [s.session_id for s in sessions.sessions] == [video_only.session_id],
                "the unanswered call to time out",
            )
            assert sessions.counters.ended_by_reason == {"ICE timeout": 1}

            async def made_many_chunks() -> bool:  # 100 frames: 200 audio chunks made
                return (await session_state(client, video_only.session_id))["frames_sent"] >= 100

            await until(made_many_chunks, "4 s of the answered call")
            state = await session_state(client, video_only.session_id)
            # No audio track was negotiated: its chunks must not pile up (the delay's 27
            # chunks plus 50 stale slots are kept).
            assert state["buffered"]["audio_chunks"] <= 80
            frames = len(video_only.received.video_times)
            await video_only.wait_for_frames(frames + 25)  # the call goes on
        finally:
            await ghost.close()
            await video_only.hang_up()
        names = await (await client.get("/avatars")).json()
        demo = {"id": "demo", "name": "Demo avatar (procedural stand-in)", "clips": ["idle"]}
        assert names == {"avatars": [demo]}


async def test_bad_requests_to_sessions(client: TestClient[object, object]) -> None:
    missing = await client.post("/sessions/nope/say", json={"text": "hi"})
    assert missing.status == 404
    assert (await missing.json())["error"]["code"] == "session_not_found"
    bad_offer = await client.post("/offer", json={"sdp": "garbage", "type": "offer"})
    assert bad_offer.status == 400
    assert (await bad_offer.json())["error"]["code"] == "bad_offer"
    sdp = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n"
    unknown = await client.post("/offer", json={"sdp": sdp, "type": "offer", "avatar": "nobody"})
    assert unknown.status == 404
    not_json = await client.post("/offer", data=b"{", headers={"Content-Type": "application/json"})
    assert not_json.status == 400
    assert client.app[SESSIONS].sessions == []  # type: ignore[index]


@pytest.fixture
async def two_call_client(
    tmp_path: Path, loopback: None
) -> AsyncIterator[TestClient[object, object]]:
    """The server with slack for two calls at once (``tests/live_calls.py``): two 720p
    calls and their two in-process callers decoding them fill the 2-core machine (at the
    default margin 1-12 of ~65 frames due went out lip-synced there), and what the test
    asks is that each session lip-syncs its own caller with its own avatar's model."""
    root = tmp_path / "avatars"
    write_demo_avatar(root / "second", count=30)
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(tmp_path / "data")},
            "session": {"pipeline_margin_ms": SLACK_MARGIN_MS},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as test_client:
        yield test_client


async def test_two_sessions_on_different_avatars_each_lip_sync_their_caller(
    two_call_client: TestClient[object, object], tmp_path: Path
) -> None:
    client = two_call_client
    pcm, spans = speech_with_pauses(tmp_path, ("one two three four five six",), pause_s=0.5)
    wav = write_wav(tmp_path / "mic.wav", pcm, 16_000)
    callers = [Caller(client, "demo"), Caller(client, "second")]
    for caller in callers:
        caller.keep_luma = False
        await caller.connect(microphone=wav)
    try:
        for caller in callers:  # each call has played its caller's whole microphone file
            await caller.wait_for_media(len(pcm) / 16_000 + 0.5)
        states = [await session_state(client, c.session_id) for c in callers]
        assert [s["avatar"] for s in states] == ["demo", "second"]
        # Each session lip-synced its own caller's speech with its own avatar's model.
        spoken = speech_frames(spans)
        for state in states:
            assert state["state"] == "streaming"
            assert_lip_synced(state, due_at_least=0.5 * spoken)
        core = await client.app[CORE].snapshot()  # type: ignore[index]
        for avatar, state in zip(("demo", "second"), states, strict=True):
            model = core.model(avatar)
            assert model is not None
            assert model.frames >= state["frames_inferred"], (model, state)
    finally:
        for caller in callers:
            await caller.hang_up()
    assert _manager(client).sessions == []


async def test_a_stalled_server_skips_the_callers_backlog_and_keeps_its_delay(
    client: TestClient[object, object], tmp_path: Path
) -> None:
    """An event-loop stall mid-call: the microphone audio held back meanwhile arrives at
    once, after the timeline has moved on. It is skipped, so the call's delay is what
    it was (docs/design/audio-in.md §2), and nothing stays queued."""
    pcm, _ = speech_with_pauses(tmp_path, ("one two three four five six seven",), pause_s=3.0)
    caller = Caller(client, "demo")
    caller.keep_luma = False
    await caller.connect(microphone=write_wav(tmp_path / "mic.wav", pcm, 16_000))
    try:
        await caller.wait_for_media(1.0)
        # A loaded machine may have stalled already as the call started (and skipped that).
        before = (await session_state(client, caller.session_id))["inbound_skipped_ms"]
        # The stall: the event loop (server and caller alike) is held for 300 ms.
        asyncio.get_running_loop().call_soon(time.sleep, 0.3)

        async def drained() -> dict[str, Any] | None:
            state = await session_state(client, caller.session_id)
            skipped = state["inbound_skipped_ms"] > before
            return state if skipped and state["buffered"]["inbound_audio_ms"] <= 40 else None

        after = await until(drained, "the stall's backlog to be skipped")
        assert after["state"] == "streaming"
        # About the stall's worth was skipped (more only if the loaded machine stalled again).
        assert 0 < after["inbound_skipped_ms"] - before <= 1000, (before, after)
        # And nothing downstream keeps a backlog either: the audio made but not yet sent is
        # back to what the delay holds (a chunk made at the end of its 20 ms, sent a
        # delay after its start), the timeline having caught up in one job.
        steady = (after["delay_ms"] - AUDIO_CHUNK_S * 1000) / (AUDIO_CHUNK_S * 1000)

        async def steady_again() -> bool:
            waiting = (await session_state(client, caller.session_id))["buffered"]["audio_chunks"]
            return abs(waiting - steady) <= 2

        await until(steady_again, f"the send buffers back to ≈{steady:.0f} chunks")
    finally:
        await caller.hang_up()
