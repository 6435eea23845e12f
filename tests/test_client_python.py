"""The Python client (``clients/python``, ``lipstream_client``) against a real server.

Live tests start ``lipstream serve`` as a subprocess and call it over loopback with the
client alone; the server's packages are used here only to read its error table. The
pure parts (flow control, event-stream parsing, the drop-oldest queue, PCM, errors) are
tested first, without a server, with the clock driven by hand.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import jwt
import numpy as np
import pytest
from aiohttp import ClientWebSocketResponse, WSMsgType, web
from aiohttp.test_utils import TestServer

import lipstream_client as lc
from lipstream_client.flow import SendWindow
from lipstream_client.pcm import split_pcm, to_pcm_bytes
from lipstream_client.queues import DropOldestQueue
from lipstream_client.sse import SseMessage, SseParser
from streaming.webrtc.compat import negotiated_codecs
from tests.live_calls import until
from tests.media import resample_linear, speech_with_pauses
from tests.server_process import Server, lipstream_serve

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 60.0
SECRET = "client-test-secret-of-32-bytes!!"

# -- without a server ------------------------------------------------------------------


class HandClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_send_window_waits_for_reports_then_for_play_out() -> None:
    clock = HandClock()
    window = SendWindow(2000.0, clock)
    assert window.wait_s(1000.0) == 0.0  # an empty queue takes a piece
    window.on_sent(1000.0)
    window.on_sent(1000.0)
    assert window.estimate_ms() == 2000.0
    # Nothing plays before the call speaks: only a report can open the window.
    assert window.wait_s(500.0) is None
    clock.now += 10.0
    assert window.wait_s(500.0) is None
    window.on_report(1500.0)
    assert window.wait_s(500.0) == 0.0
    assert window.wait_s(1000.0) is None
    # Once speaking, the queue plays down at real time from the later of the two.
    window.on_playing()
    assert window.wait_s(1000.0) == 0.5
    clock.now += 0.5
    assert window.wait_s(1000.0) == 0.0
    window.on_sent(1000.0)
    assert window.estimate_ms() == 2000.0
    clock.now += 5.0
    assert window.estimate_ms() == 0.0


def test_sse_parser_reads_events_and_skips_comments() -> None:
    parser = SseParser()
    lines = [": lipstream events", "", "id: 3", "event: queued_ms", 'data: {"a":', "data: 1}", ""]
    assert [parser.feed(line + "\n") for line in lines] == [None] * 6 + [
        SseMessage("queued_ms", '{"a":\n1}', "3")
    ]
    assert parser.feed("data:x\r\n") is None
    assert parser.feed("\r\n") == SseMessage("message", "x", "3")


async def test_drop_oldest_queue_keeps_the_newest_and_counts_the_rest() -> None:
    queue: DropOldestQueue[int] = DropOldestQueue(3)
    for item in range(10):
        queue.put(item)
    queue.close()
    queue.put(99)  # ignored once closed
    assert [item async for item in queue] == [7, 8, 9]
    assert (queue.put_count, queue.dropped) == (10, 7)


def test_pcm_conversions() -> None:
    floats = np.array([0.0, 0.5, -1.0, 2.0], dtype=np.float32)
    assert np.frombuffer(to_pcm_bytes(floats, "s16le"), "<i2").tolist() == [
        0,
        16384,
        -32767,
        32767,
    ]
    assert np.frombuffer(to_pcm_bytes(floats, "f32le"), "<f4").tolist() == floats.tolist()
    ints = np.array([0, -32768, 16384], dtype=np.int16)
    assert np.frombuffer(to_pcm_bytes(ints, "f32le"), "<f4").tolist() == [0.0, -1.0, 0.5]
    assert [len(p) for p in split_pcm(bytes(10), 2, 2)] == [4, 4, 2]
    with pytest.raises(ValueError, match="whole number"):
        split_pcm(bytes(3), 2, 100)
    with pytest.raises(ValueError, match="mono"):
        to_pcm_bytes(np.zeros((2, 10), np.float32), "s16le")


def _server_error_codes() -> set[str]:
    """Every error code the server can answer: its mapping table, the codes its OpenAPI
    document describes, each ``RequestError``/``json_error`` in ``web/``, and the
    codes of docs/apps.md."""
    from web.errors import _MAPPING
    from web.openapi import _CODES

    codes = {code for _, _, code, _ in _MAPPING} | set(_CODES)
    literal = re.compile(r"(?:RequestError|json_error)\(\s*[^,()]+,\s*\"([a-z0-9_]+)\"")
    for path in (REPO / "web").rglob("*.py"):
        codes |= set(literal.findall(path.read_text(encoding="utf-8")))
    apps = (REPO / "docs" / "apps.md").read_text(encoding="utf-8")
    codes |= set(re.findall(r"\b\d{3} `([a-z_]+)`", apps))  # 409 `stream_busy`
    errors_table = apps[apps.index("| code | cause |") :]
    codes |= set(re.findall(r"^\| `([a-z_]+)` \|", errors_table, re.M))
    codes |= set(re.findall(r"`(events_overflow)`", apps))
    return codes


def test_every_server_error_code_maps_to_a_specific_class() -> None:
    codes = _server_error_codes()
    assert {"bad_stream_format", "stream_busy", "bad_frame", "bad_message"} <= codes
    assert {"audio_queue_full", "events_overflow", "session_not_found"} <= codes
    missing = sorted(code for code in codes if code not in lc.ERRORS_BY_CODE)
    assert not missing, f"server error codes the client does not name: {missing}"
    generic = sorted(c for c in codes if lc.ERRORS_BY_CODE[c] is lc.LipstreamError)
    assert not generic
    assert lc.ERRORS_BY_CODE["session_not_found"] is lc.SessionNotFound
    assert lc.ERRORS_BY_CODE["too_many_sessions"] is lc.TooManySessions
    assert issubclass(lc.TooManySessions, lc.Overloaded)
    assert lc.ERRORS_BY_CODE["stream_busy"] is lc.StreamBusy
    assert lc.ERRORS_BY_CODE["bad_stream_format"] is lc.BadStreamFormat
    assert lc.ERRORS_BY_CODE["audio_queue_full"] is lc.AudioQueueFull
    assert lc.ERRORS_BY_CODE["tts_unavailable"] is lc.TtsUnavailable


def test_error_bodies_become_typed_errors() -> None:
    from lipstream_client.errors import error_from_body, error_from_message

    body = b'{"error": {"code": "too_many_sessions", "message": "full"}}'
    error = error_from_body(503, body, {"Retry-After": "5"})
    assert isinstance(error, lc.TooManySessions)
    assert (error.status, error.code, error.message, error.retry_after) == (
        503,
        "too_many_sessions",
        "full",
        5.0,
    )
    proxy = error_from_body(502, b"<html>Bad Gateway</html>", {})
    assert isinstance(proxy, lc.ServerError)
    assert proxy.code == "http_502"
    newer = error_from_body(409, b'{"error": {"code": "something_new", "message": "m"}}', {})
    assert type(newer) is lc.Conflict
    frame = error_from_message({"type": "error", "code": "bad_frame", "message": "odd"})
    assert isinstance(frame, lc.BadFrame)
    assert frame.status is None


async def test_the_token_goes_in_every_request_and_the_stream_upgrade() -> None:
    seen: list[str | None] = []

    async def avatars(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"avatars": [{"id": "demo", "name": "Demo"}]})

    async def stream(request: web.Request) -> web.WebSocketResponse:
        seen.append(request.headers.get("Authorization"))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"type": "ready", "session_id": "s", "max_buffer_ms": 1000})
        async for message in ws:
            if message.type == WSMsgType.BINARY:
                await ws.send_json({"type": "error", "code": "bad_frame", "message": "no"})
        return ws

    app = web.Application()
    app.router.add_get("/avatars", avatars)
    app.router.add_get("/sessions/{id}/audio/stream", stream)
    async with TestServer(app) as server, lc.Client(str(server.make_url("")), token="t0k") as c:
        assert await c.avatars() == [lc.Avatar("demo", "Demo")]
        async with c.stream_audio("s") as audio:
            assert audio.max_ahead_ms == 500.0  # half the server's buffer
            await audio.send(np.zeros(160, np.int16))
            event = await anext(e async for e in audio.events() if e["type"] == "error")
            assert event["code"] == "bad_frame"
            with pytest.raises(lc.BadFrame):
                await audio.end()
            await audio.end()  # raised once
    assert seen == ["Bearer t0k", "Bearer t0k"]


# -- against ``lipstream serve`` ---------------------------------------------------------


@asynccontextmanager
async def serve(
    tmp_path: Path, sections: Mapping[str, Mapping[str, object]] | None = None
) -> AsyncIterator[Server]:
    """``lipstream serve`` with ICE on loopback, plus YAML ``sections`` besides ``server``.

    :func:`lipstream_serve` writes only the ``server`` section, one ``key: value`` line
    each; the other sections ride on the last value's line ends.
    """
    extra = "".join(
        f"\n{name}:" + "".join(f"\n  {k}: {v}" for k, v in values.items())
        for name, values in (sections or {}).items()
    )
    async with lipstream_serve(tmp_path, server={"ice_loopback_only": f"true{extra}"}) as s:
        yield s


def base_url(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}"


async def next_event(events: AsyncIterator[lc.Event], kind: str) -> lc.Event:
    """The next event of type ``kind`` (others before it are passed over)."""
    async with asyncio.timeout(TIMEOUT_S):
        async for event in events:
            if event["type"] == kind:
                return event
    pytest.fail(f"the events ended before a {kind!r}")


async def test_a_call_receives_720p_h264_and_speech_events(tmp_path: Path, loopback: None) -> None:
    async with serve(tmp_path) as server:
        async with await lc.connect(base_url(server), "demo") as call:
            assert call.connection_state == "connected"
            assert call.delay is not None
            assert call.delay.server_ms > 0
            video = [t for t in call.pc.getTransceivers() if t.kind == "video"]
            assert negotiated_codecs(video[0])[0].mimeType == "video/H264"
            frames: list[lc.VideoFrame] = []
            async with asyncio.timeout(TIMEOUT_S):
                async for frame in call.video_frames():
                    frames.append(frame)
                    if len(frames) == 25:
                        break
            assert {(f.frame.width, f.frame.height) for f in frames} == {(1280, 720)}
            indices = [f.index for f in frames]
            assert indices[0] == 0
            assert indices == sorted(indices)
            assert frames[-1].media_ms == pytest.approx(indices[-1] * 40, abs=1)

            queued = await call.say("Hello from the Python client.")
            assert queued.utterance == 1
            assert queued.duration_ms > 500
            events = call.events()
            started = await next_event(events, "speech_started")
            assert (started["utterance"], started["source"]) == (1, "say")
            ended = await next_event(events, "speech_ended")
            assert ended["utterance"] == 1
            assert ended["duration_ms"] == pytest.approx(queued.duration_ms, abs=40)
            # The frame that starts the speech is one this call received.
            first_spoken = round(started["media_ms"] / 40)
            await until(lambda: call.stats.video_frames > first_spoken, "the spoken frames")
            assert call.stats.audio_frames > 0
            state = await call.state()
            assert state["state"] == "streaming"
        # ``async with`` hung up: the session is gone, and hanging up again is harmless.
        async with lc.Client(base_url(server)) as client:
            with pytest.raises(lc.SessionNotFound):
                await client.state(call.session_id)
        await call.hang_up()
        assert call.connection_state == "closed"


async def test_session_control_server_sent_events_and_errors(
    tmp_path: Path, loopback: None
) -> None:
    async with serve(tmp_path) as server:
        url = base_url(server)
        with pytest.raises(lc.NotFound) as unknown:
            await lc.connect(url, "nobody")
        assert unknown.value.code == "model_not_found"
        call = await lc.connect(url, "demo", receive_audio=False, data_channel=False)
        async with call, call.client.events(call.session_id) as events:
            with pytest.raises(RuntimeError, match="no data channel"):
                call.events()
            second = np.sin(np.arange(24_000) / 24_000 * 2 * math.pi * 220).astype(np.float32)
            pushed = await call.push_pcm(second * 0.5, 24_000)
            assert pushed.duration_ms == pytest.approx(1000, abs=1)
            as_int16 = await call.push_pcm((second * 16_000).astype(np.int16), 24_000)
            assert as_int16.queued_ms > pushed.queued_ms
            assert as_int16.utterance == pushed.utterance + 1  # type: ignore[operator]
            started = await next_event(events, "speech_started")
            assert (started["utterance"], started["source"]) == (pushed.utterance, "push")
            dropped_ms = await call.interrupt()
            assert dropped_ms > 0
            interrupted = await next_event(events, "interrupted")
            assert interrupted["dropped_ms"] == pytest.approx(dropped_ms, abs=1)

            with pytest.raises(lc.BadAudio):
                await call.push_audio(b"not audio at all", "audio/wav")
            with pytest.raises(lc.BadRequest) as empty:
                await call.say("")
            assert empty.value.code == "bad_text"
            with pytest.raises(lc.SessionNotFound):
                await call.client.state("no-such-session")
            assert call.stats.audio_frames == 0
            await call.hang_up()
            ended = await next_event(events, "session_ended")
            assert ended["session_id"] == call.session_id
            assert [e async for e in events] == []  # the stream ended after it


async def test_frames_nobody_reads_are_dropped_oldest_first(tmp_path: Path, loopback: None) -> None:
    async with serve(tmp_path) as server:
        queues = lc.QueueSizes(video=4, audio=3)
        async with await lc.connect(base_url(server), "demo", queues=queues) as call:
            await until(lambda: call.stats.video_frames >= 20, "20 video frames")
            stats = call.stats
            assert stats.video_dropped >= stats.video_frames - 4 - 1  # one may be arriving
            assert len(call.video_frames()) <= 4
            assert len(call.audio_frames()) <= 3
            latest = stats.video_frames - 1
            oldest_kept = (await anext(call.video_frames())).index
            assert oldest_kept >= latest - 5


async def test_audio_stream_paces_a_fast_source_below_the_server_bound(
    tmp_path: Path, loopback: None
) -> None:
    """Seconds of speech sent at once: 2 s of server buffer would refuse most of it
    without pacing."""
    phrases = ("hello there", "how are you today", "the avatar speaks as the audio arrives")
    speech, _spans = speech_with_pauses(tmp_path, phrases, pause_s=0.5)
    speech_24k = resample_linear(speech, 16_000, 24_000)
    duration_ms = len(speech_24k) / 24
    assert duration_ms > 5000
    sections = {"session": {"max_stream_buffer_s": 2.0}}
    async with (
        serve(tmp_path, sections) as server,
        await lc.connect(base_url(server), "demo") as call,
    ):
        # Without pacing the server refuses what goes past its buffer.
        async with server.http.ws_connect(
            f"/sessions/{call.session_id}/audio/stream?format=s16le&rate=24000"
        ) as raw:
            assert (await raw.receive_json())["max_buffer_ms"] == 2000
            pcm = to_pcm_bytes(speech_24k, "s16le")
            for piece in split_pcm(pcm, 2, 24_000):
                await raw.send_bytes(piece)
            refused = await next_raw_error(raw)
            assert refused["code"] == "audio_queue_full"
        await call.interrupt()

        async with call.stream_audio(rate=24_000) as stream:
            assert stream.max_ahead_ms == 1000.0
            await stream.send(speech_24k)
            await stream.end()
            seen: list[lc.Event] = []
            async with asyncio.timeout(TIMEOUT_S):
                async for event in stream.events():
                    seen.append(event)
                    if event["type"] == "speech_ended" and event["utterance"] == mine(seen):
                        break
        kinds = [e["type"] for e in seen]
        assert kinds[0] == "ready"
        assert "speech_started" in kinds, kinds
        assert "error" not in kinds, seen
        peak = max(e["queued_ms"] for e in seen if e["type"] == "queued_ms")
        assert peak <= 2000, peak
        assert seen[-1]["duration_ms"] == pytest.approx(duration_ms, abs=60)


def mine(seen: list[lc.Event]) -> int:
    """The utterance a stream's audio went into: its first ``queued_ms`` names it."""
    return int(next(e["utterance"] for e in seen if e["type"] == "queued_ms"))


async def next_raw_error(ws: ClientWebSocketResponse) -> lc.Event:
    async with asyncio.timeout(TIMEOUT_S):
        async for message in ws:
            event: lc.Event = message.json()
            if event["type"] == "error":
                return event
    pytest.fail("no error message")


async def test_audio_stream_refusals_and_errors(tmp_path: Path, loopback: None) -> None:
    async with serve(tmp_path) as server:
        url = base_url(server)
        async with await lc.connect(url, "demo", receive_audio=False) as call:
            with pytest.raises(lc.SessionNotFound):
                await call.client.stream_audio("no-such-session").open()
            with pytest.raises(ValueError, match="rate"):
                call.stream_audio(rate=8000)
            async with call.stream_audio(format="f32le", rate=16_000) as stream:
                with pytest.raises(lc.StreamBusy) as busy:
                    await call.stream_audio().open()
                assert busy.value.status == 409
                await stream.send(np.array([0.0, math.nan], np.float32))
                error = await next_event(stream.events(), "error")
                assert error["code"] == "bad_frame"
                with pytest.raises(lc.BadFrame):
                    await stream.end()
                await stream.send(np.zeros(1600, np.float32))  # the stream goes on
                await stream.end()
                await call.hang_up()
                await next_event(stream.events(), "session_ended")
                await until(lambda: stream.closed, "the stream to close")
                with pytest.raises(lc.StreamClosed):
                    await stream.send(np.zeros(160, np.float32))


async def test_tokens_are_sent_to_a_server_that_requires_them(
    tmp_path: Path, loopback: None
) -> None:
    sections = {"auth": {"jwt_secret": SECRET}}
    async with serve(tmp_path, sections) as server:
        url = base_url(server)
        with pytest.raises(lc.Unauthorized):
            await lc.connect(url, "demo")
        now = int(time.time())
        token = jwt.encode({"avatar": "demo", "iat": now, "exp": now + 600}, SECRET, "HS256")
        async with await lc.connect(url, "demo", token=token, receive_audio=False) as call:
            async with call.stream_audio() as stream:
                assert stream.ready["session_id"] == call.session_id
            assert (await call.state())["avatar"] == "demo"
            async with lc.Client(url) as no_token:
                with pytest.raises(lc.Unauthorized):
                    await no_token.state(call.session_id)
