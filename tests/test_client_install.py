"""The Python client installs alone and calls a real server from its own environment.

``clients/python`` is installed from the package index into a fresh virtual environment
(no lipstream server packages, no onnxruntime, no OpenCV), and a script run by that
environment's Python calls ``lipstream serve``: 720p frames in, text spoken, its
``speech_started`` on the data channel.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.server_process import lipstream_serve

REPO = Path(__file__).resolve().parent.parent
CLIENT = REPO / "clients" / "python"
INSTALL_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 120.0

pytestmark = pytest.mark.slow

SCRIPT = """
import asyncio
import importlib.util
import json
import sys

import aioice.ice

# aioice skips loopback addresses, and this sandbox has no other: what
# streaming.webrtc.compat.loopback_only_ice does for the server's tests (test code only).
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]

import lipstream_client as lc

FORBIDDEN = ("onnxruntime", "cv2", "config", "inference_core", "compositor", "streaming", "web")


async def main(base_url):
    result = {"importable": [n for n in FORBIDDEN if importlib.util.find_spec(n) is not None]}
    async with await lc.connect(base_url, "demo") as call:
        sizes = set()
        async with asyncio.timeout(60):
            async for frame in call.video_frames():
                sizes.add((frame.frame.width, frame.frame.height))
                if frame.index >= 25:
                    break
            queued = await call.say("Hello from a fresh virtual environment.")
            async for event in call.events():
                if event["type"] == "speech_started":
                    break
        result.update(
            sizes=sorted(sizes),
            utterance=queued.utterance,
            started=event,
            video_frames=call.stats.video_frames,
        )
    result["loaded"] = sorted(n for n in FORBIDDEN if n in sys.modules)
    sys.stdout.write(json.dumps(result))


asyncio.run(main(sys.argv[1]))
"""


async def _run(*command: str | Path, cwd: Path, timeout_s: float) -> str:
    proc = await asyncio.create_subprocess_exec(
        *map(str, command),
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, f"{command} failed:\n{err.decode(errors='replace')[-4000:]}"
    return out.decode()


async def test_the_client_installs_alone_and_calls_a_real_server(tmp_path: Path) -> None:
    python3 = shutil.which("python3") or sys.executable
    venv = tmp_path / "venv"
    # A copy, so the build writes nothing into the working tree.
    source = tmp_path / "lipstream-client"
    shutil.copytree(
        CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    await _run(python3, "-m", "venv", venv, cwd=tmp_path, timeout_s=120)
    await _run(
        venv / "bin" / "python",
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        source,
        cwd=tmp_path,
        timeout_s=INSTALL_TIMEOUT_S,
    )
    script = tmp_path / "call_demo.py"
    script.write_text(SCRIPT)
    (tmp_path / "server").mkdir()
    async with lipstream_serve(tmp_path / "server", server={"ice_loopback_only": "true"}) as s:
        out = await _run(
            venv / "bin" / "python",
            script,
            f"http://127.0.0.1:{s.port}",
            cwd=tmp_path,  # not the repository: its packages must not be found
            timeout_s=CALL_TIMEOUT_S,
        )
    result = json.loads(out)
    assert result["importable"] == []
    assert result["loaded"] == []
    assert result["sizes"] == [[1280, 720]]
    assert result["video_frames"] > 25
    assert result["utterance"] == 1
    assert result["started"]["source"] == "say"
