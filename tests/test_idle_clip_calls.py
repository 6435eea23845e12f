"""A live call plays the idle clip an app chooses (issue 28), over real WebRTC.

The avatar names ``idle`` (frames 0-9) and ``thinking`` (frames 14-29). Each received
frame is matched to the avatar frame it is closest to (Y-PSNR): while silent the call
shows its clip's frames only, and the change of clip shows no jump larger than the
avatar's own largest frame-to-frame motion.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from compositor.frame_similarity import FrameThumbnails, thumbnail
from compositor.yuv import bgr_to_i420
from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.package import AvatarPackage
from tests.live_calls import session_state, until
from tests.webrtc_client import Caller
from web.app import build_app

SIZE = (640, 360)
COUNT = 30
CLIPS = {"idle": [0, 10], "thinking": [14, 30]}
#: Grey levels of H.264 noise a received frame adds to a thumbnail distance.
CODEC_NOISE = 3.0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    avatars = tmp_path / "avatars"
    package = write_demo_avatar(avatars / "clipped", count=COUNT, size=SIZE)
    manifest = json.loads((package / "avatar.json").read_text())
    manifest["clips"] = CLIPS
    (package / "avatar.json").write_text(json.dumps(manifest))
    return avatars


@pytest.fixture
async def client(
    root: Path, tmp_path: Path, loopback: None
) -> AsyncIterator[TestClient[object, object]]:
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(tmp_path / "data"), "demo": False},
            "video": {"preset": "ultrafast", "shared_idle": True},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as test_client:
        yield test_client


def _raw_luma(root: Path) -> list[np.ndarray]:
    package = AvatarPackage.load(root / "clipped", "clipped")
    return [bgr_to_i420(cv2.imread(str(p)))[: SIZE[1]] for p in package.frame_paths]


def _closest(luma: np.ndarray, raw: list[np.ndarray]) -> int:
    errors = [float(np.mean((luma.astype(np.float32) - r.astype(np.float32)) ** 2)) for r in raw]
    return int(np.argmin(errors))


async def _read_events(
    client: TestClient[object, object], sid: str, events: list[dict[str, object]]
) -> None:
    async with client.get(f"/sessions/{sid}/events") as stream:
        events.append({"type": "(open)"})
        async for line in stream.content:
            text = line.decode().strip()
            if text.startswith("data:"):
                events.append(json.loads(text[5:]))


def _listening(events: list[dict[str, object]]) -> bool:
    return bool(events)


async def test_a_chosen_clip_plays_while_silent_and_is_entered_without_a_jump(
    client: TestClient[object, object], root: Path
) -> None:
    raw = _raw_luma(root)
    thumbs = FrameThumbnails(np.stack([thumbnail(r) for r in raw]))
    caller = Caller(client, "clipped")
    events: list[dict[str, object]] = []
    try:
        await caller.connect()
        sid = caller.session_id
        await caller.wait_for_frames(40)
        state = await session_state(client, sid)
        assert state["idle_clip"] == "idle"
        assert state["clips"] == ["idle", "thinking"]
        reader = asyncio.create_task(_read_events(client, sid, events))
        await until(lambda: _listening(events), "the events stream to open")
        response = await client.post(f"/sessions/{sid}/idle", json={"clip": "thinking"})
        body = await response.json()
        assert response.status == 200, body
        assert (body["clip"], body["previous"], body["clips"]) == (
            "thinking",
            "idle",
            ["idle", "thinking"],
        )
        await until(
            lambda: any(e["type"] == "idle_clip_changed" for e in events), "idle_clip_changed"
        )
        reader.cancel()
        events[:] = [e for e in events if e["type"] == "idle_clip_changed"]
        changed = events[-1]
        assert (changed["clip"], changed["previous"]) == ("thinking", "idle")
        first = round(float(str(changed["media_ms"])) * 25 / 1000)
        await until(lambda: max(caller.received.luma, default=0) > first + 80, "80 more frames")
        unknown = await client.post(f"/sessions/{sid}/idle", json={"clip": "dance"})
        error = (await unknown.json())["error"]
        assert unknown.status == 404
        assert error["code"] == "clip_not_found"
        assert "idle, thinking" in error["message"]

        luma = caller.received.luma
        before = [_closest(luma[i], raw) for i in sorted(luma) if 10 <= i < first - 5]
        after = [_closest(luma[i], raw) for i in sorted(luma) if first + 5 <= i <= first + 80]
        assert before
        assert after
        assert set(before) <= set(range(0, 10))
        assert set(after) <= set(range(14, 30))
        # Across the change, consecutive pictures move no more than the avatar itself does.
        own = thumbs.max_step()
        shown = [i for i in sorted(luma) if first - 5 <= i <= first + 5]
        for a, b in itertools.pairwise(shown):
            step = float(np.abs(thumbnail(luma[a]) - thumbnail(luma[b])).mean())
            assert step <= own + CODEC_NOISE, (a, b, step, own)
    finally:
        await caller.hang_up()
