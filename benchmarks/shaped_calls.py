"""Calls over a shaped link: lipstream to a Chromium in its own namespace, and the anchor.

The caller is Debian's Chromium started inside a network namespace
(``benchmarks/netns.py``) through a wrapper that execs it under ``ip netns exec``, so
Playwright drives it over its pipe while its packets cross the veth pair whose host end
is shaped. Two kinds of call, measured the same way (``benchmarks/link_stats.py``):

- **lipstream**: the page comes from the lipstream server (on the host end's address),
  imports ``/static/lipstream.js`` and calls with its fake microphone, as an app would;
- **the anchor**: a second Chromium on the host side sends the avatar's own rendered
  video (a Y4M file as its fake camera, H.264 at up to 2.5 Mbit/s) and the same speech
  to the caller's Chromium over the same link: what libwebrtc does on that link.

:func:`run_scenario` applies a :class:`Scenario`'s link changes at their times after the
call is up and returns the receiver's stats samples with the change times on the page's
own clock. Used by ``benchmarks/network.py`` and ``tests/test_shaped_links.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.chromium import CHROMIUM, CHROMIUM_ARGS
from benchmarks.link_stats import SAMPLER_JS, Sample
from benchmarks.netns import Namespace, Shaping

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

#: Chromium flags for a page on a plain-http origin that is not localhost, and for ICE
#: host candidates with real addresses (mDNS names would not resolve across the pair).
NETWORK_ARGS = ("--disable-features=WebRtcHideLocalIpsWithMdns",)


@dataclass(frozen=True)
class Change:
    """The link from ``at_s`` after the call is up: ``shaping`` (None: full speed) on
    server → caller, ``loss`` at random both ways."""

    at_s: float
    shaping: Shaping | None = None
    loss: float = 0.0


@dataclass(frozen=True)
class Scenario:
    """A link over a call: the changes, the settle time and the measured window."""

    name: str
    changes: tuple[Change, ...]
    settle_s: float = 6.0
    window_s: float = 30.0

    @property
    def duration_s(self) -> float:
        return self.settle_s + self.window_s


@dataclass
class ScenarioRun:
    """A call's receiver stats and when things happened, on its page's clock (ms)."""

    scenario: Scenario
    samples: list[Sample]
    connected_ms: float
    change_ms: list[float]
    server: dict[str, Any] = field(default_factory=dict)

    @property
    def window_ms(self) -> tuple[float, float]:
        start = self.connected_ms + 1000 * self.scenario.settle_s
        return start, start + 1000 * self.scenario.window_s


def namespaced_chromium(namespace: Namespace, directory: Path) -> Path:
    """A script that starts Debian's Chromium inside ``namespace`` (Playwright's
    ``executable_path``)."""
    wrapper = directory / f"chromium-in-{namespace.name}"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {namespace.name} {CHROMIUM} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@asynccontextmanager
async def chromium(
    *,
    fake_mic: Path,
    executable: Path = CHROMIUM,
    secure_origins: Sequence[str] = (),
    fake_camera: Path | None = None,
) -> AsyncIterator[Browser]:
    """A headless Chromium (``executable``) whose microphone plays ``fake_mic`` and, with
    ``fake_camera``, whose camera plays that Y4M file; ``secure_origins`` may use them."""
    from playwright.async_api import async_playwright

    args = [*CHROMIUM_ARGS, *NETWORK_ARGS, f"--use-file-for-fake-audio-capture={fake_mic}"]
    if fake_camera is not None:
        args.append(f"--use-file-for-fake-video-capture={fake_camera}")
    if secure_origins:
        args.append(f"--unsafely-treat-insecure-origin-as-secure={','.join(secure_origins)}")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(executable), headless=True, args=args
        )
        try:
            yield browser
        finally:
            await browser.close()


# -- the calls -------------------------------------------------------------------------

_LIPSTREAM_CALL_JS = """
async ({avatar, microphone}) => {
  const {connect} = await import("/static/lipstream.js");
  const mic = microphone ? await navigator.mediaDevices.getUserMedia({audio: {
    echoCancellation: false, noiseSuppression: false, autoGainControl: false}}) : null;
  const call = await connect({baseUrl: location.origin, avatar, microphone: mic});
  const video = document.createElement("video");
  video.autoplay = true;
  video.playsInline = true;
  video.srcObject = call.stream;
  document.body.append(video);
  video.play().catch(() => {});  // resolves only once media plays: not awaited
  window.linkPc = call.pc;
  window.linkCall = call;
  return call.sessionId;
}
"""


async def lipstream_call(
    page: Page, base_url: str, avatar: str = "demo", *, microphone: bool = True
) -> str:
    """Open a call from ``page`` (loaded from ``base_url``, the server) with lipstream.js,
    playing the call's video and audio; its peer connection is ``window.linkPc``.
    Returns the session id."""
    await page.goto(f"{base_url}/")
    session_id: str = await page.evaluate(
        _LIPSTREAM_CALL_JS, {"avatar": avatar, "microphone": microphone}
    )
    return session_id


async def hang_up(page: Page) -> None:
    """End the call ``page`` holds (the server's session too)."""
    await page.evaluate(
        "async () => { clearInterval(window.linkSampler); await window.linkCall?.hangUp(); }"
    )


# ICE gathering, host candidates only: done in milliseconds, but Chromium's
# "complete" can take long to come (it waits on every interface), so 2 s at most.
_GATHERED = """
const gathered = (pc) => new Promise((done) => {
  if (pc.iceGatheringState === "complete") return done();
  pc.addEventListener("icegatheringstatechange", () => {
    if (pc.iceGatheringState === "complete") done();
  });
  setTimeout(done, 2000);
});
"""

_SENDER_JS = """
async ({maxBitrate}) => {
  GATHERED
  const media = await navigator.mediaDevices.getUserMedia({
    video: {width: {exact: 1280}, height: {exact: 720}, frameRate: 25},
    audio: {echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
  const pc = new RTCPeerConnection({iceServers: []});
  for (const track of media.getTracks()) pc.addTrack(track, media);
  const video = pc.getTransceivers().find((t) => t.sender.track?.kind === "video");
  const h264 = RTCRtpReceiver.getCapabilities("video").codecs.filter(
    (c) => c.mimeType === "video/H264" || c.mimeType === "video/rtx");
  video.setCodecPreferences(h264);
  const parameters = video.sender.getParameters();
  parameters.encodings[0].maxBitrate = maxBitrate;
  await video.sender.setParameters(parameters);
  window.linkPc = pc;
  await pc.setLocalDescription(await pc.createOffer());
  await gathered(pc);
  return pc.localDescription.sdp;
}
"""

_RECEIVER_JS = """
async ({offer}) => {
  GATHERED
  const pc = new RTCPeerConnection({iceServers: []});
  const stream = new MediaStream();
  pc.addEventListener("track", (event) => stream.addTrack(event.track));
  await pc.setRemoteDescription({type: "offer", sdp: offer});
  await pc.setLocalDescription(await pc.createAnswer());
  await gathered(pc);
  const video = document.createElement("video");
  video.autoplay = true;
  video.playsInline = true;
  video.srcObject = stream;
  document.body.append(video);
  window.linkVideo = video;
  window.linkPc = pc;
  return pc.localDescription.sdp;
}
"""


async def anchor_call(sender: Page, receiver: Page, max_bitrate: int = 2_500_000) -> None:
    """Chromium to Chromium: ``sender`` sends its fake camera and microphone (H.264 at up
    to ``max_bitrate``) to ``receiver``, whose peer connection is ``window.linkPc``.
    Both pages must be loaded already (the sender from a secure origin)."""
    offer = await sender.evaluate(
        _SENDER_JS.replace("GATHERED", _GATHERED), {"maxBitrate": max_bitrate}
    )
    answer = await receiver.evaluate(_RECEIVER_JS.replace("GATHERED", _GATHERED), {"offer": offer})
    await sender.evaluate(
        "async (sdp) => { await window.linkPc.setRemoteDescription({type: 'answer', sdp}); }",
        answer,
    )
    await receiver.evaluate("() => { window.linkVideo.play().catch(() => {}); }")


async def close_anchor(sender: Page, receiver: Page) -> None:
    for page in (receiver, sender):
        await page.evaluate("() => { clearInterval(window.linkSampler); window.linkPc?.close(); }")


# -- a scenario over a call ------------------------------------------------------------


async def _wait_connected(page: Page, timeout_s: float) -> float:
    """The page's clock (ms) once its call decodes frames."""
    await page.wait_for_function(
        "() => window.linkPc && window.linkPc.connectionState === 'connected'",
        timeout=timeout_s * 1000,
    )
    await page.evaluate(SAMPLER_JS, "linkPc")
    await page.wait_for_function(
        "() => window.linkSamples.some((s) => s.v_frames > 0)", timeout=timeout_s * 1000
    )
    connected: float = await page.evaluate("() => performance.now()")
    return connected


def apply_change(namespace: Namespace, change: Change) -> None:
    """Set the link as ``change`` says."""
    namespace.shape_downlink(change.shaping)
    namespace.random_loss(change.loss)


async def run_scenario(
    namespace: Namespace,
    receiver: Page,
    scenario: Scenario,
    start: Callable[[], Awaitable[None]],
    *,
    timeout_s: float = 60.0,
    during: Callable[[float], Awaitable[None]] | None = None,
) -> ScenarioRun:
    """The link as the scenario's first change says (at 0 s), then ``start()`` the call
    (``receiver`` is the page that receives it); each later change at its time after the
    call decodes its first frame; the samples once the window is over. ``during(t)`` is
    awaited about every second with the seconds since the call was up (e.g. to read the
    server)."""
    changes = sorted(scenario.changes, key=lambda c: c.at_s)
    apply_change(namespace, changes[0] if changes and changes[0].at_s <= 0 else Change(0))
    await start()
    connected_ms = await _wait_connected(receiver, timeout_s)
    began = time.monotonic()
    change_ms = [connected_ms] if changes and changes[0].at_s <= 0 else []
    pending = [c for c in changes if c.at_s > 0]
    while (elapsed := time.monotonic() - began) < scenario.duration_s:
        while pending and pending[0].at_s <= elapsed:
            apply_change(namespace, pending.pop(0))
            change_ms.append(await receiver.evaluate("() => performance.now()"))
        if during is not None:
            await during(elapsed)
        next_at = min([scenario.duration_s, *(c.at_s for c in pending)])
        await asyncio.sleep(max(0.05, min(1.0, next_at - (time.monotonic() - began))))
    samples: list[Sample] = await receiver.evaluate("() => window.linkSamples")
    return ScenarioRun(scenario, samples, connected_ms, change_ms)
