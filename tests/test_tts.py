"""Text-to-speech engines: real espeak-ng, an in-process HTTP TTS server, engine choice."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import test_utils, web

from config.settings import TtsSettings
from inference_core.exceptions import InferenceError
from streaming.audio_in.exceptions import (
    AudioInputError,
    TtsError,
    TtsInputError,
    TtsUnavailableError,
)
from streaming.audio_in.tts import (
    EspeakEngine,
    HttpTtsEngine,
    NoTtsEngine,
    TtsEngine,
    build_tts_engine,
    check_text,
    check_voice,
)
from streaming.audio_rates import OUT_RATE
from tests.media import require_espeak, write_wav

RATE = OUT_RATE  # what every engine returns: the mixer's rate


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))


def stand_in(tmp_path: Path, body: str) -> str:
    """An executable shell script that plays espeak-ng's part."""
    script = tmp_path / "fake-espeak"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def espeak() -> EspeakEngine:
    return EspeakEngine(require_espeak(), "en", timeout_s=30.0)


# --- text and voice checks ---------------------------------------------------------


def test_check_text_strips_control_characters() -> None:
    assert check_text("  hello\nthere\x1b[31m\x00 ", 100) == "hello there [31m"
    assert check_text("caf\u00e9 \ud800ok \U0001f600", 100) == "caf\u00e9  ok \U0001f600"


@pytest.mark.parametrize("text", ["", "   ", "\n\t\r", "\x00\x07"])
def test_check_text_refuses_empty(text: str) -> None:
    with pytest.raises(TtsInputError, match="empty"):
        check_text(text, 100)


def test_check_text_refuses_too_long_naming_the_limit() -> None:
    assert check_text("a" * 20, 20) == "a" * 20
    with pytest.raises(TtsInputError, match="21 characters; at most 20"):
        check_text("a" * 21, 20)


@pytest.mark.parametrize("voice", ["en", "en-us", "en+f3", "en_GB", "cmn"])
def test_good_voice_names(voice: str) -> None:
    assert check_voice(voice) == voice


@pytest.mark.parametrize("voice", ["", "-x", "--help", "en us", "en;rm -rf /", "../en", "a" * 33])
def test_bad_voice_names(voice: str) -> None:
    with pytest.raises(TtsInputError, match="not valid"):
        check_voice(voice)


def test_tts_errors_have_their_own_root() -> None:
    # A TTS failure is neither an inference error nor bad input audio: web/errors.py
    # answers 502/503/400 for it, never "inference_failed".
    assert not issubclass(TtsError, (InferenceError, AudioInputError))
    assert issubclass(TtsUnavailableError, TtsError)
    assert issubclass(TtsInputError, TtsError)


# --- espeak-ng ---------------------------------------------------------------------


async def test_espeak_speaks(espeak: EspeakEngine) -> None:
    pcm = await espeak.synthesize("Hello there, this is a test of the speech engine.")
    assert pcm.dtype == np.float32
    assert pcm.ndim == 1
    assert np.abs(pcm).max() <= 1.0
    assert rms(pcm) > 0.02
    # About ten words at espeak's 175 words per minute: a few seconds, not a blip.
    assert 1.5 < len(pcm) / RATE < 8.0


async def test_espeak_longer_text_gives_longer_speech(espeak: EspeakEngine) -> None:
    short = await espeak.synthesize("Hello.")
    long = await espeak.synthesize("Hello. " * 6)
    assert len(long) > 3 * len(short)


@pytest.mark.parametrize("text", ["--help", "-v xx hello there", "-w {out} hello"])
async def test_espeak_speaks_text_that_looks_like_options(
    espeak: EspeakEngine, tmp_path: Path, text: str
) -> None:
    # Parsed as options, "--help" would print usage instead of a WAV, "-v xx" would fail
    # on an unknown voice and "-w" would write a file; spoken, each is sound.
    out = tmp_path / "x.wav"
    pcm = await espeak.synthesize(text.format(out=out))
    assert rms(pcm) > 0.02
    assert len(pcm) / RATE > 0.5
    assert not out.exists()


async def test_espeak_voice_per_call(espeak: EspeakEngine) -> None:
    pcm = await espeak.synthesize("bonjour tout le monde", voice="fr")
    assert rms(pcm) > 0.02


async def test_espeak_refuses_bad_voice_names() -> None:
    with pytest.raises(TtsInputError, match="not valid"):
        EspeakEngine(require_espeak(), "-w/tmp/x", timeout_s=5.0)
    engine = EspeakEngine(require_espeak(), "en", timeout_s=5.0)
    with pytest.raises(TtsInputError, match="not valid"):
        await engine.synthesize("hello", voice="en; ls")


async def test_espeak_unknown_voice_is_an_input_error(espeak: EspeakEngine) -> None:
    with pytest.raises(TtsInputError, match="has no voice 'nosuchvoice'") as info:
        await espeak.synthesize("hello", voice="nosuchvoice")
    assert "exit code 1" in str(info.value)


async def test_espeak_nonzero_exit_reports_first_stderr_line(tmp_path: Path) -> None:
    exe = stand_in(tmp_path, 'echo "boom: out of cheese" >&2\necho "second line" >&2\nexit 3')
    engine = EspeakEngine(exe, "en", timeout_s=10.0)
    with pytest.raises(TtsError, match=r"exit code 3: boom: out of cheese$"):
        await engine.synthesize("hello")


async def test_espeak_garbage_output_is_a_tts_error(tmp_path: Path) -> None:
    engine = EspeakEngine(stand_in(tmp_path, "echo 'not a wav file at all'"), "en", 10.0)
    with pytest.raises(TtsError, match="cannot be decoded"):
        await engine.synthesize("hello")


async def test_espeak_timeout_kills_and_reaps_the_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    exe = stand_in(tmp_path, f'echo $$ > "{pid_file}"\nexec sleep 60')
    engine = EspeakEngine(exe, "en", timeout_s=0.5)
    with pytest.raises(TtsError, match=r"longer than 0\.5 s and was stopped"):
        await engine.synthesize("hello")
    pid = int(pid_file.read_text())
    # Killed and waited for: the pid no longer names any process, not even a zombie.
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_espeak_cancelled_call_kills_the_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    exe = stand_in(tmp_path, f'echo $$ > "{pid_file}"\nexec sleep 60')
    engine = EspeakEngine(exe, "en", timeout_s=30.0)
    task = asyncio.create_task(engine.synthesize("hello"))
    # The child writes its pid when it runs; poll for it (a child cannot set an Event).
    for _ in range(3000):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


async def test_espeak_missing_executable_is_unavailable(tmp_path: Path) -> None:
    engine = EspeakEngine(str(tmp_path / "no-such-espeak"), "en", timeout_s=5.0)
    with pytest.raises(TtsUnavailableError, match="apt-get install espeak-ng"):
        await engine.synthesize("hello")


# --- HTTP engine -------------------------------------------------------------------


class FakeTtsServer:
    """An in-process TTS server: answers with what the test sets, records requests."""

    def __init__(self, wav: bytes) -> None:
        self.status = 200
        self.body = wav
        self.content_type: str | None = "audio/wav"
        self.hang = False
        self.requests: list[object] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        if self.hang:
            await asyncio.Event().wait()
        resp = web.Response(status=self.status, body=self.body)
        if self.content_type is not None:
            resp.content_type = self.content_type
        else:
            resp.headers["Content-Type"] = "application/octet-stream"
        return resp


@pytest.fixture
async def tts_server(tmp_path: Path) -> AsyncIterator[tuple[FakeTtsServer, str]]:
    t = np.arange(22_050) / 22_050
    wav = write_wav(tmp_path / "say.wav", 0.5 * np.sin(2 * np.pi * 440 * t), 22_050)
    fake = FakeTtsServer(wav.read_bytes())
    app = web.Application()
    app.router.add_post("/tts", fake.handle)
    server = test_utils.TestServer(app)
    await server.start_server()
    try:
        yield fake, str(server.make_url("/tts"))
    finally:
        await server.close()


async def test_http_engine_decodes_the_answer(tts_server: tuple[FakeTtsServer, str]) -> None:
    fake, url = tts_server
    engine = HttpTtsEngine(url, timeout_s=10.0, default_voice="alice")
    try:
        pcm = await engine.synthesize("Hello there")
        again = await engine.synthesize("-v bob", voice="bob")
    finally:
        await engine.close()
    assert pcm.dtype == np.float32
    assert abs(len(pcm) / RATE - 1.0) <= 0.02
    assert rms(pcm) > 0.3
    assert len(again) == len(pcm)
    assert fake.requests == [
        {"text": "Hello there", "voice": "alice"},
        {"text": "-v bob", "voice": "bob"},
    ]


async def test_http_engine_keeps_the_full_band_of_its_answer(
    tts_server: tuple[FakeTtsServer, str], tmp_path: Path
) -> None:
    """A TTS server's 24 kHz voice reaches the mixer up to 12 kHz: a 9 kHz tone comes out
    as strong as a 3 kHz one (decoded to 16 kHz, as before, it was gone)."""
    fake, url = tts_server
    t = np.arange(24_000) / 24_000
    tones = 0.25 * (np.sin(2 * np.pi * 3_000 * t) + np.sin(2 * np.pi * 9_000 * t))
    fake.body = write_wav(tmp_path / "tones.wav", tones, 24_000).read_bytes()
    engine = HttpTtsEngine(url, timeout_s=10.0)
    try:
        pcm = await engine.synthesize("tones")
    finally:
        await engine.close()
    assert abs(len(pcm) / RATE - 1.0) <= 0.02
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    bins = np.fft.rfftfreq(len(pcm), 1.0 / RATE)
    low, high = (spectrum[np.abs(bins - f) <= 50].max() for f in (3_000, 9_000))
    assert abs(20 * np.log10(high / low)) < 0.5


async def test_http_engine_recognises_wav_sent_as_octet_stream(
    tts_server: tuple[FakeTtsServer, str],
) -> None:
    fake, url = tts_server
    fake.content_type = None
    engine = HttpTtsEngine(url, timeout_s=10.0)
    try:
        pcm = await engine.synthesize("hi")
    finally:
        await engine.close()
    assert abs(len(pcm) / RATE - 1.0) <= 0.02


async def test_http_engine_server_error_names_url_and_status(
    tts_server: tuple[FakeTtsServer, str],
) -> None:
    fake, url = tts_server
    fake.status, fake.body, fake.content_type = 500, b"model exploded", "text/plain"
    engine = HttpTtsEngine(url, timeout_s=10.0)
    try:
        with pytest.raises(TtsError, match="HTTP 500") as info:
            await engine.synthesize("hello")
    finally:
        await engine.close()
    assert url in str(info.value)
    assert "model exploded" in str(info.value)


async def test_http_engine_garbage_body(tts_server: tuple[FakeTtsServer, str]) -> None:
    fake, url = tts_server
    fake.body = b"definitely not a wav " * 20
    engine = HttpTtsEngine(url, timeout_s=10.0)
    try:
        with pytest.raises(TtsError, match="cannot be decoded") as info:
            await engine.synthesize("hello")
    finally:
        await engine.close()
    assert url in str(info.value)
    assert "HTTP 200" in str(info.value)


async def test_http_engine_timeout(tts_server: tuple[FakeTtsServer, str]) -> None:
    fake, url = tts_server
    fake.hang = True
    engine = HttpTtsEngine(url, timeout_s=0.3)
    try:
        with pytest.raises(TtsError, match=r"did not answer within 0\.3 s") as info:
            await engine.synthesize("hello")
    finally:
        await engine.close()
    assert url in str(info.value)


async def test_http_engine_unreachable_server() -> None:
    # Port 9 on loopback (discard) is closed here: the connection is refused at once.
    engine = HttpTtsEngine("http://127.0.0.1:9/tts", timeout_s=5.0)
    try:
        with pytest.raises(
            TtsError, match=re.escape("cannot reach TTS server http://127.0.0.1:9/tts")
        ):
            await engine.synthesize("hello")
    finally:
        await engine.close()


async def test_http_engine_refuses_an_oversized_answer(
    tts_server: tuple[FakeTtsServer, str],
) -> None:
    _, url = tts_server
    engine = HttpTtsEngine(url, timeout_s=10.0, max_response_bytes=1000)
    try:
        with pytest.raises(TtsError, match="at most 1000 bytes"):
            await engine.synthesize("hello")
    finally:
        await engine.close()


async def test_http_engine_close_closes_its_session(
    tts_server: tuple[FakeTtsServer, str],
) -> None:
    _, url = tts_server
    made: list[aiohttp.ClientSession] = []

    def factory() -> aiohttp.ClientSession:
        made.append(aiohttp.ClientSession())
        return made[-1]

    engine = HttpTtsEngine(url, timeout_s=10.0, session_factory=factory)
    await engine.close()  # nothing opened yet: nothing to do
    assert made == []
    await engine.synthesize("one")
    await engine.synthesize("two")
    assert len(made) == 1  # made lazily, once
    assert not made[0].closed
    await engine.close()
    assert made[0].closed
    await engine.close()  # twice is fine


# --- no engine and engine choice ---------------------------------------------------


async def test_no_engine_says_how_to_enable_tts() -> None:
    engine = NoTtsEngine()
    with pytest.raises(TtsUnavailableError) as info:
        await engine.synthesize("hello")
    message = str(info.value)
    assert "apt-get install espeak-ng" in message
    assert "tts.engine: http" in message
    assert "tts.http_url" in message
    await engine.close()


def found(path: str | None) -> Callable[[str], str | None]:
    return lambda name: path if name == "espeak-ng" else None


async def test_build_auto_with_espeak_installed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streaming.audio_in.tts")
    engine = build_tts_engine(TtsSettings(engine="auto"), which=found(require_espeak()))
    assert isinstance(engine, EspeakEngine)
    assert engine.name == "espeak"
    assert "espeak-ng at" in caplog.text
    assert rms(await engine.synthesize("hello")) > 0.02
    await engine.close()


async def test_build_auto_without_espeak(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streaming.audio_in.tts")
    engine = build_tts_engine(TtsSettings(engine="auto"), which=found(None))
    assert isinstance(engine, NoTtsEngine)
    assert "text-to-speech: off" in caplog.text
    with pytest.raises(TtsUnavailableError, match="espeak-ng is not installed"):
        await engine.synthesize("hello")


def test_build_espeak() -> None:
    engine = build_tts_engine(
        TtsSettings(engine="espeak", voice="en-us"), which=found("/usr/bin/espeak-ng")
    )
    assert isinstance(engine, EspeakEngine)


def test_build_espeak_not_installed_fails_at_start_up() -> None:
    with pytest.raises(TtsUnavailableError, match=r"apt-get install espeak-ng") as info:
        build_tts_engine(TtsSettings(engine="espeak"), which=found(None))
    assert "espeak-ng is not on PATH" in str(info.value)


def test_build_espeak_with_a_bad_voice_fails_at_start_up() -> None:
    with pytest.raises(TtsInputError, match="not valid"):
        build_tts_engine(TtsSettings(engine="espeak", voice="en us"), which=found("/x"))


async def test_build_http(tts_server: tuple[FakeTtsServer, str]) -> None:
    fake, url = tts_server
    engine = build_tts_engine(
        TtsSettings(engine="http", http_url=url, voice="v1"), which=found(None)
    )
    assert isinstance(engine, HttpTtsEngine)
    try:
        pcm = await engine.synthesize("hello")
    finally:
        await engine.close()
    assert len(pcm) > 0
    assert fake.requests == [{"text": "hello", "voice": "v1"}]


def test_build_none_even_with_espeak_installed() -> None:
    engine = build_tts_engine(TtsSettings(engine="none"), which=found("/usr/bin/espeak-ng"))
    assert isinstance(engine, NoTtsEngine)


def test_engines_satisfy_the_protocol() -> None:
    engines: list[TtsEngine] = [
        EspeakEngine("/usr/bin/espeak-ng", "en", 1.0),
        HttpTtsEngine("http://127.0.0.1:1/", 1.0),
        NoTtsEngine(),
    ]
    assert [e.name for e in engines] == ["espeak", "http", "none"]
