"""Live sessions end to end: an in-process aiortc caller talks to the real server."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from compositor.yuv import bgr_to_i420
from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.package import AvatarPackage
from tests.media import speech_with_pauses, write_wav
from tests.webrtc_client import Caller
from web.app import build_app
from web.app_keys import CORE, SESSIONS

FPS = 25


@pytest.fixture
async def client(tmp_path: Path, loopback: None) -> AsyncIterator[TestClient[object, object]]:
    root = tmp_path / "avatars"
    write_demo_avatar(root / "second", count=30)
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as test_client:
        yield test_client


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


async def test_call_lip_syncs_microphone_speech_at_25_fps(
    client: TestClient[object, object], tmp_path: Path
) -> None:
    pcm, spans = speech_with_pauses(
        tmp_path, ("hello there my friend, how are you doing today",), pause_s=2.5
    )
    # 48 kHz stereo, as a browser would send it.
    t = np.arange(len(pcm) * 3) / 3
    up = np.interp(t, np.arange(len(pcm)), pcm).astype(np.float32)
    wav = write_wav(tmp_path / "mic.wav", np.repeat(up, 2), 48_000, channels=2)
    caller = Caller(client)
    await caller.connect(microphone=wav)
    try:
        await caller.wait_for_frames(1)
        await asyncio.sleep(len(pcm) / 16_000 + 1.0)
        fps = caller.fps_since(len(pcm) / 16_000)
        received = caller.received
        assert received.video_codec == "video/H264"
        assert received.size == (1280, 720)
        assert fps >= 23, f"received {fps:.1f} fps"
        # The same audio comes back, about as long as the call.
        assert received.audio_samples / 48_000 >= len(pcm) / 16_000 - 1.0

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
        assert abs(video_onset - audio_onset) <= 0.08, (audio_onset, video_onset)
    finally:
        await caller.hang_up()
    sessions = client.app[SESSIONS]  # type: ignore[index]
    assert sessions.sessions == []
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
        await asyncio.sleep(2.5)
        state = await (await client.get(f"/sessions/{sid}")).json()
        assert state["frames_inferred"] > 10  # the avatar spoke the text

        pcm, _ = speech_with_pauses(tmp_path, ("this is a long sentence that keeps going",), 0.1)
        body = write_wav(tmp_path / "push.wav", pcm, 16_000).read_bytes()
        pushed = await client.post(
            f"/sessions/{sid}/audio", data=body, headers={"Content-Type": "audio/wav"}
        )
        assert pushed.status == 202, await pushed.text()
        await asyncio.sleep(1.2)  # speech is playing now
        speaking = caller.received.video_pts[-10:]
        heard = [rms for _, rms in caller.received.audio_energy[-25:]]
        stopped = await client.post(f"/sessions/{sid}/interrupt")
        assert stopped.status == 200
        assert (await stopped.json())["dropped_ms"] > 500
        cut_at = len(caller.received.video_pts)
        cut_audio_at = len(caller.received.audio_energy)
        await asyncio.sleep(1.0)

        # The voice stops with the interrupt (20 ms packets, from 200 ms on), and stays
        # off: what was encoded but not sent yet is silenced, and no speech left in the
        # Opus encoder's look-ahead comes out a session delay later.
        assert max(heard) > 0.02
        after = [rms for _, rms in caller.received.audio_energy[cut_audio_at + 10 :]]
        assert len(after) >= 30
        assert max(after) < 0.002, [round(r, 3) for r in after]

        probe = MouthProbe(_package(client, "demo"))

        def mouth(pts: int) -> float:
            index = round(pts * FPS / 90_000)
            return probe.diff(index, caller.received.luma[index])

        assert max(mouth(pts) for pts in speaking) > 8  # it was speaking when interrupted
        tail = caller.received.video_pts[cut_at + 5 :]  # from 200 ms after the interrupt
        assert len(tail) >= 15
        assert max(mouth(pts) for pts in tail) < 4
    finally:
        await caller.hang_up()


async def test_unanswered_call_times_out_and_unused_tracks_stay_bounded(
    tmp_path: Path, loopback: None
) -> None:
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path), "data_dir": str(tmp_path / "data")},
            "session": {"ice_timeout_s": 1.0},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        ghost = Caller(client)
        await ghost.connect_without_answer()
        video_only = Caller(client)
        video_only.audio = False
        await video_only.connect(microphone=None)
        await asyncio.sleep(2.5)
        sessions = client.app[SESSIONS]  # type: ignore[index]
        assert [s.session_id for s in sessions.sessions] == [video_only.session_id]
        state = await (await client.get(f"/sessions/{video_only.session_id}")).json()
        # No audio track was negotiated: its chunks must not pile up.
        assert state["buffered"]["audio_chunks"] <= 80
        assert video_only.fps_since(1.0) > 15
        await ghost.close()
        await video_only.hang_up()
        names = await (await client.get("/avatars")).json()
        assert names == {"avatars": [{"id": "demo", "name": "Demo avatar (procedural stand-in)"}]}


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


async def test_two_sessions_on_different_avatars_keep_25_fps(
    client: TestClient[object, object], tmp_path: Path
) -> None:
    pcm, _ = speech_with_pauses(tmp_path, ("one two three four five six",), pause_s=0.5)
    wav = write_wav(tmp_path / "mic.wav", pcm, 16_000)
    callers = [Caller(client, "demo"), Caller(client, "second")]
    for caller in callers:
        caller.keep_luma = False
        await caller.connect(microphone=wav)
    try:
        for caller in callers:
            await caller.wait_for_frames(1)
        await asyncio.sleep(6.0)
        for caller in callers:
            fps = caller.fps_since(5.0)
            assert fps >= 23, f"{caller.avatar}: {fps:.1f} fps"
        states = [await (await client.get(f"/sessions/{c.session_id}")).json() for c in callers]
        assert {s["avatar"] for s in states} == {"demo", "second"}
        assert all(s["frames_inferred"] > 0 for s in states)
    finally:
        for caller in callers:
            await caller.hang_up()
    assert math.isclose(len(client.app[SESSIONS].sessions), 0)  # type: ignore[index]
