"""A browser in the avatar's LiveKit room: Debian's Chromium with LiveKit's own browser SDK
(``livekit-client`` from npm, installed by ``.ci/run``), as a frontend of a LiveKit
Agents app would show the agent (``docs/guides/livekit.md``).

lipstream runs as ``lipstream serve``; this process plays the agent (livekit-agents'
``DataStreamAudioOutput``, tests/livekit_room.py) and serves the small test page. The
page joins as a viewer, attaches the avatar's tracks and records each presented video
frame (``requestVideoFrameCallback``: its size); the video's ``framesDecoded`` and the
audio's ``totalAudioEnergy`` are read from the receivers' statistics. Asserted: the
frames come at the avatar's size, every frame the session sent is decoded, at 24 a
second or more less the send slots lipstream itself skipped meanwhile (its session's
``frames_skipped``: a machine too busy for real time skips a slot rather than fall
behind), and the avatar's voice is heard after a sentence.

Decoded, not presented, frames are counted: headless Chromium presents one of two
frames that arrive within one refresh (``presentedFrames`` skips), 1-2 in 50 here with
every frame decoded; counting presented frames by RTP time read 22.7 fps once in CI.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.browser_page import browser_page
from tests.live_calls import TIMEOUT_S, session_state, until
from tests.livekit_room import Agent
from tests.livekit_server import run_livekit
from tests.media import espeak_wav, read_wav, require_espeak, resample_linear
from tests.server_process import lipstream_serve

SDK = (
    Path(os.environ.get("LIPSTREAM_LIVEKIT_CLIENT_DIR", "/opt/lipstream-ci/livekit-client"))
    / "node_modules"
    / "livekit-client"
    / "dist"
    / "livekit-client.umd.js"
)
logger = logging.getLogger(__name__)

FPS = 25
#: Frames the browser's counters and the server's, read a poll apart at either end of
#: a window (and those in its jitter buffer), may disagree by.
EDGE_FRAMES = 3

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>lipstream avatar in a LiveKit room</title>
<script src="/livekit-client.umd.js"></script>
<script>
window.probe = {frames: [], state: "new", audio: null, video: null};
window.join = async (url, token) => {
  const room = new LivekitClient.Room({adaptiveStream: false, dynacast: false});
  room.on(LivekitClient.RoomEvent.TrackSubscribed, (track, publication, participant) => {
    if (!("lk.publish_on_behalf" in participant.attributes)) return;
    const element = track.attach();
    document.body.appendChild(element);
    if (track.kind === "video") {
      probe.video = track;
      element.muted = true;
      const frame = (now, meta) => {
        probe.frames.push([meta.width, meta.height]);
        element.requestVideoFrameCallback(frame);
      };
      element.requestVideoFrameCallback(frame);
    } else {
      probe.audio = track;
    }
  });
  await room.connect(url, token);
  window.room = room;
  probe.state = "connected";
};
window.videoStats = async () => {
  let stats = null;
  (await probe.video.receiver.getStats()).forEach((report) => {
    if (report.type === "inbound-rtp") stats = report;
  });
  return stats && {decoded: stats.framesDecoded, timestamp: stats.timestamp};
};
window.audioEnergy = async () => {
  if (!probe.audio || !probe.audio.receiver) return null;
  let energy = null;
  (await probe.audio.receiver.getStats()).forEach((report) => {
    if (report.type === "inbound-rtp") energy = report.totalAudioEnergy ?? null;
  });
  return energy;
};
</script>
"""


def require_sdk() -> Path:
    if not SDK.is_file():
        pytest.fail(
            f"livekit-client is not at {SDK}: npm install --prefix "
            f"{SDK.parents[2]} livekit-client@2.23.0 (.ci/run does)"
        )
    return SDK


async def decodes_what_was_sent(
    browser: Any, http: Any, session_id: str, during: Callable[[], Awaitable[object]]
) -> None:
    """While ``during`` runs, the page decodes 24 frames a second or more (by its own
    clock, ``inbound-rtp``'s ``framesDecoded``) but for the send slots the session
    skipped, every frame it sent, and presents them at the avatar's size."""
    before = await session_state(http, session_id)
    start = await browser.evaluate("() => window.videoStats()")
    presented = await browser.evaluate("() => window.probe.frames.length")
    await during()
    end = await browser.evaluate("() => window.videoStats()")
    after = await session_state(http, session_id)
    window: list[list[int]] = (await browser.evaluate("() => window.probe.frames"))[presented:]
    decoded = end["decoded"] - start["decoded"]
    duration_s = (end["timestamp"] - start["timestamp"]) / 1000
    sent = after["frames_sent"] - before["frames_sent"]
    skipped = after["frames_skipped"] - before["frames_skipped"]
    logger.info(
        "browser: %d frames decoded in %.2f s, %d sent, %d skipped",
        decoded,
        duration_s,
        sent,
        skipped,
    )
    assert {(w, h) for w, h in window} == {(1280, 720)}, window[-3:]
    assert decoded >= sent - EDGE_FRAMES, (decoded, sent)
    # 24 a second, the slots the server skipped counted as if decoded: they were never
    # sent (a full suite on two cores skipped 6 in 3 s, and 65 of the 68 sent came).
    assert decoded + skipped + EDGE_FRAMES >= 24.0 * duration_s, (decoded, duration_s, skipped)


def frames_presented(browser: Any, count: int) -> Callable[[], Awaitable[object]]:
    """Waiting for the page to present ``count`` more frames."""

    async def wait() -> object:
        start = await browser.evaluate("() => window.probe.frames.length")
        return await browser.wait_for_function(
            f"() => window.probe.frames.length >= {start + count}", timeout=TIMEOUT_S * 1000
        )

    return wait


async def test_a_browser_with_livekit_client_sees_and_hears_the_avatar(tmp_path: Path) -> None:
    require_espeak()
    sdk = require_sdk()
    pcm, rate = read_wav(espeak_wav(tmp_path / "sentence.wav", "Hello from the agent's face."))
    pcm = resample_linear(pcm, rate, 24_000)

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def script(request: web.Request) -> web.FileResponse:
        return web.FileResponse(sdk)

    page_app = web.Application()
    page_app.router.add_get("/", page)
    page_app.router.add_get("/livekit-client.umd.js", script)
    with run_livekit(tmp_path / "livekit") as livekit:
        async with (
            lipstream_serve(tmp_path, sections={"livekit": {"allow_private": True}}) as server,
            TestServer(page_app, host="127.0.0.1") as pages,
        ):
            agent = Agent(livekit, "room-browser")
            await agent.connect()
            try:
                created = await server.http.post(
                    "/livekit/sessions",
                    json={"livekit_url": livekit.url, "livekit_token": agent.avatar_token()},
                )
                assert created.status == 201, await created.text()
                session_id = (await created.json())["session_id"]
                async with browser_page(tmp_path, str(pages.make_url("/"))) as browser:
                    viewer = livekit.token("browser", agent.name)
                    await browser.evaluate("([u, t]) => window.join(u, t)", [livekit.url, viewer])
                    await frames_presented(browser, 1)()
                    await decodes_what_was_sent(
                        browser, server.http, session_id, frames_presented(browser, 3 * FPS)
                    )

                    silent = await browser.evaluate("() => window.audioEnergy()")
                    assert silent is not None

                    async def heard() -> Any:
                        energy = await browser.evaluate("() => window.audioEnergy()")
                        return energy is not None and energy > silent + 0.01

                    async def sentence() -> None:
                        await agent.speak(pcm, 24_000)
                        await until(lambda: agent.finished, "the sentence played")
                        assert agent.finished[-1].interrupted is False
                        await until(heard, "the avatar's voice in the browser")

                    await decodes_what_was_sent(browser, server.http, session_id, sentence)
            finally:
                await agent.close()
