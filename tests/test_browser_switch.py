"""The demo page switches the avatar and the idle clip of a running call, in Chromium.

Headless Debian Chromium (Playwright, as ``tests/test_demo_page.py``) opens the demo page
of the real application, which serves the built-in demo avatar (1280x720) and ``negative``:
a demo-style avatar at 640x360 whose frames are the colour negative of another face, so
both the picture's size and its content tell which avatar the call shows. During the
call the avatar picker switches to ``negative``; the page then shows its frames (the
decoder's size, the mean brightness of the picture), its clips in the clip picker and
the events in its log; an interrupted sample reports how much of it was played. Every
step waits on what the page shows; nothing is timed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cv2
import pytest
from aiohttp.test_utils import TestServer

from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from tests.browser_page import browser_page
from web.app import build_app

if TYPE_CHECKING:
    from playwright.async_api import Page, Response

pytestmark = pytest.mark.slow

SMALL = (640, 360)

# The mean brightness of the picture now (0-255), drawn at 64x36.
BRIGHTNESS = """() => {
  const video = document.getElementById("video");
  const canvas = document.createElement("canvas");
  canvas.width = 64;
  canvas.height = 36;
  const context = canvas.getContext("2d");
  context.drawImage(video, 0, 0, 64, 36);
  const { data } = context.getImageData(0, 0, 64, 36);
  let sum = 0;
  for (let i = 0; i < data.length; i += 4) sum += (data[i] + data[i + 1] + data[i + 2]) / 3;
  return sum / (data.length / 4);
}"""


def write_negative_avatar(root: Path) -> Path:
    """``negative``: a 640x360 demo-style avatar, every frame its colour negative, with
    two idle clips."""
    package = write_demo_avatar(root / "negative", count=30, size=SMALL, seed=7)
    for path in sorted((package / "frames").glob("*.jpg")):
        image = cv2.imread(str(path))
        assert image is not None, path
        assert cv2.imwrite(str(path), 255 - image, [cv2.IMWRITE_JPEG_QUALITY, 92])
    manifest = json.loads((package / "avatar.json").read_text())
    manifest["clips"] = {"idle": [0, 15], "listening": [15, 30]}
    (package / "avatar.json").write_text(json.dumps(manifest))
    return package


@pytest.fixture
async def server(tmp_path: Path, loopback: None) -> AsyncIterator[TestServer]:
    write_negative_avatar(tmp_path / "avatars")
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "devices": {"kind": "cpu"},
        }
    )
    async with TestServer(build_app(settings), host="127.0.0.1") as test_server:
        yield test_server


def _posted(action: str) -> Any:
    def matches(response: Response) -> bool:
        path = response.url.split("?", 1)[0]
        return response.request.method == "POST" and path.endswith(f"/{action}")

    return matches


async def _events(page: Page) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = await page.evaluate("() => window.lipstreamEvents")
    return events


async def test_the_demo_page_switches_avatar_and_idle_clip_during_a_call(
    tmp_path: Path, server: TestServer
) -> None:
    from playwright.async_api import expect

    async with browser_page(tmp_path, str(server.make_url("/"))) as page:
        picker = page.get_by_label("Avatar", exact=True)
        clips = page.get_by_label("Idle clip")
        await expect(picker).to_be_enabled()
        await picker.select_option("demo")
        await page.get_by_role("button", name="Start without microphone").click()
        await page.wait_for_function(
            "() => window.lipstreamStats.state === 'connected'"
            " && window.lipstreamStats.framesDecoded > 0"
            " && document.getElementById('video').videoWidth === 1280"
        )
        # In a call the picker stays usable, and the clip picker lists the avatar's clips.
        await expect(picker).to_be_enabled()
        await expect(clips).to_be_enabled()
        listed = await (await page.request.get(str(server.make_url("/avatars")))).json()
        by_id = {a["id"]: a for a in listed["avatars"]}
        shown = await clips.locator("option").all_inner_texts()
        assert shown == by_id["demo"]["clips"]
        before = await page.evaluate(BRIGHTNESS)

        async with page.expect_response(_posted("avatar")) as answered:
            await picker.select_option("negative")
        response = await answered.value
        assert response.status == 200, await response.text()
        switched = await response.json()
        assert (switched["avatar"], switched["previous"], switched["changed"]) == (
            "negative",
            "demo",
            True,
        )
        await page.wait_for_function(
            "() => window.lipstreamEvents.some(e => e.type === 'avatar_changed')"
        )
        changed = next(e for e in await _events(page) if e["type"] == "avatar_changed")
        assert (changed["frame"], changed["frame_size"]) == (switched["frame"], list(SMALL))
        # The browser follows the new size and shows the new (negative) face.
        await page.wait_for_function(
            "() => document.getElementById('video').videoWidth === 640"
            " && document.getElementById('video').videoHeight === 360"
            " && window.lipstreamStats.width === 640"
        )
        decoded = (await page.evaluate("() => window.lipstreamStats.framesDecoded")) + 25
        await page.wait_for_function(f"() => window.lipstreamStats.framesDecoded >= {decoded}")
        after = await page.evaluate(BRIGHTNESS)
        assert abs(after - before) > 40, (before, after)
        await expect(page.locator("#event-log")).to_contain_text("avatar_changed")
        await expect(page.get_by_role("status")).to_contain_text("Switched to")
        await expect(picker).to_have_value("negative")
        await expect(picker).to_be_enabled()

        # The clip picker now lists the new avatar's clips; picking one sets it.
        await expect(clips).to_be_enabled()
        new_clips = await clips.locator("option").all_inner_texts()
        assert new_clips == by_id["negative"]["clips"]
        async with page.expect_response(_posted("idle")) as answered:
            await clips.select_option(new_clips[-1])
        response = await answered.value
        assert response.status == 200, await response.text()
        assert (await response.json())["clip"] == new_clips[-1]
        await expect(page.get_by_role("status")).to_contain_text(f"Idle clip: {new_clips[-1]}")

        # The sample, cut a second in: its speech_ended says how much of it was played.
        async with page.expect_response(_posted("audio")) as pushed:
            await page.get_by_role("button", name="Play sample").click()
        queued = await (await pushed.value).json()
        sample = queued["utterance"]
        await page.wait_for_function(
            "() => window.lipstreamEvents.some("
            f"e => e.type === 'speech_started' && e.utterance === {sample})"
        )
        decoded = (await page.evaluate("() => window.lipstreamStats.framesDecoded")) + 25
        await page.wait_for_function(f"() => window.lipstreamStats.framesDecoded >= {decoded}")
        await page.get_by_role("button", name="Interrupt").click()
        await page.wait_for_function(
            "() => window.lipstreamEvents.some(e => e.type === 'interrupted')"
        )
        events = await _events(page)
        ended = next(e for e in events if e["type"] == "speech_ended" and e["utterance"] == sample)
        assert ended["interrupted"] is True
        # Part of it was played, not all: how much exactly against what the caller's
        # track received is tests/test_playback_positions.py's (decoded frames here are
        # not a clock: a browser catching up decodes 25 frames in much less than 1 s).
        assert 0 < ended["played_ms"] < queued["duration_ms"]
        await expect(page.locator("#event-log")).to_contain_text("played")

        async with page.expect_response(
            lambda r: r.request.method == "DELETE" and "/sessions/" in r.url
        ) as hung_up:
            await page.get_by_role("button", name="Hang up").click()
        assert (await hung_up.value).status == 200
        await expect(picker).to_be_enabled()
        await expect(clips).to_be_disabled()


# lipstream.js imported into the demo page's origin, driving a call of its own.
CLIENT_SWITCHES = """async () => {
  const lipstream = await import("/static/lipstream.js");
  const call = await lipstream.connect({ avatar: "demo" });
  const events = [];
  call.addEventListener("event", (e) => events.push(e.detail));
  const next = (type) => new Promise((resolve) => {
    const seen = events.find((e) => e.type === type);
    if (seen) return resolve(seen);
    call.addEventListener(type, (e) => resolve(e.detail), { once: true });
  });
  const refusal = (promise) => promise.then(
    () => null,
    (err) => ({
      lipstream: err instanceof lipstream.LipstreamError, status: err.status, code: err.code,
    }));
  const unknown = await refusal(call.switchAvatar("nobody"));
  const unknownClip = await refusal(call.setIdleClip("no-such-clip"));
  const sent = await call.switchAvatar("negative", { transport: "datachannel" });
  const changed = await next("avatar_changed");
  const avatar = call.avatar;
  call.setIdleClip("no-such-clip", { transport: "datachannel" });
  const error = await next("error");
  const clip = await call.setIdleClip("listening");
  const clipChanged = await next("idle_clip_changed");
  const idleClip = call.idleClip;
  await call.hangUp();
  return { unknown, unknownClip, sent, changed, avatar, error, clip, clipChanged, idleClip };
}"""


async def test_lipstream_js_switches_over_http_and_the_data_channel(
    tmp_path: Path, server: TestServer
) -> None:
    async with browser_page(tmp_path, str(server.make_url("/"))) as page:
        got = await page.evaluate(CLIENT_SWITCHES)
    assert got["unknown"] == {"lipstream": True, "status": 404, "code": "model_not_found"}
    assert got["unknownClip"] == {"lipstream": True, "status": 404, "code": "clip_not_found"}
    assert got["sent"] == {"via": "datachannel"}
    changed = got["changed"]
    assert (changed["avatar"], changed["previous"], changed["frame_size"]) == (
        "negative",
        "demo",
        list(SMALL),
    )
    assert got["avatar"] == "negative"
    assert got["error"]["code"] == "clip_not_found"
    assert "listening" in got["error"]["message"]
    assert (got["clip"]["clip"], got["clip"]["previous"], got["clip"]["via"]) == (
        "listening",
        "idle",
        "http",
    )
    assert got["clipChanged"]["clip"] == "listening"
    assert got["idleClip"] == "listening"
