"""The `lipstream` command line: each bad input gives a clear error and the right exit code."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from config.settings import ServerSettings
from tests.media import write_wav
from tests.packages import make_package
from web.cli.health import health_url
from web.cli.main import main


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A config pointing the avatar root and data dir into tmp_path."""
    path = tmp_path / "lipstream.yaml"
    path.write_text(f"avatars:\n  root: {tmp_path / 'avatars'}\n  data_dir: {tmp_path / 'data'}\n")
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_render_demo_writes_mp4(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wav = write_wav(tmp_path / "tone.wav", 0.3 * np.sin(np.arange(16_000) / 5.0), 16_000)
    out = tmp_path / "out.mp4"
    code, stdout, _ = _run(
        capsys, "--config", str(config), "render", "--audio", str(wav), "--out", str(out)
    )
    assert code == 0
    assert "25 frames at 25 fps" in stdout
    assert out.stat().st_size > 1000


def test_missing_avatar(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        capsys, "--config", str(config), "render", "--avatar", "nobody", "--out", "x.mp4"
    )
    assert code == 1
    assert "no avatar 'nobody'" in err
    assert "available: demo" in err


def test_corrupt_onnx(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    package = make_package(tmp_path / "avatars" / "broken")
    (package / "lipsync.onnx").write_bytes(b"\x00not onnx" * 50)
    code, _, err = _run(
        capsys, "--config", str(config), "render", "--avatar", "broken", "--out", "x.mp4"
    )
    assert code == 1
    assert "lipsync.onnx cannot be loaded" in err


def test_unreadable_audio(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "speech.wav"
    garbage.write_bytes(b"RIFF this is not audio" * 20)
    code, _, err = _run(
        capsys,
        "--config",
        str(config),
        "render",
        "--audio",
        str(garbage),
        "--out",
        str(tmp_path / "x.mp4"),
    )
    assert code == 1
    assert f"cannot read {garbage} as audio" in err
    assert not (tmp_path / "x.mp4").exists()
    code, _, err = _run(
        capsys, "--config", str(config), "render", "--audio", "nope.wav", "--out", "x.mp4"
    )
    assert code == 1
    assert "audio file nope.wav does not exist" in err


def test_bad_config_value_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("batching:\n  max_batch_size: 0\nregistry:\n  eviction_policy: fifo\n")
    code, _, err = _run(capsys, "--config", str(bad), "config", "check")
    assert code == 2
    assert "batching.max_batch_size: got 0" in err
    assert "registry.eviction_policy: got 'fifo'" in err
    assert "lru" in err


def test_config_check_prints_effective_settings(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "--config", str(config), "config", "check")
    assert code == 0
    assert json.loads(out)["batching"] == {
        "max_batch_size": None,
        "max_wait_ms": 3.0,
        "queue_size": 256,
    }


def test_avatar_validate_lists_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    package = make_package(tmp_path / "alice")
    code, out, _ = _run(capsys, "avatar", "validate", str(package))
    assert (code, out.strip()) == (0, f"{package}: ok")
    (package / "frames" / "00001.jpg").unlink()
    (package / "rects.json").write_text("[[0, 0, 10]]")
    code, out, _ = _run(capsys, "avatar", "validate", str(package))
    assert code == 1
    assert "2 problem(s)" in out
    assert "frame files missing (00001.jpg)" in out
    assert "rects: rects.json must be a list of [x1, y1, x2, y2] numbers" in out


def test_avatar_list_and_demo(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_package(tmp_path / "avatars" / "alice")
    code, out, _ = _run(capsys, "--config", str(config), "avatar", "list")
    assert (code, out.split()) == (0, ["alice", "demo"])
    code, out, _ = _run(capsys, "--config", str(config), "avatar", "demo")
    assert code == 0
    assert Path(out.strip()).is_relative_to(tmp_path / "data")
    assert (Path(out.strip()) / "avatar.json").is_file()


def test_health_url_asks_a_wildcard_host_on_loopback() -> None:
    assert health_url(ServerSettings(host="0.0.0.0", port=9000)) == "http://127.0.0.1:9000/health"
    assert health_url(ServerSettings(host="::", port=9000)) == "http://[::1]:9000/health"
    assert health_url(ServerSettings(host="10.1.2.3")) == "http://10.1.2.3:8080/health"


async def test_health_answers_for_a_live_server_and_fails_for_a_dead_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the container's HEALTHCHECK runs: exit 0 while /health answers, 1 after."""

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/health", health)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = f"http://127.0.0.1:{server.port}/health"
    try:
        # urllib blocks: run the command beside the event loop that serves it.
        code = await asyncio.to_thread(main, ["health", "--url", url])
        out, _ = capsys.readouterr()
        assert code == 0
        assert out.strip() == f"{url}: ok"
    finally:
        await server.close()
    code = await asyncio.to_thread(main, ["health", "--url", url, "--timeout", "2"])
    _, err = capsys.readouterr()
    assert code == 1
    assert f"{url} did not answer" in err
    assert main(["health", "--url", "file:///etc/passwd"]) == 1
    assert "is not an http:// or https:// URL" in capsys.readouterr().err
