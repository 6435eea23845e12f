"""Audio streamed in over the WebSocket, and the session's events on every channel.

The server is the real application (in process, real aiortc peer connections, the demo
avatar's real ONNX models); the callers are real aiortc peers and aiohttp WebSockets.
Tests wait for events and media points and count what happened (``tests/live_calls.py``);
timing figures (first chunk to first lip-synced frame, barge-in) are the benchmarks'
(``benchmarks/voice_agent.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection, RTCSessionDescription

from config.settings import Settings
from inference_core.features.encoder import AudioEncoder
from inference_core.features.stream import offline_features
from streaming.audio_in.resample import MonoResampler
from streaming.audio_in.stream import STREAM_RATES, PcmStreamDecoder, StreamFormat
from streaming.audio_rates import CHUNK_SAMPLES, FEATURE_RATE, OUT_RATE
from streaming.live.events import SessionEvents
from streaming.live.mixer import AudioMixer
from streaming.live.session import Session
from streaming.live.stream_in import AudioStreamIn
from streaming.live.utterances import Mark, Playback, UtteranceLedger
from tests.live_calls import assert_lip_synced, until
from tests.media import SAMPLE_RATE, resample_linear, speech_with_pauses, write_wav
from tests.test_streaming import MouthProbe, _package
from tests.webrtc_client import Caller
from web.app import build_app
from web.app_keys import SESSIONS
from web.session_tokens import mint_token

FPS = 25
MAX_BUFFER_S = 3.0
SECRET = "a-test-secret-of-at-least-32-bytes!!"

Client = TestClient[Any, Any]


def _settings(tmp_path: Path, **sections: dict[str, Any]) -> Settings:
    session = {
        "max_stream_buffer_s": MAX_BUFFER_S,
        **sections.pop("session", {}),
    }
    return Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
            "session": session,
            **sections,
        }
    )


@pytest.fixture
async def client(tmp_path: Path, loopback: None) -> AsyncIterator[Client]:
    async with TestClient(TestServer(build_app(_settings(tmp_path)), host="127.0.0.1")) as c:
        yield c


def _session(client: Client, session_id: str) -> Session:
    session: Session = client.app[SESSIONS].get(session_id)
    return session


def _pcm(samples: np.ndarray, fmt: str) -> bytes:
    if fmt == "s16le":
        return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    return samples.astype("<f4").tobytes()


def _speech(tmp_path: Path, text: str, rate: int) -> np.ndarray:
    pcm, _ = speech_with_pauses(tmp_path, (text,), pause_s=0.05)
    return resample_linear(pcm, SAMPLE_RATE, rate)


class Events:
    """Everything one WebSocket or event stream received, in order."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in self.items
            if e["type"] == kind and all(e.get(k) == v for k, v in match.items())
        ]

    async def wait(self, kind: str, **match: Any) -> dict[str, Any]:
        found = await until(lambda: self.of(kind, **match), f"a {kind} event {match or ''}")
        return found[0]


async def _read_ws(ws: aiohttp.ClientWebSocketResponse, events: Events) -> None:
    async for message in ws:
        if message.type == WSMsgType.TEXT:
            events.items.append(json.loads(message.data))


async def _open_stream(
    client: Client, session_id: str, query: str = "format=s16le&rate=24000", **kwargs: Any
) -> tuple[aiohttp.ClientWebSocketResponse, Events, asyncio.Task[None]]:
    ws = await client.ws_connect(f"/sessions/{session_id}/audio/stream?{query}", **kwargs)
    events = Events()
    reader = asyncio.create_task(_read_ws(ws, events))
    await events.wait("ready")
    return ws, events, reader


# --- the parts, with time driven by hand --------------------------------------------


def test_the_ledger_marks_where_utterances_start_and_end() -> None:
    ledger = UtteranceLedger()
    first = ledger.open("push")
    ledger.queued(first, 1500)  # a chunk and a half
    ledger.close(first)
    second = ledger.open("stream")
    ledger.queued(second, 480)
    anyone = Playback(first, "push")  # (a mark's playback is not compared)
    assert ledger.taken(960, 0) == [Mark("start", first, "push", 0.0, 0.0, anyone)]
    marks = ledger.taken(960, 1)  # the rest of the first, the start of the second
    assert [(m.kind, m.utterance, m.media_ms) for m in marks] == [
        ("end", first, 31.2),
        ("start", second, 31.2),
    ]
    assert marks[0].duration_ms == 31.25
    assert ledger.taken(960, 2) == []  # the stream's queue ran dry: it is still open
    ledger.queued(second, 960)
    ledger.close(second)
    marks = ledger.taken(960, 3)
    assert [(m.kind, m.media_ms, m.duration_ms) for m in marks] == [("end", 80.0, 30.0)]
    empty = ledger.open("say")
    ledger.close(empty)  # nothing queued: no events at all
    assert ledger.taken(0, 4) == []
    cut = ledger.open("push")
    ledger.queued(cut, 960)
    assert ledger.clear() == [cut]
    assert ledger.taken(960, 5) == []


def test_an_utterance_after_an_interrupt_starts_with_a_fresh_resampler() -> None:
    """What the resampler held of a cut utterance is not heard at the start of the next:
    after the interrupt, the stream gives the mixer what a new stream would."""

    def stream_into(mixer: AudioMixer) -> AudioStreamIn:
        decoder = PcmStreamDecoder(StreamFormat("f32le", 24_000))
        return AudioStreamIn(
            mixer, decoder, max_buffer_s=10.0, on_queued=lambda _: None, on_closed=lambda _: None
        )

    rng = np.random.default_rng(3)
    cut, spoken = (rng.uniform(-0.5, 0.5, 2_400).astype("<f4") for _ in range(2))
    mixer, fresh_mixer = AudioMixer(), AudioMixer()
    stream, fresh = stream_into(mixer), stream_into(fresh_mixer)
    stream.write(cut.tobytes())  # its last few samples stay in the resampler
    mixer.clear_pushed()  # an interrupt cuts it
    for into in (stream, fresh):
        into.write(spoken.tobytes())
        into.end()
    np.testing.assert_array_equal(mixer.pushed_samples(), fresh_mixer.pushed_samples())


async def test_listeners_coalesce_queued_ms_and_overflow_alone() -> None:
    hub = SessionEvents("s1", queue_size=8)
    slow, fast = hub.listen(), hub.listen()
    for level in range(100):  # a stream's acknowledgements: only the latest matters
        hub.publish("queued_ms", queued_ms=float(level))
    assert slow.waiting == 1
    assert (await fast.get()) == {
        "type": "queued_ms",
        "seq": 100,
        "session_id": "s1",
        "queued_ms": 99.0,
    }
    overflowed: list[bool] = []
    slow.on_overflow = lambda: overflowed.append(True)
    for _ in range(8):
        hub.publish("interrupted", utterances=[], dropped_ms=0.0)
        assert (await fast.get())["type"] == "interrupted"  # the reader that reads keeps up
    assert slow.overflowed
    assert overflowed == [True]
    assert await slow.get() is None
    assert hub.listeners == 1
    hub.end("hung up")
    assert (await fast.get())["type"] == "session_ended"
    assert await fast.get() is None
    late = hub.listen()  # after the end: told so at once
    assert (await late.get())["reason"] == "hung up"
    assert await late.get() is None


# --- the stream ------------------------------------------------------------------------


async def test_streamed_speech_is_spoken_told_and_interrupted(
    client: Client, tmp_path: Path
) -> None:
    caller = Caller(client)
    await caller.connect(microphone=None)
    try:
        await caller.wait_for_frames(5)
        sid = caller.session_id
        ws, events, reader = await _open_stream(client, sid)
        speech = _speech(tmp_path, "hello there, how are you today", 24_000)
        for start in range(0, len(speech), 960):  # 40 ms messages, as a TTS engine sends
            await ws.send_bytes(_pcm(speech[start : start + 960], "s16le"))
        await ws.send_json({"type": "end"})
        started = await events.wait("speech_started", utterance=1)
        # Operators see it: the session speaks, its stream is open, and /metrics counts it.
        speaking = (await (await client.get(f"/sessions/{sid}")).json())["app_audio"]
        assert speaking["audio_stream"]
        assert speaking["event_listeners"] == 1
        assert speaking["utterances"] == 1
        metrics = await (await client.get("/metrics")).text()
        assert "lipstream_audio_streams_open 1.0" in metrics
        ended = await events.wait("speech_ended", utterance=1)
        assert started["source"] == ended["source"] == "stream"
        assert started["seq"] < ended["seq"]
        assert abs(ended["duration_ms"] - len(speech) / 24) <= 25  # its whole length played
        assert ended["interrupted"] is False
        assert 0 < ended["played_ms"] <= ended["duration_ms"]  # (less a slot a busy loop skipped)
        assert abs(ended["media_ms"] - started["media_ms"] - ended["duration_ms"]) <= 25
        # As it played, the queue's level was told, down to empty.
        drained = await events.wait("queued_ms", queued_ms=0.0)
        assert drained["utterance"] is None
        levels = [e["queued_ms"] for e in events.of("queued_ms") if e["seq"] > started["seq"]]
        assert len(levels) >= 3
        assert levels == sorted(levels, reverse=True)  # nothing more was queued meanwhile
        state = await (await client.get(f"/sessions/{sid}")).json()
        assert_lip_synced(state, due_at_least=10)
        assert not state["app_audio"]["speaking"]  # it ended

        # A second, long utterance; barge in once the caller is getting it.
        long = _speech(tmp_path, "this sentence goes on and on for quite a long while now", 24_000)
        for start in range(0, len(long), 24_000):
            await ws.send_bytes(_pcm(long[start : start + 24_000], "s16le"))
        await events.wait("speech_started", utterance=2)
        session = _session(client, sid)
        await ws.send_json({"type": "interrupt"})
        interrupted = await events.wait("interrupted")
        cut_video = session.peer.sent().video_next  # every slot from here on is after the interrupt
        assert interrupted["utterances"] == [2]
        assert interrupted["dropped_ms"] > 500
        # The stream goes on: the next message opens utterance 3.
        await ws.send_bytes(_pcm(speech[:4800], "s16le"))
        await ws.send_json({"type": "end"})
        await events.wait("speech_ended", utterance=3)
        (cut_short,) = events.of("speech_ended", utterance=2)  # ended by the cut, before it
        assert cut_short["interrupted"] is True
        assert cut_short["seq"] < interrupted["seq"]
        assert 0 < cut_short["played_ms"] < cut_short["duration_ms"]
        assert interrupted["played"] == [{"utterance": 2, "played_ms": cut_short["played_ms"]}]

        # The mouth rests from 200 ms (5 frames) after the interrupt until utterance 3.
        received = caller.received
        probe = MouthProbe(_package(client, "demo"))
        third = events.of("speech_started", utterance=3)[0]
        resumed = int(third["media_ms"] * FPS / 1000)
        await until(lambda: caller.video_indices[-1] >= resumed, "the frames up to utterance 3")
        tail = [i for i in caller.video_indices if cut_video + 5 <= i < resumed - 1]
        assert len(tail) >= 5
        assert max(probe.diff(i, received.luma[i]) for i in tail) < 4
        await ws.close()
        await reader
    finally:
        await caller.hang_up()


@pytest.mark.parametrize("fmt", ["s16le", "f32le"])
async def test_chunks_at_every_rate_give_the_features_of_a_whole_push(
    client: Client, tmp_path: Path, fmt: str
) -> None:
    """Streamed in uneven messages or pushed whole, the same audio reaches the mixer as the
    same samples, and so gives the same features (the model sees the same input). Both are
    resampled once, straight to the mixer's 48 kHz (at 48 kHz not at all), the stream by
    a resampler kept across its messages and flushed at ``end``."""
    pushed, streamed = Caller(client), Caller(client)
    await pushed.connect_without_answer()  # never connects: the queue is not played
    await streamed.connect_without_answer()
    whole, parts = _session(client, pushed.session_id), _session(client, streamed.session_id)
    encoder = AudioEncoder.from_path(_package(client, "demo").encoder_path)  # type: ignore[arg-type]
    rng = np.random.default_rng(7)
    speech16 = _speech(tmp_path, "one two three", SAMPLE_RATE)
    for rate in STREAM_RATES:
        speech = resample_linear(speech16, SAMPLE_RATE, rate)
        body = write_wav(tmp_path / "whole.wav", speech, rate).read_bytes()
        response = await client.post(
            f"/sessions/{pushed.session_id}/audio",
            data=body if fmt == "s16le" else _pcm(speech, fmt),
            headers={"Content-Type": "audio/wav" if fmt == "s16le" else "application/octet-stream"},
            params={} if fmt == "s16le" else {"format": fmt, "rate": str(rate), "channels": "1"},
        )
        assert response.status == 202, await response.text()
        ws, events, reader = await _open_stream(
            client, streamed.session_id, f"format={fmt}&rate={rate}"
        )
        raw = _pcm(speech, fmt)
        size = 2 if fmt == "s16le" else 4
        at = 0
        while at < len(raw):
            step = int(rng.integers(1, rate // 8)) * size
            await ws.send_bytes(raw[at : at + step])
            at += step
        await ws.send_json({"type": "end"})
        await ws.close()
        await reader
        assert not events.of("error")
        a, b = whole.pipeline.mixer.pushed_samples(), parts.pipeline.mixer.pushed_samples()
        assert len(a) == len(b) > 0, rate
        np.testing.assert_array_equal(a, b)
        assert _features(a, encoder) == _features(b, encoder)
        whole.interrupt()
        parts.interrupt()
    await pushed.close()
    await streamed.close()


def _features(samples_48k: np.ndarray, encoder: AudioEncoder) -> list[bytes]:
    """The timeline's path: 20 ms chunks at 48 kHz → 16 kHz → features."""
    down = MonoResampler(OUT_RATE, FEATURE_RATE)
    chunks = [samples_48k[i : i + CHUNK_SAMPLES] for i in range(0, len(samples_48k), CHUNK_SAMPLES)]
    pcm16 = np.concatenate([down.push(c) for c in chunks])
    return [f.features.tobytes() for f in offline_features(pcm16, encoder)]


async def test_bad_messages_and_a_fast_producer_are_told_and_the_stream_goes_on(
    client: Client,
) -> None:
    caller, other = Caller(client), Caller(client)
    await caller.connect_without_answer()
    await other.connect(microphone=None)  # a live call beside it, unaffected
    try:
        await other.wait_for_frames(5)
        frames_before = len(other.received.video_times)
        ws, events, reader = await _open_stream(
            client, caller.session_id, "format=f32le&rate=16000"
        )
        tone = (0.3 * np.sin(np.arange(16_000) / 5)).astype(np.float32)
        bad = [
            b"\x00\x01\x02",  # not whole samples
            np.array([0.1, np.nan], dtype="<f4").tobytes(),
            np.array([np.inf], dtype="<f4").tobytes(),
            np.zeros(16_001, dtype="<f4").tobytes(),  # over 1 s
        ]
        for message in bad:
            await ws.send_bytes(message)
        await ws.send_str("not json")
        await ws.send_json({"type": "shout"})
        await until(lambda: len(events.of("error")) == 6, "six error messages")
        codes = [e["code"] for e in events.of("error")]
        assert codes == ["bad_frame"] * 4 + ["bad_message"] * 2
        assert all(e["message"] for e in events.of("error"))
        # Nothing of those was queued; a good message still is.
        assert _session(client, caller.session_id).queued_audio_s == 0
        for _ in range(4):  # 4 s against a 3 s bound: the fourth is refused
            await ws.send_bytes(tone.tobytes())
        full = await events.wait("error", code="audio_queue_full")
        assert full["refused_ms"] == 1000.0
        assert full["queued_ms"] == pytest.approx(3000.0, abs=1)
        queued = [e["queued_ms"] for e in events.of("queued_ms")]
        assert len(queued) >= 1
        assert max(queued) <= MAX_BUFFER_S * 1000 + 1
        assert not ws.closed
        await ws.send_json({"type": "interrupt"})  # drains it: room again
        await events.wait("interrupted")
        await ws.send_bytes(tone[:1600].tobytes())
        await until(
            # (less a few samples the resampler holds until the utterance ends)
            lambda: 95 <= events.of("queued_ms")[-1]["queued_ms"] <= 100,
            "the queue to hold the new 100 ms",
        )
        await other.wait_for_frames(frames_before + 25)
        state = await (await client.get(f"/sessions/{other.session_id}")).json()
        assert state["state"] == "streaming"
        await ws.close()
        await reader
    finally:
        await other.hang_up()
        await caller.close()


async def test_refusals_come_before_the_upgrade(client: Client) -> None:
    caller = Caller(client)
    await caller.connect_without_answer()
    sid = caller.session_id
    path = f"/sessions/{sid}/audio/stream"
    try:
        for query, code in (
            ("format=s24le&rate=16000", "bad_stream_format"),
            ("format=s16le&rate=8000", "bad_stream_format"),
            ("format=s16le", "bad_stream_format"),
            ("format=s16le&rate=16000&channels=2", "bad_stream_format"),
        ):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(f"{path}?{query}")
            assert refused.value.status == 400
            answer = await client.get(f"{path}?{query}", headers=_upgrade_headers())
            assert (await answer.json())["error"]["code"] == code
        plain = await client.get(f"{path}?format=s16le&rate=16000")
        assert (await plain.json())["error"]["code"] == "websocket_required"
        missing = await client.get(
            "/sessions/nobody/audio/stream?format=s16le&rate=16000", headers=_upgrade_headers()
        )
        assert missing.status == 404
        assert (await missing.json())["error"]["code"] == "session_not_found"
        ws, _, reader = await _open_stream(client, sid)
        for headers in (_upgrade_headers(), {}):  # a browser asks again over plain HTTP
            second = await client.get(f"{path}?format=s16le&rate=16000", headers=headers)
            assert second.status == 409
            assert (await second.json())["error"]["code"] == "stream_busy"
        await ws.close()
        await reader
        await until(lambda: _free_for_a_stream(client, sid), "the first stream to close")
        ws, _, reader = await _open_stream(client, sid)  # one at a time, not one for ever
        await ws.close()
        await reader
    finally:
        await caller.close()


def _free_for_a_stream(client: Client, session_id: str) -> bool:
    return not _session(client, session_id).app_audio.stream_open


def _upgrade_headers() -> dict[str, str]:
    return {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }


async def test_tokens_guard_the_stream_and_the_events(tmp_path: Path, loopback: None) -> None:
    settings = _settings(tmp_path, auth={"jwt_secret": SECRET})
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        token = mint_token(settings.auth, "demo", ttl_s=60)
        foreign = mint_token(settings.auth, "someone-else", ttl_s=60)
        caller = Caller(client, headers={"Authorization": f"Bearer {token}"})
        await caller.connect_without_answer()
        sid = caller.session_id
        try:
            for route in ("audio/stream?format=s16le&rate=16000&", "events?"):
                for extra, status in (("", 401), (f"token={foreign}", 401), ("token=junk", 401)):
                    answer = await client.get(
                        f"/sessions/{sid}/{route}{extra}", headers=_upgrade_headers()
                    )
                    assert answer.status == status, (route, extra)
                    assert (await answer.json())["error"]["code"] == "unauthorized"
            ws, _, reader = await _open_stream(
                client, sid, f"format=s16le&rate=16000&token={token}"
            )
            await ws.close()
            await reader
            ws, _, reader = await _open_stream(
                client, sid, headers={"Authorization": f"Bearer {token}"}
            )
            await ws.close()
            await reader
        finally:
            await caller.close()


async def test_the_end_of_a_session_ends_its_stream_and_event_streams(client: Client) -> None:
    caller = Caller(client)
    await caller.connect_without_answer()
    sid = caller.session_id
    ws, events, reader = await _open_stream(client, sid)
    sse = await client.get(f"/sessions/{sid}/events")
    assert sse.status == 200
    assert sse.headers["Content-Type"] == "text/event-stream"
    hung_up = await client.delete(f"/sessions/{sid}")
    assert hung_up.status == 200
    await reader  # the server closed the socket
    assert ws.close_code == 1000
    assert events.items[-1]["type"] == "session_ended"
    assert events.items[-1]["reason"] == "hung up by API"
    text = (await sse.read()).decode()  # the response ends
    assert text.rstrip().endswith('"reason": "hung up by API"}'), text[-200:]
    assert "event: session_ended" in text
    gone = await client.get(f"/sessions/{sid}/events")
    assert gone.status == 404
    await caller.close()


async def test_server_sent_events_follow_a_say(client: Client) -> None:
    caller = Caller(client)
    await caller.connect(microphone=None)
    try:
        await caller.wait_for_frames(5)
        sid = caller.session_id
        response = await client.get(f"/sessions/{sid}/events")
        blocks: list[dict[str, str]] = []
        reader = asyncio.create_task(_read_sse(response, blocks))
        said = await client.post(f"/sessions/{sid}/say", json={"text": "good morning"})
        assert said.status == 202
        assert (await said.json())["utterance"] == 1
        await until(
            lambda: any(b.get("event") == "speech_ended" for b in blocks), "speech_ended over SSE"
        )
        kinds = [b["event"] for b in blocks]
        assert kinds[0] == "queued_ms"
        assert kinds.index("speech_started") < kinds.index("speech_ended")
        for block in blocks:
            data = json.loads(block["data"])
            assert data["type"] == block["event"]
            assert str(data["seq"]) == block["id"]
            assert data["session_id"] == sid
        started = json.loads(blocks[kinds.index("speech_started")]["data"])
        assert started["utterance"] == 1
        assert started["source"] == "say"
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        response.close()
        await until(lambda: _session(client, sid).events.listeners == 0, "the listener to go")
    finally:
        await caller.hang_up()


async def _read_sse(response: aiohttp.ClientResponse, blocks: list[dict[str, str]]) -> None:
    block: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if block:
                blocks.append(block)
            block = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            block[key] = value


async def test_the_data_channel_carries_events_and_takes_an_interrupt(client: Client) -> None:
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    pc.addTransceiver("audio", direction="recvonly")
    channel = pc.createDataChannel("lipstream")
    received: list[dict[str, Any]] = []
    channel.on("message", lambda message: received.append(json.loads(message)))
    drains: list[asyncio.Task[None]] = []
    pc.on("track", lambda track: drains.append(asyncio.create_task(_drain(track))))
    await pc.setLocalDescription(await pc.createOffer())
    offer = {"sdp": pc.localDescription.sdp, "type": "offer", "avatar": "demo"}
    answer = await (await client.post("/offer", json=offer)).json()
    sid = answer["session_id"]
    try:
        await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
        await until(lambda: channel.readyState == "open", "the data channel to open")
        said = await client.post(f"/sessions/{sid}/say", json={"text": "a long sentence " * 4})
        assert said.status == 202
        await until(_has(received, "speech_started"), "speech_started on the data channel")
        channel.send(json.dumps({"type": "interrupt"}))
        await until(_has(received, "interrupted"), "interrupted on the data channel")
        interrupted = next(e for e in received if e["type"] == "interrupted")
        assert interrupted["utterances"] == [1]
        assert _session(client, sid).queued_audio_s == 0
        channel.send("shout")
        await until(_has(received, "error"), "an error for a message it does not take")
        assert next(e for e in received if e["type"] == "error")["code"] == "bad_message"
        await client.delete(f"/sessions/{sid}")
        await until(_has(received, "session_ended"), "session_ended on the data channel")
    finally:
        await pc.close()
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)


def _has(events: list[dict[str, Any]], kind: str) -> Callable[[], bool]:
    return lambda: any(e["type"] == kind for e in events)


async def _drain(track: Any) -> None:
    while True:
        await track.recv()


async def test_a_client_that_does_not_read_events_is_cut_off_alone(
    tmp_path: Path, loopback: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="streaming.live.events")
    settings = _settings(tmp_path, session={"event_queue_size": 8})
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        caller, other = Caller(client), Caller(client)
        await caller.connect_without_answer()
        await other.connect(microphone=None)
        sid = caller.session_id
        try:
            await other.wait_for_frames(5)
            frames_before = len(other.received.video_times)

            def small_receive_buffer(addr_info: Any) -> socket.socket:
                family, kind, proto, _, _ = addr_info
                sock = socket.socket(family, kind, proto)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                return sock

            connector = aiohttp.TCPConnector(socket_factory=small_receive_buffer)
            async with aiohttp.ClientSession(connector=connector) as http:
                url = client.make_url(f"/sessions/{sid}/audio/stream?format=s16le&rate=16000")
                ws = await http.ws_connect(url, max_msg_size=0)
                session = _session(client, sid)
                sent = 0
                # Every interrupt is an event; this client never reads one.
                while session.events.listeners and sent < 200_000:
                    try:
                        await ws.send_str('{"type": "interrupt"}')
                    except (ConnectionError, aiohttp.ClientError):
                        break  # the server already dropped the connection
                    sent += 1
                    if sent % 100 == 0:
                        await asyncio.sleep(0)  # let the server run (not a wait for a state)
                assert session.events.listeners == 0, f"still listening after {sent} events"
                overflowed = [r for r in caplog.records if "listener overflowed" in r.getMessage()]
                assert overflowed, f"the listener went, but not for lagging ({sent} events)"
                # The server hung up on it: reading now ends in a close or an error.
                kinds = set()
                async for message in ws:
                    kinds.add(message.type)
                assert ws.closed
            assert session.state == "new"  # the session itself lives on
            await other.wait_for_frames(frames_before + 25)
            state = await (await client.get(f"/sessions/{other.session_id}")).json()
            assert state["state"] == "streaming"
        finally:
            await other.hang_up()
            await caller.close()
