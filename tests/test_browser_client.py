"""``web/static/lipstream.js``, the browser client, imported by a page of another origin.

A tiny aiohttp app serves a blank page on its own port; the real lipstream server lists
that origin in ``server.cors_origins``, and headless Debian Chromium (Playwright, as in
``tests/test_demo_page.py``) imports ``/static/lipstream.js`` from the server into the page
and drives calls with it: speech events over the WebRTC data channel, an interrupt sent on
it, PCM streamed over the WebSocket, and the server's errors as ``LipstreamError``. Each
step waits on what the page has received, with a generous timeout; nothing is timed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from config.settings import Settings
from tests.browser_page import browser_page
from tests.live_calls import until
from tests.media import require_espeak
from web.app import build_app
from web.app_keys import SESSIONS, SETTINGS
from web.session_tokens import mint_token

if TYPE_CHECKING:
    from playwright.async_api import Page

pytestmark = pytest.mark.slow

JWT_SECRET = "browser-client-test-secret-0123456789"

# The page's own script: the module, imported across origins, and what the tests read.
IMPORT_CLIENT = """async (base) => {
  window.lipstream = await import(`${base}/static/lipstream.js`);
  return Object.keys(window.lipstream).sort();
}"""
# Connect; keep the call and every server event it dispatches as window.call / window.events.
CONNECT = """async ({base, token}) => {
  const call = await window.lipstream.connect({ baseUrl: base, avatar: "demo", token });
  window.call = call;
  window.events = [];
  window.ended = null;
  call.addEventListener("event", (e) => window.events.push(e.detail));
  call.addEventListener("ended", (e) => {
    window.ended = e.detail.reason;
    window.endedError = e.detail.error?.message ?? null;
  });
  return call.sessionId;
}"""

# Open a stream that the server refuses; what the client rejects with.
STREAM_REFUSAL = """(options) => window.call.streamAudio(options).then(
  () => null,
  (err) => ({ lipstream: err instanceof window.lipstream.LipstreamError,
              status: err.status, code: err.code }))"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir per module, so the demo avatar is generated once."""
    return tmp_path_factory.mktemp("lipstream_data")


@pytest.fixture
async def app_origin() -> AsyncIterator[str]:
    """Another origin (its own port): a blank page, as an app's own site would serve."""

    async def blank(request: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>an app</title>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/", blank)
    async with TestServer(app, host="127.0.0.1") as page_server:
        yield str(page_server.make_url("/")).rstrip("/")


@pytest.fixture
async def server(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    data_dir: Path,
    app_origin: str,
    loopback: None,
) -> AsyncIterator[TestServer]:
    """The real application serving the demo avatar, allowing ``app_origin`` by CORS.

    Indirect parametrisation adds settings sections, e.g. ``{"auth": {...}}``.
    """
    extra: dict[str, Any] = getattr(request, "param", {})
    settings = Settings.model_validate(
        {
            "server": {"cors_origins": [app_origin]},
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(data_dir)},
            "devices": {"kind": "cpu"},
            **extra,
        }
    )
    test_server = TestServer(build_app(settings), host="127.0.0.1")
    async with test_server:
        yield test_server


@pytest.fixture
async def page(tmp_path: Path, app_origin: str) -> AsyncIterator[Page]:
    """The app's page in a fresh headless Chromium; fails the test on any uncaught JS error."""
    async with browser_page(tmp_path, f"{app_origin}/") as opened:
        yield opened


def _base(server: TestServer) -> str:
    return str(server.make_url("/")).rstrip("/")


def _live_sessions(server: TestServer) -> int:
    assert server.app is not None
    return len(server.app[SESSIONS].sessions)


async def _events(page: Page, kind: str | None = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = await page.evaluate("() => window.events")
    return [e for e in events if kind is None or e["type"] == kind]


async def _connect(page: Page, server: TestServer, token: str | None = None) -> str:
    exported = await page.evaluate(IMPORT_CLIENT, _base(server))
    assert {"connect", "listAvatars", "webrtcConfig", "LipstreamError"} <= set(exported)
    session_id: str = await page.evaluate(CONNECT, {"base": _base(server), "token": token})
    return session_id


async def _hang_up(page: Page, server: TestServer) -> None:
    await page.evaluate("() => window.call.hangUp()")
    assert await page.evaluate("() => window.ended") == "hung up"
    assert _live_sessions(server) == 0


async def test_the_offer_asks_for_the_avatars_silence_as_opus_dtx(
    server: TestServer, page: Page
) -> None:
    """``connect`` sends its offer through ``withOpusDtx`` (``docs/design/webrtc.md`` §6)."""
    await page.evaluate(IMPORT_CLIENT, _base(server))
    head = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n"
    tail = "m=video 9 UDP/TLS/RTP/SAVPF 96\r\na=fmtp:96 x=1\r\n"
    offers = [
        head + "a=fmtp:111 minptime=10;useinbandfec=1\r\n" + tail,  # as Chromium offers
        head + tail,
        head + "a=fmtp:111 usedtx=0\r\n" + tail,
    ]
    munged = await page.evaluate(
        """([chromium, bare, declined]) => {
          const dtx = window.lipstream.withOpusDtx;
          return [dtx(chromium), dtx(dtx(chromium)), dtx(bare), dtx(declined)];
        }""",
        offers,
    )
    chromium, twice, bare, declined = munged
    assert "a=fmtp:111 minptime=10;useinbandfec=1;usedtx=1\r\n" in chromium
    assert twice == chromium
    assert "a=rtpmap:111 opus/48000/2\r\na=fmtp:111 usedtx=1\r\n" in bare
    assert "a=fmtp:96 x=1\r\n" in bare  # the video section is left alone
    assert "usedtx=1" not in declined  # an app's own word stays


async def test_say_and_interrupt_send_speech_events_over_the_data_channel(
    server: TestServer, page: Page
) -> None:
    require_espeak()  # the server's text-to-speech engine
    session_id = await _connect(page, server)
    assert await page.evaluate("() => window.call.dataChannel.label") == "lipstream"
    await page.wait_for_function("async () => (await window.call.stats()).framesDecoded > 0")

    said = await page.evaluate("() => window.call.say('Hello, I am the demo avatar.')")
    utterance = said["utterance"]
    await page.wait_for_function(
        f"() => window.events.some(e => e.type === 'speech_ended' && e.utterance === {utterance})"
    )
    events = await _events(page)
    assert all(e["session_id"] == session_id for e in events)
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs)), events  # in order, none twice
    spoken = [e for e in events if e.get("utterance") == utterance]
    kinds = [e["type"] for e in spoken if e["type"] != "queued_ms"]
    assert kinds == ["speech_started", "speech_ended"], spoken
    started, ended = (e for e in spoken if e["type"] != "queued_ms")
    assert started["source"] == ended["source"] == "say"
    assert ended["media_ms"] > started["media_ms"]
    assert any(e["type"] == "queued_ms" and e["utterance"] == utterance for e in events)

    # The 9 s sample, cut short by an interrupt sent on the data channel.
    pushed = await page.evaluate(
        """async (base) => {
          const wav = await fetch(`${base}/static/sample.wav`);
          return window.call.pushAudio(await wav.blob(), "audio/wav");
        }""",
        _base(server),
    )
    cut = pushed["utterance"]
    await page.wait_for_function(
        f"() => window.events.some(e => e.type === 'speech_started' && e.utterance === {cut})"
    )
    sent = await page.evaluate("() => window.call.interrupt()")
    assert sent == {"via": "datachannel"}
    await page.wait_for_function("() => window.events.some(e => e.type === 'interrupted')")
    (interrupted,) = await _events(page, "interrupted")
    assert cut in interrupted["utterances"]
    assert interrupted["dropped_ms"] > 0
    state = await page.evaluate("() => window.call.state()")
    assert state["queued_audio_s"] == 0

    await _hang_up(page, server)


@pytest.mark.parametrize("server", [{"auth": {"jwt_secret": JWT_SECRET}}], indirect=True)
async def test_stream_audio_sends_pcm_chunks_over_the_websocket(
    server: TestServer, page: Page
) -> None:
    assert server.app is not None
    token = mint_token(server.app[SETTINGS].auth, "demo", ttl_s=600)
    await _connect(page, server, token)
    # The handshake's answer is hidden from a page: the client asks the server why.
    bad_format = await page.evaluate(STREAM_REFUSAL, {"format": "s24le", "rate": 16000})
    assert bad_format == {"lipstream": True, "status": 400, "code": "bad_stream_format"}

    ready = await page.evaluate(
        """async () => {
          const stream = await window.call.streamAudio({ format: "s16le", rate: 24000 });
          window.stream = stream;
          window.streamMessages = [];
          stream.addEventListener("message", (e) => window.streamMessages.push(e.detail));
          return stream.ready;
        }"""
    )
    assert (ready["type"], ready["format"], ready["rate"]) == ("ready", "s16le", 24000)
    # A second stream into the session is refused, and the client learns why (the server
    # answers stream_busy over plain HTTP too).
    busy = await page.evaluate(STREAM_REFUSAL, {"format": "f32le", "rate": 16000})
    assert busy == {"lipstream": True, "status": 409, "code": "stream_busy"}

    # A 220 Hz tone with a syllable-like envelope, 2 s as Float32Array chunks of 100 ms
    # (converted to s16le by the client), then an odd byte count the server refuses.
    await page.evaluate(
        """() => {
          const rate = 24000, chunk = rate / 10;
          for (let c = 0; c < 20; c++) {
            const samples = new Float32Array(chunk);
            for (let i = 0; i < chunk; i++) {
              const t = (c * chunk + i) / rate;
              const envelope = Math.abs(Math.sin(Math.PI * 4 * t));
              samples[i] = 0.5 * envelope * Math.sin(2 * Math.PI * 220 * t);
            }
            window.stream.send(samples);
          }
          window.stream.send(new Uint8Array([1, 2, 3]).buffer);
        }"""
    )
    await page.wait_for_function(
        "() => window.streamMessages.some(m => m.type === 'error')"
        " && window.events.some(e => e.type === 'speech_started')"
    )
    errors = [m for m in await page.evaluate("() => window.streamMessages") if m["type"] == "error"]
    assert [e["code"] for e in errors] == ["bad_frame"], errors
    assert await page.evaluate("() => window.stream.open")  # a refused message leaves it open
    (started,) = await _events(page, "speech_started")
    assert started["source"] == "stream"
    queued = [e for e in await _events(page, "queued_ms") if e["utterance"] == started["utterance"]]
    assert queued
    assert all(e["queued_ms"] >= 0 for e in queued)
    assert await page.evaluate("() => window.stream.queuedMs") is not None

    await page.evaluate("() => window.stream.end()")
    await page.wait_for_function("() => window.events.some(e => e.type === 'speech_ended')")
    (ended,) = await _events(page, "speech_ended")
    assert (ended["utterance"], ended["source"]) == (started["utterance"], "stream")
    assert ended["duration_ms"] == pytest.approx(2000, abs=40)  # what was sent, at 16 kHz

    # The server ends the session: session_ended reaches the page, the call ends itself.
    assert server.app is not None
    (session,) = server.app[SESSIONS].sessions
    await session.close("ended by the test")
    await page.wait_for_function("() => window.ended !== null && !window.stream.open")
    assert await page.evaluate("() => window.endedError") is None  # not a failure
    # session_ended goes to every channel at once: the data channel's ends the call with
    # its reason (the server flushes it before closing the connection), and the call
    # closes its stream, maybe before the stream's own copy was read.
    (ended,) = await _events(page, "session_ended")
    assert ended["reason"] == "ended by the test"
    assert await page.evaluate("() => window.ended") == "ended by the test"
    messages = await page.evaluate("() => window.streamMessages")
    on_stream = [m for m in messages if m["type"] == "session_ended"]
    assert on_stream in ([], [ended]), on_stream
    assert await page.evaluate("() => window.call.closed")


async def test_server_errors_reject_with_lipstream_error(server: TestServer, page: Page) -> None:
    await page.evaluate(IMPORT_CLIENT, _base(server))
    avatars = await page.evaluate("(base) => window.lipstream.listAvatars(base)", _base(server))
    assert "demo" in [a["id"] for a in avatars]
    config = await page.evaluate("(base) => window.lipstream.webrtcConfig(base)", _base(server))
    assert config["iceServers"] == []
    assert config["delay"]["server_ms"] > 0

    error = await page.evaluate(
        """(base) => window.lipstream.connect({ baseUrl: base, avatar: "no-such-avatar" }).then(
          () => null,
          (err) => ({ lipstream: err instanceof window.lipstream.LipstreamError, name: err.name,
                      status: err.status, code: err.code, message: err.message }))""",
        _base(server),
    )
    assert error is not None
    assert error["lipstream"]
    assert error["name"] == "LipstreamError"
    assert (error["status"], error["code"]) == (404, "model_not_found")
    assert "no-such-avatar" in error["message"]
    await until(lambda: _live_sessions(server) == 0, "no session left behind")


async def test_leaving_the_page_hangs_up(server: TestServer, page: Page, app_origin: str) -> None:
    await _connect(page, server)
    assert server.app is not None
    (session,) = server.app[SESSIONS].sessions
    await page.goto(f"{app_origin}/?next")  # pagehide: a keepalive DELETE, across origins
    await until(lambda: session.end_reason is not None, "the session to end")
    # The keepalive DELETE (preflighted: two round trips) races the browser closing the
    # peer connection as the page goes; either way the session ends at once.
    assert session.end_reason in ("hung up by API", "connection closed")
    assert _live_sessions(server) == 0
