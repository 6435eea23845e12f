"""The soak's callers (``benchmarks/soak.py``): speaking and listening calls and a WHEP viewer.

Each call is a :class:`~benchmarks.webrtc_load.LoadCall` (``lipstream_client``, the video
received and decoded, each frame's arrival noted) with a
:class:`~benchmarks.webrtc_load.ConversationMicrophone`: a **speaker** says
:data:`SPEAK_S` seconds of espeak-ng speech every :data:`CYCLE_S` seconds; a **listener**
is digitally silent apart from a short "okay" every ``keepalive_s`` (the soak gives it
80% of ``session.idle_timeout_s``: a call with no audio at all for that long is ended by
the server, by design, and a listener that never says a word is not what the soak is
about). The viewer watches one call's session over WHEP and counts the frames it gets
(undecoded: a sixth 720p decoder here would take a core's share from the server).

Offers the server refuses for room (503 ``too_many_sessions``: admission prices every
call as if it spoke all the time) are retried after the ``Retry-After`` it sent, as a
client should; the refusals are counted.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

import lipstream_client as lc
from benchmarks.webrtc_load import ConversationMicrophone, LoadCall
from benchmarks.whep_load import WhepViewer
from config.settings import TtsSettings
from streaming.audio_in.resample import resample_mono
from streaming.audio_in.tts import build_tts_engine
from streaming.audio_rates import OUT_RATE

MIC_RATE = 16_000  # what ConversationMicrophone sends
SPEAK_S = 4.0
CYCLE_S = 30.0
OPEN_TIMEOUT_S = 120.0  # refusals retried, ICE and the first frame, for one call
FIRST_WORDS_S = 6.0  # from the first speaker's call to its first words
PHRASES = (
    "hello there, how are you today",
    "I would like to hear more about the weather this weekend",
    "could you tell me what time the shop opens tomorrow morning",
    "thank you, that is very helpful",
)
OKAY = "okay"


@dataclass(frozen=True)
class Speech:
    """The microphones' audio: 16 kHz int16, voiced parts only."""

    phrases: np.ndarray
    okay: np.ndarray


async def make_speech() -> Speech:
    """espeak-ng (the server's own engine, run here) says :data:`PHRASES` and :data:`OKAY`."""
    engine = build_tts_engine(TtsSettings(engine="espeak"))
    try:
        phrases = [_voiced(await engine.synthesize(text)) for text in PHRASES]
        okay = _voiced(await engine.synthesize(OKAY))
    finally:
        await engine.close()
    gap = np.zeros(MIC_RATE // 4, dtype=np.int16)
    return Speech(np.concatenate([p for phrase in phrases for p in (phrase, gap)]), okay)


def _voiced(pcm: np.ndarray) -> np.ndarray:
    pcm = resample_mono(pcm, OUT_RATE, MIC_RATE)
    loud = np.flatnonzero(np.abs(pcm) > 0.05)
    voiced: np.ndarray = (np.clip(pcm[loud[0] : loud[-1] + 1], -1, 1) * 32767).astype(np.int16)
    return voiced


class SoakCall:
    """One call of the soak, a speaker or a listener (module doc)."""

    def __init__(self, client: lc.Client, speaks: bool, speech: Speech, keepalive_s: float) -> None:
        self.client = client
        self.speaks = speaks
        self.refusals = 0
        self.speech = speech
        self.keepalive_s = keepalive_s
        self._load: LoadCall | None = None
        self._mic: ConversationMicrophone | None = None
        self._phase_s = 0.0

    @property
    def role(self) -> str:
        return "speaker" if self.speaks else "listener"

    @property
    def session_id(self) -> str:
        return self._load.session_id if self._load is not None else ""

    def _microphone(self, phase_s: float) -> ConversationMicrophone:
        if self.speaks:
            return ConversationMicrophone(
                self.speech.phrases, SPEAK_S, CYCLE_S - SPEAK_S, phase_s % CYCLE_S
            )
        okay_s = len(self.speech.okay) / MIC_RATE
        # Phase okay_s: silent from the start, the first "okay" keepalive_s - okay_s in.
        return ConversationMicrophone(self.speech.okay, okay_s, self.keepalive_s - okay_s, okay_s)

    async def open(self, phase_s: float = 0.0) -> None:
        """Call (retrying refusals for room), wait for the first video frame. A speaker
        starts ``phase_s`` into its cycle."""
        deadline = time.monotonic() + OPEN_TIMEOUT_S
        while True:
            self._phase_s = phase_s
            self._mic = self._microphone(phase_s)
            self._load = LoadCall(self.client, "demo")
            try:
                await self._load.connect(self._mic)
                break
            except lc.Overloaded as refused:
                self.refusals += 1
                await self._load.hang_up()
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    raise
                await asyncio.sleep(min(left_s, refused.retry_after or 1.0))  # as asked
        async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
            while not self._load.video_times:  # noqa: ASYNC110 - the counter task appends
                await asyncio.sleep(0.05)

    def frames_between(self, start: float, end: float) -> int:
        """Video frames received in [start, end) (``time.monotonic``)."""
        load = self._load
        return 0 if load is None else sum(1 for t in load.video_times if start <= t < end)

    def position_s(self, now: float) -> float:
        """Where in its cycle a speaker's microphone is at ``now`` (``time.monotonic``)."""
        mic = self._mic
        started = mic.started_at if mic is not None and mic.started_at is not None else now
        return (self._phase_s + now - started) % CYCLE_S

    def spoken_s(self, start: float, end: float) -> float:
        """Seconds of [start, end) in which the microphone sent speech."""
        mic = self._mic
        if mic is None or mic.started_at is None or not self.speaks:
            return 0.0
        step = 0.02
        times = np.arange(max(start, mic.started_at), end, step)
        at = (self._phase_s + times - mic.started_at) % CYCLE_S
        return float(np.count_nonzero(at < SPEAK_S) * step)

    async def state(self) -> dict[str, Any]:
        """``GET /sessions/{id}``."""
        return await self.client.state(self.session_id)

    async def hang_up(self) -> None:
        if self._load is not None:
            await self._load.hang_up()


class SoakViewer:
    """One WHEP viewer (:class:`~benchmarks.whep_load.WhepViewer`: its frames counted as
    aiortc assembles them, undecoded), moved to another session on demand. ``http`` has
    the server's base URL."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self._http = http
        self._viewer: WhepViewer | None = None
        self._frames_before = 0  # frames of the viewers before this one

    async def watch(self, session_id: str, timeout_s: float = OPEN_TIMEOUT_S) -> None:
        """Watch ``session_id`` (leaving what it watched), until its first video frame."""
        await self.leave()
        viewer = self._viewer = WhepViewer(self._http, session_id, decode=False)
        await viewer.watch()
        async with asyncio.timeout(timeout_s):
            while not viewer.video.media:  # noqa: ASYNC110 - its reader task appends
                await asyncio.sleep(0.05)

    @property
    def session_id(self) -> str:
        return self._viewer.session_id if self._viewer is not None else ""

    @property
    def frames(self) -> int:
        """Video frames received by every viewer this one has been so far."""
        now = len(self._viewer.video.media) if self._viewer is not None else 0
        return self._frames_before + now

    async def leave(self) -> None:
        if self._viewer is not None:
            self._frames_before += len(self._viewer.video.media)
            await self._viewer.leave()
            self._viewer = None


#: Which call each replacement hangs up, in turn: the watched speaker, a listener, the
#: other speaker, the other listener (so a short run replaces both kinds).
REPLACEMENT_ORDER = (0, 2, 1, 3)


class Cast:
    """The soak's four calls, two speakers (slots 0, 1) and two listeners (2, 3), and a
    viewer of the call in slot 0."""

    def __init__(
        self, client: lc.Client, http: aiohttp.ClientSession, speech: Speech, keepalive_s: float
    ) -> None:
        self.calls = [
            SoakCall(client, speaks, speech, keepalive_s) for speaks in (True, True, False, False)
        ]
        self.viewer = SoakViewer(http)
        self.replacements = 0
        self._refusals_before = 0  # of the calls replaced

    @property
    def refusals(self) -> int:
        """Offers refused for room so far, retried."""
        return self._refusals_before + sum(c.refusals for c in self.calls)

    async def open(self) -> None:
        """The listeners, the speakers (their first words :data:`FIRST_WORDS_S` and half
        a cycle later, so that all four are admitted before the model has run: admission
        prices a call by what the model's frames have cost, as if it spoke all the time),
        then the viewer."""
        first_s = (FIRST_WORDS_S, FIRST_WORDS_S + CYCLE_S / 2)
        for slot, phase_s in ((2, 0.0), (3, 0.0), (0, -first_s[0]), (1, -first_s[1])):
            await self.calls[slot].open(phase_s % CYCLE_S)
        await self.viewer.watch(self.calls[0].session_id)

    async def warm_up(self, timeout_s: float = OPEN_TIMEOUT_S) -> None:
        """Once the first speaker has had frames lip-synced, replace it (its viewer
        following): every first time of the soak's (a call's codecs freed and others
        opened, a viewer moved, the allocator's pools grown to fit) is then behind the
        steady state the soak measures from. Not a replacement of :data:`REPLACEMENT_ORDER`."""
        speaker = self.calls[0]
        async with asyncio.timeout(timeout_s):
            while True:
                if (await speaker.state())["frames_inferred"] > 0:
                    break
                await asyncio.sleep(0.5)  # polling the server: it has no event for this
        await self._replace(0)

    async def replace_lost(self) -> int:
        """Call again in the place of each call whose session the server ended itself (a
        watchdog, a failed stage: what ``ended_by_server`` counts); how many there were."""
        lost = 0
        for slot, call in enumerate(self.calls):
            try:
                await call.state()
            except lc.SessionNotFound:
                lost += 1
                await self._replace(slot)
        return lost

    async def replace(self) -> SoakCall:
        """Hang up the next call of :data:`REPLACEMENT_ORDER` and call again in its place
        (a speaker half a cycle from the other one); the viewer follows the call it
        watched. Returns the new call, once it has its first frame."""
        slot = REPLACEMENT_ORDER[self.replacements % len(REPLACEMENT_ORDER)]
        self.replacements += 1
        return await self._replace(slot)

    async def _replace(self, slot: int) -> SoakCall:
        old = self.calls[slot]
        watched = old.session_id == self.viewer.session_id
        if watched:
            await self.viewer.leave()
        await old.hang_up()
        self._refusals_before += old.refusals
        other = self.calls[1 - slot] if old.speaks else old
        new = self.calls[slot] = SoakCall(old.client, old.speaks, old.speech, old.keepalive_s)
        await new.open((other.position_s(time.monotonic()) + CYCLE_S / 2) % CYCLE_S)
        if watched:
            await self.viewer.watch(new.session_id)
        return new

    async def close(self) -> None:
        await self.viewer.leave()
        await asyncio.gather(*(call.hang_up() for call in self.calls))
