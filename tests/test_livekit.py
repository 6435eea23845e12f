"""lipstream as the avatar of a LiveKit Agents voice agent, in a real LiveKit room
(``docs/design/livekit.md``, ``docs/guides/livekit.md``).

Everything is real: livekit-server v1.13.5 in dev mode (tests/livekit_server.py), a
livekit-agents worker process registered with it and dispatched to the room, whose job
starts ``lipstream_client.livekit.AvatarSession`` and a real ``AgentSession`` that speaks
espeak-ng speech through ``session.say(..., audio=...)`` (tests/livekit_agent.py), the
lipstream application in this process at its default settings (``livekit.allow_private``
on, for a LiveKit server on loopback), and a subscriber of the ``livekit`` SDK that
decodes the avatar's tracks (tests/livekit_room.py). Times are on the monotonic clock
all these processes share.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import re
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer
from livekit import api, rtc
from livekit.agents.voice.io import PlaybackFinishedEvent

from benchmarks.browser_delay import MOUTH_QUIET_S, av_offsets_ms, mouth_box, rising_edges
from benchmarks.livekit_room import AUDIO_RATE, buzz_bursts, open_level, sound_onsets
from config.settings import Settings
from inference_core.assets.demo_avatar import ensure_demo_avatar
from streaming.live.tasks import STAGES
from tests.live_calls import LATENESS, session_state, until
from tests.livekit_room import Agent, Subscriber, agent_worker, playback
from tests.livekit_server import API_KEY, API_SECRET, run_livekit
from tests.media import espeak_wav, read_wav, require_espeak, resample_linear, write_wav
from tests.nginx_proxy import free_port
from tests.server_process import lipstream_serve
from web.app import build_app
from web.app_keys import SESSIONS

Client = TestClient[Any, Any]
REPO = Path(__file__).resolve().parents[1]
logger = logging.getLogger(__name__)
#: The agent's TTS rate: the avatar resamples it, as it does pushed audio.
TTS_RATE = 24_000
FRAME_S = 0.04
#: |mouth - sound| at the subscriber (ms), median and most. Not the 40 and 80 a browser
#: is held to: this subscriber (the SDK's libwebrtc) plays the avatar's video about 8 ms
#: after it arrives whatever its audio's jitter buffer holds, so the offset is that
#: buffer's level, set early in each run: -73 to +49 ms over 13 runs on the 2-core VM
#: (docs/design/livekit.md §22), steady within a run.
SYNC_MEDIAN_MS, SYNC_MAX_MS = 80.0, 120.0
#: What the agent says to measure lip-sync by (:func:`bursts_wav`).
BURSTS, BURST_S, BURST_GAP_S = 8, 0.2, 0.6
LONG = (
    "this is a long sentence that the agent will not be allowed to finish, because the "
    "user is about to interrupt it in the middle of a word"
)


#: What the tests change from the defaults: a LiveKit server on loopback is allowed.
LIVEKIT = {"livekit": {"allow_private": True}}


def settings(tmp_path: Path) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
            **LIVEKIT,
        }
    )


@contextlib.asynccontextmanager
async def lipstream(tmp_path: Path) -> AsyncIterator[Client]:
    """The application in this process (for what only it shows: its tasks)."""
    async with TestClient(TestServer(build_app(settings(tmp_path)), host="127.0.0.1")) as client:
        yield client


def tts_wav(path: Path, pcm_16k: np.ndarray) -> tuple[Path, float]:
    """``pcm_16k`` as the agent's TTS would hand it over (24 kHz), and its length (s)."""
    pcm = resample_linear(pcm_16k, 16_000, TTS_RATE)
    return write_wav(path, pcm, TTS_RATE), len(pcm) / TTS_RATE


def bursts_wav(tmp_path: Path) -> tuple[Path, float]:
    """:data:`BURSTS` buzz bursts, each after :data:`BURST_GAP_S` of silence
    (``benchmarks/livekit_room.py``'s ``buzz_bursts``), as the agent's TTS would."""
    pcm = buzz_bursts(TTS_RATE, BURSTS, BURST_S, BURST_GAP_S)
    return write_wav(tmp_path / "bursts.wav", pcm, TTS_RATE), len(pcm) / TTS_RATE


def sentence_wav(tmp_path: Path, name: str) -> tuple[Path, np.ndarray]:
    """The long sentence, trimmed to start loud, and its 48 kHz samples to compare with."""
    pcm, rate = read_wav(espeak_wav(tmp_path / f"{name}-espeak.wav", LONG))
    loud = np.flatnonzero(np.abs(pcm) > 0.01)
    pcm = resample_linear(pcm[loud[0] :], rate, 16_000)
    path, _ = tts_wav(tmp_path / f"{name}.wav", pcm)
    return path, resample_linear(pcm, 16_000, AUDIO_RATE)


def ended(metrics: str, reason: str) -> int:
    """``lipstream_sessions_ended_total{reason=...}`` in a ``/metrics`` page."""
    found = re.search(
        rf'^lipstream_sessions_ended_total{{reason="{reason}"}} (\S+)$', metrics, re.M
    )
    return int(float(found.group(1))) if found else 0


def left_behind(session_id: str) -> list[str]:
    """Tasks of the session still running (the application in this process)."""
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().endswith(session_id[:8])]


async def live_sessions(http: ClientSession) -> list[dict[str, Any]]:
    async with http.get("/admin/sessions") as response:
        assert response.status == 200, await response.text()
        sessions: list[dict[str, Any]] = (await response.json())["sessions"]
        return sessions


async def joined(sub: Subscriber) -> None:
    await until(lambda: sub.agent() is not None, "the agent in the room and ready")
    await until(lambda: sub.avatar() is not None, "the avatar in the room")
    await until(lambda: len(sub.heard.frames) >= 25, "the avatar's video at the subscriber")
    await until(lambda: len(sub.heard.audio) >= 100, "the avatar's audio at the subscriber")


async def loud_for(sub: Subscriber, seconds: float, since_s: float) -> float:
    """Wait until the avatar's voice has been heard for ``seconds`` after ``since_s``;
    return when it started."""

    def started() -> float | None:
        onsets = sound_onsets(sub.heard, since_s)
        if onsets and sub.heard.audio_clock()[-1] - onsets[0] >= seconds:
            return onsets[0]
        return None

    return await until(started, f"{seconds:g} s of the avatar's voice")


async def test_an_agent_speaks_through_its_lipstream_avatar(tmp_path: Path) -> None:
    """The agent says eight bursts of a buzz, then a sentence it is interrupted in, then one it
    leaves in the middle of; lipstream runs as ``lipstream serve`` (its own process, as
    in production: the subscriber's decoding does not share its event loop)."""
    require_espeak()
    bursts, bursts_s = bursts_wav(tmp_path)
    pcm, rate = read_wav(espeak_wav(tmp_path / "hello.wav", "hello there"))
    warmup, _ = tts_wav(tmp_path / "warmup.wav", resample_linear(pcm, rate, 16_000))
    sentence, sentence_pcm = sentence_wav(tmp_path, "sentence")
    with run_livekit(tmp_path / "livekit") as livekit:
        async with lipstream_serve(tmp_path, sections=LIVEKIT) as server:
            box = mouth_box(ensure_demo_avatar(tmp_path / "data"))
            url = f"http://127.0.0.1:{server.port}"
            async with agent_worker(livekit, url, tmp_path) as worker:
                sub = Subscriber(livekit, "room-a", box)
                await sub.connect()
                try:
                    await worker.dispatch("room-a")
                    await joined(sub)
                    await _speaks_in_sync(server.http, sub, warmup, bursts, bursts_s)
                    await _interrupts(server.http, sub, sentence, sentence_pcm)
                    await _agent_leaves(server.http, sub, sentence)
                finally:
                    await sub.close()


async def _speaks_in_sync(
    http: ClientSession, sub: Subscriber, warmup: Path, wav: Path, wav_s: float
) -> None:
    avatar, agent = sub.avatar(), sub.agent()
    assert avatar is not None
    assert agent is not None
    assert avatar.attributes["lk.publish_on_behalf"] == agent.identity
    assert avatar.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT
    [info] = await live_sessions(http)
    assert info["kind"] == "livekit", info
    session_id = info["id"]
    async with http.get("/metrics") as response:
        assert 'lipstream_sessions_by_kind{kind="livekit"} 1.0' in await response.text()

    # The session's first words: the model's first runs after it loaded are slow on this
    # VM, and their frames are dropped as late (counted as such); the sync is judged on
    # what follows, as a conversation's second sentence on.
    assert await sub.ask("test.say", str(warmup)) == "ok"
    assert playback(await sub.ask("test.playback"))["interrupted"] is False

    before = await session_state(http, session_id)
    said_at = sub.heard.audio_clock()[-1]
    assert await sub.ask("test.say", str(wav)) == "ok"
    played = playback(await sub.ask("test.playback"))
    assert played["interrupted"] is False, played
    finished = played["finished"][-1]
    assert finished["interrupted"] is False, played
    # All of it, less any 20 ms slots the audio track skipped in it (a loop too busy for
    # real time: never sent, so never heard).
    after = await session_state(http, session_id)
    skipped_s = 0.02 * (after["audio_skipped"] - before["audio_skipped"])
    position = finished["playback_position"]
    assert wav_s - skipped_s - 0.021 <= position <= wav_s + 0.021, (played, wav_s, skipped_s)
    # The metrics livekit-agents reports for an avatar: its join latency.
    assert any(m.get("type") == "avatar_metrics" for m in played["metrics"]), played["metrics"]
    # The subscriber hears the last burst after the avatar sent it by its jitter buffer's
    # level, which a busy machine grows (its playout stretched 0.8 s bursts to 0.86 s in
    # a full suite): wait for every burst, then for the video a second past the last.
    heard = sub.heard

    def all_heard() -> list[float] | None:
        found = sound_onsets(heard, said_at, quiet_s=0.4)
        return found if len(found) >= BURSTS else None

    sounds = await until(all_heard, "every burst heard at the subscriber")
    await until(lambda: heard.frames[-1][0] > sounds[-1] + 1.0, "video caught up")
    assert len(sounds) == BURSTS, sounds
    window = heard.frames_between(sounds[0] - 0.5, sounds[-1] + 1.0)
    span_s = window[-1][0] - window[0][0]
    # 24 a second, the send slots the session skipped (a machine too busy for real time:
    # never sent) counted as if shown; a full suite on a VM the host stole from showed
    # 21.1 a second.
    skipped = after["frames_skipped"] - before["frames_skipped"]
    fps = (len(window) - 1 + skipped) / span_s
    assert fps >= 24.0, (len(window), span_s, skipped)
    assert len(heard.sizes) == 1, heard.sizes
    level = open_level(window)
    mouths = rising_edges([t for t, _ in window], [d for _, d in window], level, MOUTH_QUIET_S)
    offsets = av_offsets_ms(sounds, mouths)
    dropped = {
        k: v - before["frames_dropped"].get(k, 0) for k, v in after["frames_dropped"].items()
    }
    logger.info(
        "mouth - sound onsets (ms): %s, dropped %s", [round(o, 1) for o in offsets], dropped
    )
    assert len(offsets) == len(sounds), (sounds, mouths, dropped)
    size = [abs(o) for o in offsets]
    assert statistics.median(size) <= SYNC_MEDIAN_MS, (offsets, dropped)
    # A frame dropped as late (a loop too busy for real time, counted by the session)
    # shows the listening face for 40 ms: at an onset, the mouth opens a frame later.
    late = sum(n for reason, n in dropped.items() if reason in LATENESS)
    assert sum(s > SYNC_MAX_MS for s in size) <= late, (offsets, dropped)


async def _interrupts(http: ClientSession, sub: Subscriber, wav: Path, pcm: np.ndarray) -> None:
    [info] = await live_sessions(http)
    before = await session_state(http, info["id"])
    since = sub.heard.audio_clock()[-1]
    assert await sub.ask("test.say", str(wav)) == "ok"
    started = await loud_for(sub, 1.5, since)
    cut_at = json.loads(await sub.ask("test.interrupt"))
    played = playback(await sub.ask("test.playback"))
    assert played["interrupted"] is True, played
    finished = played["finished"][-1]
    assert finished["interrupted"] is True, played
    await until(lambda: sub.heard.frames[-1][0] > cut_at + 1.5, "1.5 s of video after the cut")
    after = await session_state(http, info["id"])
    skipped_s = 0.02 * (after["audio_skipped"] - before["audio_skipped"])

    heard = sub.heard
    window = heard.frames_between(started - 1.0, cut_at + 1.5)
    level = open_level(window)
    opened = [t for t, d in window if d > level]
    assert opened, "the mouth never opened"
    assert opened[0] < cut_at, "the mouth never opened before the cut"
    assert opened[-1] <= cut_at + 0.2, (opened[-1] - cut_at, opened[-3:])

    # What the subscriber heard of the sentence, against what lipstream said it played.
    times, rms = heard.audio_clock(), heard.audio_rms()
    after_start = times >= started
    loud = times[after_start & (rms > 0.1 * rms[after_start].max())]
    # The sentence in the same 10 ms blocks, loud by the same rule: where its onset (what
    # ``started`` is) lies in it, and where each loud block is.
    blocks = pcm[: len(pcm) // 480 * 480].reshape(-1, 480)
    sentence_rms = np.sqrt(np.mean(blocks.astype(np.float64) ** 2, axis=1))
    sentence_loud = np.flatnonzero(sentence_rms > 0.1 * sentence_rms.max()) * 0.01
    heard_s = float(loud[-1] - started) + 0.01 + float(sentence_loud[0])
    position = finished["playback_position"]
    later = sentence_loud[sentence_loud >= heard_s + 0.01]
    next_sound_s = float(later[0]) if len(later) else heard_s
    # The position lies between the last sound heard and the next one not heard.
    logger.info(
        "interrupt: last open mouth %.0f ms after it; heard %.3f s, position %.3f s, "
        "next sound at %.3f s, %.2f s of slots skipped",
        1000 * (opened[-1] - cut_at),
        heard_s,
        position,
        next_sound_s,
        skipped_s,
    )
    # Skipped slots were not sent, but the subscriber's jitter buffer made up sound for
    # them: they count in what it heard, not in the position.
    low, high = heard_s - skipped_s - FRAME_S, next_sound_s + FRAME_S
    assert low <= position <= high, (heard_s, position, next_sound_s, skipped_s)


async def _agent_leaves(http: ClientSession, sub: Subscriber, wav: Path) -> None:
    since = sub.heard.audio_clock()[-1]
    assert await sub.ask("test.say", str(wav)) == "ok"
    await loud_for(sub, 0.5, since)
    assert await sub.ask("test.leave") == "ok"

    async def gone() -> bool:
        return not await live_sessions(http)

    await until(gone, "the session ended")
    async with http.get("/metrics") as response:
        metrics = await response.text()
    assert ended(metrics, "agent left") == 1, [
        line for line in metrics.splitlines() if line.startswith("lipstream_sessions_ended")
    ]
    await until(lambda: sub.avatar() is None, "the avatar out of the room")


# --- refusals and faults: the test process plays the agent --------------------------


def stage_tasks() -> set[str]:
    """Running tasks named after a session's stage (``streaming/live/tasks.py``)."""
    prefixes = tuple(f"{stage.replace(' ', '-')}-" for stage in STAGES)
    return {t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(prefixes)}


async def post(client: Client, **body: Any) -> tuple[int, dict[str, Any]]:
    response = await client.post("/livekit/sessions", json=body)
    answer: dict[str, Any] = await response.json()
    return response.status, answer


async def test_tokens_and_urls_that_cannot_work_are_refused_with_what_to_change(
    tmp_path: Path,
) -> None:
    with run_livekit(tmp_path / "livekit") as livekit:
        async with lipstream(tmp_path) as client:
            agent = Agent(livekit, "room-r")
            await agent.connect()
            try:
                before = stage_tasks()
                wrong_key = agent.avatar_token(secret="not-the-servers-secret-0123456789abcdef")
                refusals = {
                    "signed with another key": (wrong_key, livekit.url, 400, "bad_livekit_token"),
                    "no publish right": (
                        agent.avatar_token(can_publish=False),
                        livekit.url,
                        400,
                        "bad_livekit_token",
                    ),
                    "expired": (
                        agent.avatar_token(ttl_s=-60),
                        livekit.url,
                        400,
                        "bad_livekit_token",
                    ),
                    "no agent named": (
                        agent.avatar_token(attributes={}),
                        livekit.url,
                        400,
                        "bad_livekit_token",
                    ),
                    "not a token": ("not.a.token", livekit.url, 400, "bad_livekit_token"),
                    "not a LiveKit URL": (
                        agent.avatar_token(),
                        "ftp://127.0.0.1/",
                        400,
                        "bad_livekit_url",
                    ),
                    "nothing listening": (
                        agent.avatar_token(),
                        f"ws://127.0.0.1:{free_port()}",
                        502,
                        "livekit_unreachable",
                    ),
                }
                for case, (token, url, status, code) in refusals.items():
                    got, answer = await post(client, livekit_url=url, livekit_token=token)
                    assert (got, answer["error"]["code"]) == (status, code), (case, answer)
                    message = answer["error"]["message"]
                    assert "eyJ" not in message, (case, message)  # no token quoted back
                manager = client.app[SESSIONS]
                assert manager.live_count == 0
                assert stage_tasks() == before
                # The room holds only the agent: no avatar joined and stayed.
                assert list(agent.room.remote_participants) == []
            finally:
                await agent.close()


async def test_private_addresses_are_refused_unless_allowed(tmp_path: Path) -> None:
    """At the default settings a LiveKit URL on loopback is refused before anything
    connects: the API must not reach into the network the server runs in."""
    defaults = Settings.model_validate(
        {"avatars": {"root": str(tmp_path / "a"), "data_dir": str(tmp_path / "d")}}
    )
    token = (
        api.AccessToken(API_KEY, API_SECRET)
        .with_identity("avatar")
        .with_grants(api.VideoGrants(room_join=True, room="room"))
        .with_attributes({"lk.publish_on_behalf": "agent"})
        .to_jwt()
    )
    async with TestClient(TestServer(build_app(defaults), host="127.0.0.1")) as client:
        got, answer = await post(client, livekit_url="ws://127.0.0.1:7880", livekit_token=token)
        assert (got, answer["error"]["code"]) == (400, "bad_livekit_url"), answer
        assert "livekit.allow_private" in answer["error"]["message"], answer


async def open_avatar(client: Client, agent: Agent) -> str:
    got, answer = await post(
        client, livekit_url=agent.livekit.url, livekit_token=agent.avatar_token()
    )
    assert got == 201, answer
    assert answer["agent"] == agent.identity, answer
    session_id: str = answer["session_id"]
    return session_id


async def played_all(
    client: Client,
    session_id: str,
    before: dict[str, Any],
    finished: PlaybackFinishedEvent,
    length_s: float,
) -> None:
    """``finished`` reports all ``length_s`` played, less the 20 ms slots the audio track
    skipped since ``before`` (a loop too busy for real time: not sent, not heard)."""
    after = await session_state(client, session_id)
    skipped_s = 0.02 * (after["audio_skipped"] - before["audio_skipped"])
    position = finished.playback_position
    assert length_s - skipped_s - 0.021 <= position <= length_s + 0.021, (position, skipped_s)


def session_tasks(session_id: str) -> list[str]:
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().endswith(session_id[:8])]


async def test_two_rooms_at_once_and_one_ended_leaves_the_other_speaking(
    tmp_path: Path, speech_16k: tuple[np.ndarray, list[tuple[float, float]]]
) -> None:
    pcm, _ = speech_16k
    with run_livekit(tmp_path / "livekit") as livekit:
        async with lipstream(tmp_path) as client:
            one, two = Agent(livekit, "room-1"), Agent(livekit, "room-2")
            await one.connect()
            await two.connect()
            try:
                first, second = await open_avatar(client, one), await open_avatar(client, two)
                manager = client.app[SESSIONS]
                assert {s.kind for s in manager.sessions} == {"livekit"}
                before = await session_state(client, first)
                await one.speak(pcm[16_000:32_000], 16_000)  # 1 s from the first phrase on
                await until(lambda: one.finished, "room 1's segment played")
                assert one.finished[-1].interrupted is False
                await played_all(client, first, before, one.finished[-1], 1.0)

                ended = await client.delete(f"/sessions/{first}")
                assert ended.status == 200, await ended.text()
                await until(lambda: not session_tasks(first), "session 1's tasks ended")
                await until(
                    lambda: f"avatar-{one.name}" not in one.room.remote_participants,
                    "avatar 1 out of its room",
                )
                assert [s.session_id for s in manager.sessions] == [second]
                before = await session_state(client, second)
                await two.speak(pcm[16_000:40_000], 16_000)
                await until(lambda: two.finished, "room 2's segment played")
                assert two.finished[-1].interrupted is False
                await played_all(client, second, before, two.finished[-1], 1.5)
            finally:
                await one.close()
                await two.close()


async def test_the_session_ends_when_its_agent_never_comes_or_livekit_dies(
    tmp_path: Path,
) -> None:
    """An avatar whose agent is not in the room within ``livekit.agent_timeout_s`` (here
    2 s, not 30, to keep the test short) leaves; one whose LiveKit server is killed
    mid-call ends within ``livekit.connect_timeout_s`` (its default, 10 s) of losing it."""
    app = build_app(
        Settings.model_validate(
            {
                "avatars": {"root": str(tmp_path / "a"), "data_dir": str(tmp_path / "d")},
                "video": {"preset": "ultrafast"},
                "livekit": {"allow_private": True, "agent_timeout_s": 2},
            }
        )
    )
    with run_livekit(tmp_path / "livekit") as livekit:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            manager = client.app[SESSIONS]
            absent = Agent(livekit, "room-absent")  # mints its avatar's token, never joins
            lonely = await open_avatar(client, absent)
            await until(lambda: not session_tasks(lonely), "the lonely avatar's session ended")
            assert manager.counters.ended_by_reason == {"agent never joined": 1}

            agent = Agent(livekit, "room-k")
            await agent.connect()
            try:
                session_id = await open_avatar(client, agent)
                [session] = manager.sessions
                await until(lambda: session.snapshot().state == "streaming", "streaming")
                killed_at = time.monotonic()
                livekit.kill()
                await until(lambda: not session_tasks(session_id), "the session ended")
                took_s = time.monotonic() - killed_at
                reasons = manager.counters.ended_by_reason
                assert reasons.keys() - {"agent never joined"} <= {
                    "livekit unreachable",
                    "livekit disconnected",
                }, reasons
                assert manager.counters.ended == 2
                logger.info(
                    "killed livekit-server: the session ended in %.1f s: %s", took_s, reasons
                )
                assert took_s <= 10 + 5, took_s
            finally:
                await agent.close()


async def test_the_example_agent_speaks_espeak_lines() -> None:
    """clients/python/examples/livekit_avatar_agent.py (the guide's runnable agent):
    importable with the client's extra, and its lines are real speech frames."""
    require_espeak()
    path = REPO / "clients" / "python" / "examples" / "livekit_avatar_agent.py"
    spec = importlib.util.spec_from_file_location("livekit_avatar_agent", path)
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    frames = [frame async for frame in example.speech_frames(example.LINES[0])]
    rate = frames[0].sample_rate
    assert all(f.samples_per_channel == int(rate * 0.02) for f in frames[:-1])
    pcm = np.concatenate([np.frombuffer(f.data, dtype=np.int16) for f in frames])
    assert len(pcm) / rate > 2.0  # a sentence
    assert np.abs(pcm).max() > 3000  # spoken, not silence
