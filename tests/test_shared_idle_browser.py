"""Shared idle loops in a real browser: 50 speech on/off switches without a seam (issue 26).

A call that is not speaking sends its avatar's shared, pre-encoded idle loop; when speech
starts it switches to its own live encoder (a keyframe on the first frame with a face), and
when speech ends it switches back at a shared keyframe. Headless Debian Chromium (as in
``tests/test_browser_client.py``) imports ``/static/lipstream.js`` into the demo page, makes
a call without a microphone and shows it in a ``<video>``; the test speaks into the session
through ``POST /sessions/{id}/audio`` (a short espeak-ng phrase) 25 times, each burst
followed by a silence that lasts until the call has been sending shared frames for a while:
25 switches to live and 25 back. Pushing beats a looping fake microphone: each phase ends
on what the server did (``GET /sessions/{id}``), not on where a file happens to be.

Nothing is timed. Each phase waits for counters with a bound in frames, and the test
asserts what the browser saw (``getStats()``, the inbound video) and what the server did.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from config.settings import Settings
from tests.browser_page import browser_page
from tests.live_calls import FPS, assert_lip_synced, until
from tests.media import espeak_wav, read_wav, write_wav
from web.app import build_app
from web.app_keys import SESSIONS

if TYPE_CHECKING:
    from playwright.async_api import Page

logger = logging.getLogger(__name__)

pytestmark = pytest.mark.slow

BURSTS = 25  # each a switch to live and, in the silence after it, one back: 50 switches
PHRASE = "hello there"  # about 0.8 s of speech: 20 lip-synced frames, and short
#: Shared frames a silence sends before the next burst is pushed. It goes on sending them
#: for the session's delay after the push (over 1 s here), so each silence shows more
#: than a whole loop keyframe interval (0.48 s) of shared frames, across a keyframe.
SHARED_FRAMES_PER_SILENCE = 6
#: A silence that has not switched to the shared loop after this many frames will not:
#: the speech gate's hangover and blend (7 frames), a whole keyframe interval (12) and
#: the shared frames asked for take 25; the rest is for a busy machine, where a call
#: leaves the loop on a skipped send slot and comes back at a later keyframe.
MAX_SILENCE_FRAMES = 10 * FPS
#: The first silence waits for the avatar's loop to be encoded, in the background on first
#: use (its first bitrate took under 2 s here; far longer on two cores busy with more).
MAX_FIRST_SILENCE_FRAMES = 45 * FPS
#: Frames in flight between reading the server's counters and the browser's (jitter
#: buffer, decode queue): the two are read a poll apart, not at the same instant.
IN_FLIGHT_FRAMES = FPS
#: Frames the browser may drop in phases where the server kept time: a stray one from
#: its own scheduling. A seam that breaks the stream (a timestamp or reference the
#: decoder cannot follow) drops frames at every such seam, and there are 50 of them.
MAX_DROPPED_ON_TIME = 2
#: Phases on time by the server's counters in which the browser may still freeze: a
#: stall no counter sees (Chromium's own threads, or a send delayed past the track on
#: two cores busy with the suite). CI froze once in one silence, five freezes in 2.0 s
#: with no PLI, every other phase clean. A seam that breaks the stream freezes at every
#: seam of its kind: 25 or 50 phases.
MAX_FROZEN_ON_TIME = 2

# The call, shown in a <video>, as window.call, and the server events it receives on its
# data channel as window.events; lipstream.js from the page's own origin.
# The page holds a (fake, silent) microphone it does not send: Chromium shows
# getStats()'s decoderImplementation only to a page that is capturing.
CONNECT = """async () => {
  window.capture = await navigator.mediaDevices.getUserMedia({ audio: true });
  const lipstream = await import("/static/lipstream.js");
  const call = await lipstream.connect({ baseUrl: location.origin, avatar: "demo" });
  const video = document.createElement("video");
  video.autoplay = true;
  video.muted = true;
  video.playsInline = true;
  video.srcObject = call.stream;
  document.body.append(video);
  window.call = call;
  window.callVideo = video;
  window.events = [];
  call.addEventListener("event", (e) => window.events.push(e.detail));
  return call.sessionId;
}"""
# The inbound video's getStats() figures and the <video> element's state.
VIDEO_STATS = """async () => {
  const report = await window.call.pc.getStats();
  let video = null;
  for (const s of report.values()) {
    if (s.type === "inbound-rtp" && (s.kind ?? s.mediaType) === "video") video = s;
  }
  const codec = video?.codecId ? report.get(video.codecId) : undefined;
  const element = window.callVideo;
  return {
    timestamp: video?.timestamp ?? null,
    codec: codec?.mimeType ?? null,
    framesReceived: video?.framesReceived ?? 0,
    framesDecoded: video?.framesDecoded ?? 0,
    keyFramesDecoded: video?.keyFramesDecoded ?? 0,
    framesDropped: video?.framesDropped ?? 0,
    freezeCount: video?.freezeCount ?? 0,
    totalFreezesDuration: video?.totalFreezesDuration ?? 0,
    pauseCount: video?.pauseCount ?? 0,
    pliCount: video?.pliCount ?? 0,
    firCount: video?.firCount ?? 0,
    nackCount: video?.nackCount ?? 0,
    packetsLost: video?.packetsLost ?? 0,
    frameWidth: video?.frameWidth ?? null,
    frameHeight: video?.frameHeight ?? null,
    decoderImplementation: video?.decoderImplementation ?? null,
    elementError: element.error ? `${element.error.code}: ${element.error.message}` : null,
    elementReadyState: element.readyState,
    elementWidth: element.videoWidth,
  };
}"""


@dataclasses.dataclass(frozen=True)
class Phase:
    """One burst or silence: the server's counters and the browser's stats at its end."""

    kind: str  # "speech" or "silence"
    state: dict[str, Any]  # GET /sessions/{id}
    stats: dict[str, Any]  # VIDEO_STATS
    on_shared: bool = False  # a silence that ended sending shared frames, not live ones

    def __str__(self) -> str:
        server = ("frames_sent", "frames_inferred", "frames_shared", "frames_encoded")
        late = ("frames_skipped", "frames_dropped")
        browser = ("framesDecoded", "keyFramesDecoded", "framesDropped", "pliCount")
        freezes = ("freezeCount", "totalFreezesDuration")
        figures = [f"{k}={self.state[k]}" for k in (*server, *late)]
        figures += [f"{k}={self.stats[k]}" for k in (*browser, *freezes)]
        return f"{self.kind} (on shared: {self.on_shared}): {' '.join(figures)}"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir per module, so the demo avatar is generated once."""
    return tmp_path_factory.mktemp("lipstream_data")


@pytest.fixture(scope="module")
def phrase_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The burst: an espeak-ng phrase with the silence it pads itself with cut off."""
    tmp = tmp_path_factory.mktemp("phrase")
    pcm, rate = read_wav(espeak_wav(tmp / "espeak.wav", PHRASE))
    loud = np.flatnonzero(np.abs(pcm) > 0.01)
    return write_wav(tmp / "phrase.wav", pcm[loud[0] : loud[-1] + 1], rate)


@pytest.fixture
async def server(tmp_path: Path, data_dir: Path, loopback: None) -> AsyncIterator[TestServer]:
    """The real application on 127.0.0.1 serving the demo avatar, shared idle loops on."""
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(data_dir)},
            "devices": {"kind": "cpu"},
            "video": {"shared_idle": True},
        }
    )
    test_server = TestServer(build_app(settings), host="127.0.0.1")
    async with test_server:
        yield test_server


@pytest.fixture
async def page(tmp_path: Path, server: TestServer) -> AsyncIterator[Page]:
    """The demo page's origin in a fresh headless Chromium; fails on an uncaught JS error."""
    async with browser_page(tmp_path, str(server.make_url("/"))) as opened:
        yield opened


class Call:
    """The test's view of one call: the server's counters over HTTP, the browser's stats.

    ``latest`` is the last ``GET /sessions/{id}`` read: what a wait ended on.
    """

    def __init__(self, http: ClientSession, page: Page, session_id: str) -> None:
        self.http = http
        self.page = page
        self.path = f"/sessions/{session_id}"
        self.latest: dict[str, Any] = {}

    async def state(self) -> dict[str, Any]:
        async with self.http.get(self.path) as response:
            assert response.status == 200, await response.text()
            self.latest = await response.json()
            return self.latest

    async def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = await self.page.evaluate(VIDEO_STATS)
        return stats

    async def until_state(
        self, condition: Callable[[dict[str, Any], dict[str, Any]], bool], what: str
    ) -> bool:
        """Poll the server's state until ``condition(previous read, this read)`` holds;
        ``latest`` is the read it held for."""

        async def holds() -> bool:
            previous = self.latest
            return condition(previous, await self.state())

        return await until(holds, what, poll_s=0.1)

    async def speak(self, phrase: bytes) -> Phase:
        """Push the phrase; end once the caller has been sent all of it (``speech_ended``).

        Not on the server's counters: a frame is inferred a pipeline margin before its
        send slot, and the speech gate takes the audio from the queue before that."""
        async with self.http.post(
            f"{self.path}/audio", data=phrase, headers={"Content-Type": "audio/wav"}
        ) as response:
            assert response.status == 202, await response.text()
            utterance = (await response.json())["utterance"]
        await self.page.wait_for_function(
            "(n) => window.events.some(e => e.type === 'speech_ended' && e.utterance === n)",
            arg=utterance,
        )
        await self.state()
        return await self._phase("speech")

    async def fall_silent(self, max_frames: int) -> Phase:
        """Wait until the call is sending shared frames (between two reads shared frames
        were sent and none encoded) and has sent :data:`SHARED_FRAMES_PER_SILENCE` of
        them, or until it has sent ``max_frames`` frames in all without (not sharing)."""
        start = await self.state()

        def sharing(previous: dict[str, Any], now: dict[str, Any]) -> bool:
            return bool(
                now["frames_shared"] - start["frames_shared"] >= SHARED_FRAMES_PER_SILENCE
                and now["frames_shared"] > previous["frames_shared"]
                and now["frames_encoded"] == previous["frames_encoded"]
            )

        on_shared = False

        def settled(previous: dict[str, Any], now: dict[str, Any]) -> bool:
            nonlocal on_shared
            on_shared = sharing(previous, now)
            return on_shared or now["frames_sent"] - start["frames_sent"] >= max_frames

        await self.until_state(settled, "the call to fall silent")
        return await self._phase("silence", on_shared)

    async def _phase(self, kind: str, on_shared: bool = False) -> Phase:
        phase = Phase(kind, self.latest, await self.stats(), on_shared)
        logger.info("%s", phase)
        return phase


def _late(before: Phase, phase: Phase) -> bool:
    """Whether the server fell behind during ``phase``: it skipped send slots, or dropped
    frames it could not make in time (a busy machine; ``tests/live_calls.py``)."""
    skipped = phase.state["frames_skipped"] - before.state["frames_skipped"]
    dropped = sum(phase.state["frames_dropped"].values()) - sum(
        before.state["frames_dropped"].values()
    )
    return bool(skipped > 0 or dropped > 0)


def _delta(phases: list[Phase], i: int, stat: str) -> int:
    """How much a browser stat grew during phase ``i``."""
    return int(phases[i].stats[stat] - phases[i - 1].stats[stat])


def _switches(phases: list[Phase]) -> int:
    """Switches the server made: a burst that began on shared frames (the silence before
    it ended on them) and sent live ones with a face, and a silence that ended on shared
    frames after a burst that sent live ones."""

    def went_live(i: int) -> bool:
        before, phase = phases[i - 1].state, phases[i].state
        encoded = phase["frames_encoded"] > before["frames_encoded"]
        return bool(encoded and phase["frames_inferred"] > before["frames_inferred"])

    count = 0
    for i in range(1, len(phases)):
        if phases[i].kind == "speech" and phases[i - 1].on_shared and went_live(i):
            count += 1
        if phases[i].kind == "silence" and phases[i].on_shared and went_live(i - 1):
            count += 1
    return count


async def test_fifty_speech_switches_between_shared_and_live_frames_without_a_seam(
    server: TestServer, page: Page, phrase_wav: Path
) -> None:
    session_id: str = await page.evaluate(CONNECT)
    await page.wait_for_function("() => window.callVideo.readyState >= 2")
    phrase = await asyncio.to_thread(phrase_wav.read_bytes)
    async with ClientSession(base_url=str(server.make_url("/"))) as http:
        call = Call(http, page, session_id)
        phases = [await call.fall_silent(MAX_FIRST_SILENCE_FRAMES)]
        assert phases[0].on_shared, f"no frame came from the shared idle loop: {phases[0]}"
        for _ in range(BURSTS):
            phases.append(await call.speak(phrase))
            phases.append(await call.fall_silent(MAX_SILENCE_FRAMES))
        end = phases[-1].state
        steady = await _settles_on_the_steady_loop(server, call, session_id)

    first, last = phases[0].stats, phases[-1].stats
    summary = {k: last[k] for k in last if not k.startswith("element")}
    logger.info("after %d phases: browser %s, server %s", len(phases), summary, end)
    # The browser decoded H.264 all along and asked for one keyframe at most (a start
    # that missed the first one): a seam it could not decode would cost a PLI.
    assert last["codec"] == "video/H264", summary
    assert last["decoderImplementation"], summary
    assert (last["frameWidth"], last["frameHeight"]) == (1280, 720), summary
    assert last["elementError"] is None, last
    assert last["elementReadyState"] >= 2, last
    assert last["elementWidth"] == 1280, last
    assert last["pliCount"] <= 1, summary
    assert last["firCount"] == 0, summary
    decoded = [p.stats["framesDecoded"] for p in phases]
    assert all(b > a for a, b in itertools.pairwise(decoded)), decoded  # through each phase
    # Every frame sent was decoded, but those dropped and those in flight when read.
    frames = last["framesDecoded"] - first["framesDecoded"]
    sent = end["frames_sent"] - phases[0].state["frames_sent"]
    assert frames >= sent - last["framesDropped"] - IN_FLIGHT_FRAMES, (frames, sent, summary)
    # About 25 fps over the switches, by the browser's own clock: a ratio, loose because
    # a busy machine makes the server skip slots rather than fall behind.
    duration_s = (last["timestamp"] - first["timestamp"]) / 1000
    assert frames >= 0.8 * FPS * duration_s, (frames, duration_s, summary)

    # No freeze and no dropped frame at the switches. Where the server fell behind (two
    # busy cores), the browser waits for frames that come late or never: a freeze there,
    # seen when the next frame shows (maybe in the next phase), is the machine's, not a
    # seam's; so, in a stray phase, is one no counter explains (MAX_FROZEN_ON_TIME).
    # Enough phases must be on time for the test to say anything.
    late = [False] + [_late(a, b) for a, b in itertools.pairwise(phases)]
    on_time = [i for i in range(1, len(phases)) if not (late[i] or late[i - 1])]
    assert len(on_time) >= len(phases) // 2, f"too busy to judge: {len(on_time)} phases on time"
    frozen = [str(phases[i]) for i in on_time if _delta(phases, i, "freezeCount")]
    assert len(frozen) <= MAX_FROZEN_ON_TIME, frozen
    dropped = sum(_delta(phases, i, "framesDropped") for i in on_time)
    assert dropped <= MAX_DROPPED_ON_TIME, [str(p) for p in phases]

    # The server lip-synced every burst and went back to the shared loop in every
    # silence (a silence where it fell behind may have left the loop and stayed out).
    assert_lip_synced(end, due_at_least=BURSTS)
    missed = [i for i, p in enumerate(phases) if p.kind == "silence" and not p.on_shared]
    assert all(late[i] for i in missed), [str(phases[i]) for i in missed]
    assert len(missed) <= BURSTS // 5, [str(phases[i]) for i in missed]
    switches = _switches(phases)
    assert switches >= 2 * (BURSTS - len(missed)), [str(p) for p in phases]
    # Each switch is a keyframe: a forced one to live, a shared one back.
    keyframes = last["keyFramesDecoded"] - first["keyFramesDecoded"]
    assert keyframes >= switches, (keyframes, switches, summary)

    # Chromium sends transport-cc, so the long silence after the bursts settled on the
    # steady loop: its keyframes only, every frame decoded, no freeze, no request.
    before, after = steady
    assert after.state["frames_encoded"] == before.state["frames_encoded"], str(after)
    shared = after.state["frames_shared"] - before.state["frames_shared"]
    assert shared >= STEADY_FRAMES, str(after)
    keyframes = after.stats["keyFramesDecoded"] - before.stats["keyFramesDecoded"]
    assert keyframes <= shared // STEADY_EVERY + 1, (keyframes, shared, str(after))
    assert after.stats["pliCount"] == before.stats["pliCount"], str(after)
    if not _late(before, after):
        assert after.stats["freezeCount"] == before.stats["freezeCount"], str(after)
    decoded = after.stats["framesDecoded"] - before.stats["framesDecoded"]
    assert decoded >= shared - IN_FLIGHT_FRAMES, (decoded, shared, str(after))


#: Frames between the steady idle loop's keyframes (video.idle_steady_keyframe_interval_s).
STEADY_EVERY = round(Settings().video.idle_steady_keyframe_interval_s * FPS)
#: Shared frames watched on the steady loop: three of its keyframe intervals.
STEADY_FRAMES = 3 * STEADY_EVERY


async def _settles_on_the_steady_loop(
    server: TestServer, call: Call, session_id: str
) -> tuple[Phase, Phase]:
    """Wait, in silence, until the call sends the steady loop, then for
    :data:`STEADY_FRAMES` more shared frames; the phases at both ends."""
    manager = server.app[SESSIONS]
    sharing = manager.get(session_id).pipeline.sharing
    assert sharing is not None
    await until(lambda: sharing.keyframe_every == STEADY_EVERY, "the steady idle loop")
    await call.state()  # the phase's counters from now, not the last poll's (seconds ago)
    before = await call._phase("silence", True)
    start = before.state["frames_shared"]

    def watched(previous: dict[str, Any], now: dict[str, Any]) -> bool:
        return bool(now["frames_shared"] - start >= STEADY_FRAMES)

    await call.until_state(watched, "frames of the steady idle loop")
    return before, await call._phase("silence", True)
