"""GStreamer's webrtcbin calls the real server (issue 16).

The caller is ``tests/gst_caller.py`` under Debian's ``/usr/bin/python3`` (python3-gi,
GStreamer 1.22): it sends espeak-ng speech as Opus, decodes the server's H.264 with
``avdec_h264`` and makes its own offer. webrtcbin's DTLS certificate is RSA, which is
what made its calls fail before the server answered ``a=setup:passive``; the other tests
here make a handshake fail on purpose and read why in the server's log.

libnice (webrtcbin's ICE) gathers no loopback candidates, so unlike the other live
tests the server gathers the machine's own addresses too (no ``loopback`` fixture).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import aioice.ice
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from config.settings import Settings
from streaming.live.manager import SessionManager
from tests.live_calls import TIMEOUT_S, frames_due, until
from tests.media import SAMPLE_RATE, require_espeak, write_wav
from tests.whep_viewer import Viewer
from web.app import build_app
from web.app_keys import SESSIONS

pytestmark = pytest.mark.slow

SYSTEM_PYTHON = Path("/usr/bin/python3")
CALLER = Path(__file__).with_name("gst_caller.py")
DEBIAN_PACKAGES = (
    "gstreamer1.0-plugins-bad gstreamer1.0-plugins-good gstreamer1.0-plugins-base "
    "gstreamer1.0-nice gstreamer1.0-tools gstreamer1.0-libav python3-gi "
    "gir1.2-gst-plugins-bad-1.0 gir1.2-gst-plugins-base-1.0"
)
FRAMES = 50  # decoded by the caller: two seconds of the server's video
#: The server's ICE timeout where a test waits for it: long enough for ICE to connect on
#: a loaded machine, so that what times out is the DTLS handshake.
ICE_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def gst_caller() -> list[str]:
    """The command that runs the caller; missing Debian packages fail the test."""
    install = f"`apt-get install -y {DEBIAN_PACKAGES}` (.ci/run installs them)"
    if not SYSTEM_PYTHON.exists():
        pytest.fail(f"{SYSTEM_PYTHON} is missing: Debian's python3 and GStreamer: {install}")
    check = subprocess.run(
        [str(SYSTEM_PYTHON), str(CALLER), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_caller_env(),
        check=False,
    )
    try:
        missing = json.loads(check.stdout)["missing"]
    except (json.JSONDecodeError, KeyError):
        pytest.fail(f"{CALLER.name} --check failed ({check.returncode}): {check.stderr[-2000:]}")
    if missing:
        pytest.fail(f"GStreamer caller cannot run, missing: {'; '.join(missing)}. Run {install}")
    return [str(SYSTEM_PYTHON), str(CALLER)]


@pytest.fixture(scope="module")
def speech_wav(
    tmp_path_factory: pytest.TempPathFactory,
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
) -> Path:
    """The espeak-ng speech repeated for twice the longest wait (the caller plays it once)."""
    require_espeak()
    pcm, _ = speech_16k
    repeats = math.ceil(2 * TIMEOUT_S * SAMPLE_RATE / len(pcm))
    path = tmp_path_factory.mktemp("gst_speech") / "speech.wav"
    return write_wav(path, np.tile(pcm, repeats), SAMPLE_RATE)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir per module, so the demo avatar is generated once."""
    return tmp_path_factory.mktemp("lipstream_data")


@pytest.fixture
def host_addresses() -> None:
    """webrtcbin and the server meet on the machine's non-loopback addresses."""
    if not aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True):
        pytest.fail("no non-loopback network address: libnice (webrtcbin) gathers none on lo")


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, data_dir: Path, **session: float
) -> AsyncIterator[tuple[TestServer, SessionManager]]:
    """The real application serving the built-in demo avatar; ``session`` settings added."""
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(data_dir)},
            "devices": {"kind": "cpu"},
            "video": {"preset": "ultrafast"},
            "session": session,
        }
    )
    server = TestServer(build_app(settings), host="127.0.0.1")
    async with server:
        assert server.app is not None
        yield server, server.app[SESSIONS]


def _caller_env() -> dict[str, str]:
    """The test's environment without what would point Debian's python at the venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.setdefault("GST_DEBUG", "1")  # GStreamer's errors, into the caller's log
    return env


@dataclasses.dataclass
class GstCall:
    """``tests/gst_caller.py`` in a call with the server: its one JSON line, then its end."""

    process: asyncio.subprocess.Process
    log: Path
    line: dict[str, Any] | None = None

    async def result(self) -> dict[str, Any]:
        """The caller's line: once it decoded its frames, or failed (it then stays on)."""
        if self.line is None:
            assert self.process.stdout is not None
            try:  # the caller reports a failure itself within TIMEOUT_S
                raw = await asyncio.wait_for(self.process.stdout.readline(), TIMEOUT_S + 30)
            except TimeoutError:
                pytest.fail(f"the GStreamer caller said nothing; its log:\n{self.tail()}")
            if not raw:
                pytest.fail(f"the GStreamer caller ended early; its log:\n{self.tail()}")
            self.line = json.loads(raw)
        return self.line

    async def end(self) -> int:
        """Close the caller's standard input (it hangs up) and wait for its exit code."""
        assert self.process.stdin is not None
        self.process.stdin.close()  # communicate() closes it only when it writes to it
        stdout, _ = await asyncio.wait_for(self.process.communicate(), TIMEOUT_S)
        if self.line is None and stdout.strip():
            self.line = json.loads(stdout.splitlines()[0])
        assert self.process.returncode is not None
        return self.process.returncode

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@contextlib.asynccontextmanager
async def gst_call(
    command: list[str], server: TestServer, wav: Path, tmp_path: Path, *options: str
) -> AsyncIterator[GstCall]:
    url = str(server.make_url("")).rstrip("/")
    log = tmp_path / "gst_caller.log"
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *command,
            url,
            str(wav),
            f"--frames={FRAMES}",
            f"--timeout-s={TIMEOUT_S}",
            *options,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=_caller_env(),
        )
        call = GstCall(process, log)
        try:
            yield call
        finally:
            if process.returncode is None:
                try:
                    await call.end()
                except TimeoutError:
                    process.kill()
                    await process.communicate()


async def test_webrtcbins_own_offer_connects_and_decodes_the_h264_video(
    gst_caller: list[str], speech_wav: Path, tmp_path: Path, data_dir: Path, host_addresses: None
) -> None:
    async with (
        serving(tmp_path, data_dir) as (server, manager),
        gst_call(gst_caller, server, speech_wav, tmp_path) as call,
    ):
        result = await call.result()
        assert "error" not in result, f"{result}\n{call.tail()}"
        assert result["offer_setup"] == ["actpass"]  # webrtcbin's offer, as it made it
        assert result["answer_setup"] == ["passive"]  # the server is the DTLS server
        assert result["connection_state"] == "connected"
        assert result["rtp_encoding"]["video"] == "H264"
        assert result["frames_decoded"] >= FRAMES  # by avdec_h264
        caps = result["video_caps"]  # what avdec_h264 made of it
        assert re.match(r"video/x-raw, .*width=\(int\)1280, height=\(int\)720\b", caps), caps

        # The server heard the caller's speech: its speech gate sent frames to lip-sync.
        session = manager.get(result["session_id"])
        await until(
            lambda: frames_due(dataclasses.asdict(session.snapshot())) >= 25,
            "the server to hear the caller's speech",
        )
        assert session.state == "streaming"
        assert await call.end() == 0, call.tail()  # it hung up with DELETE /sessions/{id}
    assert manager.counters.ended_by_reason == {"hung up by API": 1}


async def test_webrtcbin_publishes_over_whip_and_the_avatar_speaks_for_viewers(
    gst_caller: list[str], speech_wav: Path, tmp_path: Path, data_dir: Path, host_addresses: None
) -> None:
    async with (
        serving(tmp_path, data_dir) as (server, manager),
        gst_call(gst_caller, server, speech_wav, tmp_path, "--whip") as call,
    ):
        result = await call.result()
        assert "error" not in result, f"{result}\n{call.tail()}"
        session = manager.get(result["session_id"])
        assert session.has_caller
        async with aiohttp.ClientSession(base_url=str(server.make_url(""))) as http:
            viewer = Viewer(http, session.session_id)  # watched over WHEP, as anyone would
            try:
                await viewer.watch()
                await until(lambda: session.stats.frames_inferred >= 10, "webrtcbin's speech")
                await until(lambda: viewer.watched.audio_peak > 0.05, "the viewer to hear it")
                await until(lambda: len(viewer.watched.pictures) >= 25, "the viewer's pictures")
            finally:
                await viewer.close()
        assert await call.end() == 0  # it DELETEs its Location
        await until(lambda: not manager.sessions, "the session to end with the publisher")


async def test_a_failed_dtls_handshake_is_logged_with_openssls_reason(
    gst_caller: list[str],
    speech_wav: Path,
    tmp_path: Path,
    data_dir: Path,
    host_addresses: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 16's failure, made on purpose: an offer that says passive makes the server
    the DTLS client against webrtcbin's RSA certificate; webrtcbin finds no shared
    cipher and sends a handshake_failure alert, which the server logs."""
    async with (
        serving(tmp_path, data_dir) as (server, manager),
        gst_call(gst_caller, server, speech_wav, tmp_path, "--offer-setup=passive") as call,
    ):
        result = await call.result()
        assert result["answer_setup"] == ["active"]
        assert "error" in result, result
        session_id = result["session_id"]

        def logged() -> list[str]:
            messages = [r.getMessage() for r in caplog.records]
            return [m for m in messages if m.startswith("DTLS handshake failed:")]

        (line,) = await until(logged, "the server to log the failed handshake")
        # OpenSSL 3.0 words it "sslv3 alert", later releases "tls alert".
        assert re.fullmatch(
            rf"DTLS handshake failed: session={session_id} "
            r"cause=(sslv3|tls) alert handshake failure \(as DTLS client\)",
            line,
        ), line
        await until(lambda: not manager.sessions, "the session to end")
        (reason,) = manager.counters.ended_by_reason
        assert reason == "DTLS failed: " + line.split("cause=")[1]
        assert await call.end() == 1


async def test_a_dtls_handshake_nobody_starts_is_logged_as_a_dtls_timeout(
    gst_caller: list[str],
    speech_wav: Path,
    tmp_path: Path,
    data_dir: Path,
    host_addresses: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Both sides DTLS servers, waiting for each other (the offer says active, so the
    server answers passive; the caller applies the answer as if it said active): ICE
    connects, DTLS never starts, and the server says so, not "ICE timeout"."""
    async with (
        serving(tmp_path, data_dir, ice_timeout_s=ICE_TIMEOUT_S) as (server, manager),
        gst_call(
            gst_caller,
            server,
            speech_wav,
            tmp_path,
            "--offer-setup=active",
            "--answer-setup=active",
        ) as call,
    ):
        await until(lambda: manager.counters.ended, "the server to end the call")
        assert manager.counters.ended_by_reason == {"DTLS handshake timed out": 1}
        assert await call.end() == 1
        result = await call.result()
        assert result["answer_setup"] == ["passive"]  # an offer that says active keeps it
        assert result["ice_connection_state"] in ("connected", "completed")
        messages = [r.getMessage() for r in caplog.records]
        assert any(
            m.startswith(f"DTLS handshake timed out: session={result['session_id']} ")
            for m in messages
        ), messages
