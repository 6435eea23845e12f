"""A browser in the avatar's LiveKit room: Debian's Chromium with LiveKit's own browser SDK
(``livekit-client`` from npm, installed by ``.ci/run``), as a frontend of a LiveKit
Agents app would show the agent (``docs/guides/livekit.md``).

lipstream runs as ``lipstream serve``; this process plays the agent (livekit-agents'
``DataStreamAudioOutput``, tests/livekit_room.py) and serves the small test page. The
page joins as a viewer, attaches the avatar's tracks and records each presented video
frame (``requestVideoFrameCallback``: its RTP time and size); the audio's
``totalAudioEnergy`` is read from its receiver's statistics. Asserted: the frames come
at the avatar's size at 24 fps or more of media time, and the avatar's voice is heard
after a sentence.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.browser_page import browser_page
from tests.live_calls import TIMEOUT_S, until
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
RTP_CLOCK = 90_000

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>lipstream avatar in a LiveKit room</title>
<script src="/livekit-client.umd.js"></script>
<script>
window.probe = {frames: [], state: "new", audio: null};
window.join = async (url, token) => {
  const room = new LivekitClient.Room({adaptiveStream: false, dynacast: false});
  room.on(LivekitClient.RoomEvent.TrackSubscribed, (track, publication, participant) => {
    if (!("lk.publish_on_behalf" in participant.attributes)) return;
    const element = track.attach();
    document.body.appendChild(element);
    if (track.kind === "video") {
      element.muted = true;
      const frame = (now, meta) => {
        probe.frames.push([meta.rtpTimestamp, meta.width, meta.height]);
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


def fps_of(frames: list[list[int]]) -> float:
    """Presented frames per second of media time (RTP time, wrap-free over a test)."""
    stamps = sorted({f[0] for f in frames})
    return (len(stamps) - 1) / ((stamps[-1] - stamps[0]) / RTP_CLOCK)


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
                async with browser_page(tmp_path, str(pages.make_url("/"))) as browser:
                    viewer = livekit.token("browser", agent.name)
                    await browser.evaluate("([u, t]) => window.join(u, t)", [livekit.url, viewer])
                    await browser.wait_for_function(
                        "() => window.probe.frames.length >= 50", timeout=TIMEOUT_S * 1000
                    )
                    frames: list[list[int]] = await browser.evaluate("() => window.probe.frames")
                    assert {(w, h) for _, w, h in frames[-25:]} == {(1280, 720)}, frames[-3:]
                    assert fps_of(frames[-50:]) >= 24.0, frames[-50:]

                    silent = await browser.evaluate("() => window.audioEnergy()")
                    assert silent is not None
                    await agent.speak(pcm, 24_000)
                    await until(lambda: agent.finished, "the sentence played")
                    assert agent.finished[-1].interrupted is False

                    async def heard() -> Any:
                        energy = await browser.evaluate("() => window.audioEnergy()")
                        return energy is not None and energy > silent + 0.01

                    await until(heard, "the avatar's voice in the browser")
                    frames = await browser.evaluate("() => window.probe.frames")
                    assert fps_of(frames[-100:]) >= 24.0
            finally:
                await agent.close()
