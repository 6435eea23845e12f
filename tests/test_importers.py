"""Importing avatars people already have: SyncTalk_2D and LiveTalking folders.

The folders are built here from the demo avatar's frames, with landmark and coordinate
files placed from its known face rects, and models with SyncTalk_2D-style names and a
fixed batch of 1. Every import must give a valid package whose rects follow the source
project's rule exactly, and every bad input must be refused by name, leaving nothing
in the avatar root.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import wave
from pathlib import Path

import av
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image

from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.locator import AvatarLocator
from inference_core.avatars.validation import validate_package
from inference_core.importers import (
    ImportFailedError,
    clip_ranges,
    fit_rects,
    livetalking,
    load_numbers,
    parse_clip,
    synctalk2d,
    ultralight,
    write_package,
)
from streaming.offline.render import RenderOptions, render_file
from tests.media import speech_with_pauses, write_wav
from tests.onnx_builders import tiny_lipsync
from tests.webrtc_client import Caller
from web.app import build_app
from web.cli.main import main

FRAMES = 6


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_avatar(tmp_path_factory.mktemp("demo") / "demo", count=FRAMES)


def _demo_rects(demo: Path) -> list[list[int]]:
    rects: list[list[int]] = json.loads((demo / "rects.json").read_text())
    return rects


def _landmarks(x1: int, y1: int, x2: int) -> str:
    points = [(x1 + x2) // 2, y1 + 20] * 110
    lms = np.array(points).reshape(110, 2)
    lms[1] = (x1, y1 + 30)  # left of the face
    lms[31] = (x2, y1 + 30)  # right of the face
    lms[52] = ((x1 + x2) // 2, y1)  # top of the crop
    return "\n".join(f"{x} {y}" for x, y in lms) + "\n"


def synctalk_folder(demo: Path, dest: Path, rects: list[list[int]] | None = None) -> Path:
    """dataset/<name>: full_body_img/<i>.jpg and landmarks/<i>.lms, SyncTalk_2D's layout."""
    (dest / "full_body_img").mkdir(parents=True)
    (dest / "landmarks").mkdir()
    for i, (x1, y1, x2, _) in enumerate(rects or _demo_rects(demo)):
        shutil.copy(demo / "frames" / f"{i:05d}.jpg", dest / "full_body_img" / f"{i}.jpg")
        (dest / "landmarks" / f"{i}.lms").write_text(_landmarks(x1, y1, x2))
    tiny_lipsync(dest / "unet_328.onnx", batch=1)  # SyncTalk_2D exports: input/audio, batch 1
    shutil.copy(demo / "audio_encoder.onnx", dest / "audio_encoder.onnx")
    return dest


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def _speech_wav(path: Path, seconds: float = 1.0) -> Path:
    t = np.arange(int(16000 * seconds)) / 16000
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(pcm.tobytes())
    return path


def test_synctalk2d_import_follows_its_crop_rule_and_renders(demo: Path, tmp_path: Path) -> None:
    folder = synctalk_folder(demo, tmp_path / "dataset" / "may")
    source = synctalk2d(folder, folder / "unet_328.onnx", folder / "audio_encoder.onnx")
    root = tmp_path / "avatars"
    report = write_package(source, root, "may")
    assert report.path == root / "may"
    assert report.frames == FRAMES
    assert report.frame_size == (1280, 720)
    assert not report.dynamic_batch
    assert any("fixed batch of 1" in note for note in report.notes)
    assert "input[1, 6, 320, 320]" in report.model_io
    # The rule: x from landmark 1 to 31, y from landmark 52, square; then even pixels.
    want = []
    for x1, y1, x2, _ in _demo_rects(demo):
        r = [x1, y1, x2, y1 + (x2 - x1)]
        want.append([r[0] - r[0] % 2, r[1] - r[1] % 2, r[2] + r[2] % 2, r[3] + r[3] % 2])
    assert json.loads((root / "may" / "rects.json").read_text()) == want
    assert validate_package(root / "may") == []
    assert _leftovers(root) == []
    package = AvatarLocator(root).load("may")
    out = render_file(
        package, _speech_wav(tmp_path / "a.wav"), tmp_path / "may.mp4", RenderOptions()
    )
    assert out.frames == 25
    assert out.inferred_frames > 0


def test_rects_past_the_frame_are_moved_inside_and_reported() -> None:
    fitted = fit_rects(np.array([[-10, 5, 290, 305], [1000, 601, 1290, 891]]), (1280, 720))
    assert fitted.rects.tolist() == [[0, 4, 300, 306], [990, 430, 1280, 720]]
    assert fitted.max_shift_px == 171
    assert fitted.max_snap_px == 1
    with pytest.raises(ImportFailedError, match=r"frame 0 has rect \[0, 0, 800, 800\]"):
        fit_rects(np.array([[0, 0, 800, 800]]), (1280, 720))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: (f / "landmarks" / "3.lms").unlink(), r"3\.lms: missing"),
        (
            lambda f: (f / "landmarks" / "2.lms").write_text("1 2\n3 4\n"),
            r"2\.lms: 2 landmark lines, SyncTalk_2D writes 110",
        ),
        (lambda f: (f / "full_body_img" / "4.jpg").unlink(), "frame 4 is missing"),
        (lambda f: tiny_lipsync(f / "unet_328.onnx", size=160), r"unet_328\.onnx: model inputs"),
    ],
    ids=["missing-landmarks", "wrong-point-count", "frame-gap", "model-does-not-fit"],
)
def test_bad_synctalk_folders_are_refused_by_name_leaving_nothing(
    demo: Path, tmp_path: Path, damage: object, message: str
) -> None:
    folder = synctalk_folder(demo, tmp_path / "may")
    damage(folder)  # type: ignore[operator]
    root = tmp_path / "avatars"
    root.mkdir()

    def run_import() -> None:
        source = synctalk2d(folder, folder / "unet_328.onnx", folder / "audio_encoder.onnx")
        write_package(source, root, "may")

    with pytest.raises(ImportFailedError, match=message):
        run_import()
    assert list(root.iterdir()) == []


def test_an_existing_id_is_refused_unless_replaced(demo: Path, tmp_path: Path) -> None:
    folder = synctalk_folder(demo, tmp_path / "may")
    source = synctalk2d(folder, folder / "unet_328.onnx", folder / "audio_encoder.onnx")
    root = tmp_path / "avatars"
    write_package(source, root, "may")
    with pytest.raises(ImportFailedError, match=r"already exists.*--replace"):
        write_package(source, root, "may")
    report = write_package(source, root, "may", replace=True, link=True)
    assert validate_package(report.path) == []
    assert os.stat(report.path / "frames" / "00000.jpg").st_nlink == 2  # linked, not copied
    assert _leftovers(root) == []


def livetalking_folder(demo: Path, dest: Path, *, numpy_ints: bool = True) -> Path:
    """data/avatars/<id>: full_imgs/%08d.png and coords.pkl as (y1, y2, x1, x2)."""
    (dest / "full_imgs").mkdir(parents=True)
    coords = []
    for i, (x1, y1, x2, y2) in enumerate(_demo_rects(demo)):
        Image.open(demo / "frames" / f"{i:05d}.jpg").save(dest / "full_imgs" / f"{i:08d}.png")
        box = (y1, y2, x1, x2)
        coords.append(tuple(np.int64(v) for v in box) if numpy_ints else box)
    (dest / "coords.pkl").write_bytes(pickle.dumps(coords))
    tiny_lipsync(dest / "wav2lip.onnx", size=96, audio_shape=(1, 80, 16))
    return dest


def test_livetalking_wav2lip_import_reads_its_pickle_safely(demo: Path, tmp_path: Path) -> None:
    folder = livetalking_folder(demo, tmp_path / "live")
    source = livetalking(folder, "wav2lip", folder / "wav2lip.onnx")
    assert source.adapter.name == "wav2lip_96"
    assert any("watermark" in note or "'LiveTalking'" in note for note in source.notes)
    report = write_package(source, tmp_path / "avatars", "live")
    rects = json.loads((report.path / "rects.json").read_text())
    assert rects == _demo_rects(demo)  # the demo's rects are already even
    assert validate_package(report.path) == []


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_a_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "coords.pkl"
    path.write_bytes(pickle.dumps([(1, 2, 3, 4), _Exploit(marker)]))
    with pytest.raises(ImportFailedError, match=r"refused to load (posix|os)\.system"):
        load_numbers(path)
    assert not marker.exists()
    path.write_bytes(pickle.dumps({"a": [1, 2]}))
    with pytest.raises(ImportFailedError, match="holds a dict"):
        load_numbers(path)
    path.write_bytes(pickle.dumps([(np.int32(5), np.float64(1.5), 7, 8.0)]))
    assert load_numbers(path) == [(5, 1.5, 7, 8.0)]


def test_ultralight_is_refused_naming_what_is_missing(demo: Path, tmp_path: Path) -> None:
    with pytest.raises(ImportFailedError, match=r"HuBERT .* WeNet .* does not compute"):
        ultralight(tmp_path)
    folder = livetalking_folder(demo, tmp_path / "live")
    with pytest.raises(ImportFailedError, match="HuBERT"):
        livetalking(folder, "ultralight", folder / "wav2lip.onnx")


def test_the_cli_imports_and_reports(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = synctalk_folder(demo, tmp_path / "may")
    config = tmp_path / "lipstream.yaml"
    config.write_text(f"avatars:\n  root: {tmp_path / 'avatars'}\n  demo: false\n")
    argv = ["--config", str(config), "avatar", "import", "synctalk2d", str(folder)]
    models = ["--lipsync", str(folder / "unet_328.onnx")]
    models += ["--audio-encoder", str(folder / "audio_encoder.onnx")]
    assert main([*argv, *models, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "imported may from synctalk2d" in out
    assert f"{FRAMES} frames, 1280x720" in out
    assert "note: the lip-sync model has a fixed batch of 1" in out
    assert main([*argv, *models, "--no-progress"]) == 1
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("idle=0:60", (0, 60)),
        ("thinking=4.8s:7.2s", (120, 180)),
        ("wave=2s:75", (50, 75)),
        ("a_b-1=.5s:1.s", (12, 25)),  # 12.5 rounds to the even 12
    ],
)
def test_a_clip_option_reads_frames_or_seconds(text: str, expected: tuple[int, int]) -> None:
    option = parse_clip(text)
    assert option.name == text.split("=")[0]
    assert option.frames(25) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("idle", "--clip 'idle': write NAME=START:STOP"),
        ("idle=0-60", "--clip 'idle=0-60': write NAME=START:STOP"),
        ("Idle=0:60", "--clip 'Idle=0:60': the name 'Idle' must be 1-32 characters"),
        ("idle=a:60", "--clip 'idle=a:60': START 'a' is not a frame number (120) or seconds"),
        ("idle=0:-6", "--clip 'idle=0:-6': STOP '-6' is not a frame number"),
        ("idle=0:2ms", "STOP '2ms' is not a frame number"),
    ],
)
def test_a_bad_clip_option_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(ImportFailedError) as caught:
        parse_clip(text)
    assert message in str(caught.value)


def test_clip_ranges_fit_the_avatar_or_are_refused() -> None:
    options = [parse_clip("idle=0:4"), parse_clip("thinking=0.08s:0.24s")]
    assert clip_ranges(options, 25, 6) == {"idle": (0, 4), "thinking": (2, 6)}
    assert clip_ranges(options, 25, 10, shift=0) == {"idle": (0, 4), "thinking": (2, 6)}
    with pytest.raises(ImportFailedError, match=r"frames \[0, 4\) are past the avatar's 3 frames"):
        clip_ranges(options, 25, 3)
    with pytest.raises(ImportFailedError, match=r"frames 1 to 6 were kept"):
        clip_ranges(options, 25, 6, shift=1)
    with pytest.raises(ImportFailedError, match="'idle' given twice"):
        clip_ranges([options[0], options[0]], 25, 6)
    with pytest.raises(ImportFailedError, match=r"hold 1 frame\(s\) at 25 fps; a clip needs"):
        clip_ranges([parse_clip("wave=0.1s:0.12s")], 25, 6)
    assert clip_ranges([parse_clip("still=0:1")], 25, 1) == {"still": (0, 1)}


def test_the_cli_imports_clips_and_refuses_bad_ones(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = synctalk_folder(demo, tmp_path / "may")
    config = tmp_path / "lipstream.yaml"
    root = tmp_path / "avatars"
    config.write_text(f"avatars:\n  root: {root}\n  demo: false\n")
    argv = ["--config", str(config), "avatar", "import", "synctalk2d", str(folder)]
    argv += ["--lipsync", str(folder / "unet_328.onnx"), "--no-progress"]
    argv += ["--audio-encoder", str(folder / "audio_encoder.onnx")]
    assert main([*argv, "--clip", "thinking=7:9"]) == 1
    assert "--clip 'thinking=7:9': frames [7, 9) are past the avatar's 6 frames" in (
        capsys.readouterr().err
    )
    assert not (root / "may").exists()  # refused before anything was written
    assert main([*argv, "--clip", "idle=0:4", "--clip", "thinking=0.08s:0.24s"]) == 0
    manifest = json.loads((root / "may" / "avatar.json").read_text())
    assert manifest["clips"] == {"idle": [0, 4], "thinking": [2, 6]}
    assert AvatarLocator(root).load("may").clips == {"idle": (0, 4), "thinking": (2, 6)}
    assert validate_package(root / "may") == []


async def test_a_live_call_lip_syncs_on_an_imported_avatar(
    demo: Path, tmp_path: Path, loopback: None
) -> None:
    folder = synctalk_folder(demo, tmp_path / "may")
    source = synctalk2d(folder, folder / "unet_328.onnx", folder / "audio_encoder.onnx")
    root = tmp_path / "avatars"
    write_package(source, root, "may")
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(tmp_path / "data"), "demo": False},
            "video": {"preset": "ultrafast"},
        }
    )
    pcm, _ = speech_with_pauses(tmp_path, ("hello from an imported avatar",), pause_s=0.5)
    t = np.arange(len(pcm) * 3) / 3  # 48 kHz, as a browser sends it
    wav = write_wav(tmp_path / "mic.wav", np.interp(t, np.arange(len(pcm)), pcm), 48_000)
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        caller = Caller(client, avatar="may")
        await caller.connect(microphone=wav)
        try:
            await caller.wait_for_media(len(pcm) / 16_000)
            assert caller.received.size == (1280, 720)
            state = await (await client.get(f"/sessions/{caller.session_id}")).json()
            assert state["avatar"] == "may"
            assert state["frames_inferred"] > 0
        finally:
            await caller.hang_up()


def test_preview_draws_each_frames_crop_rect(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = synctalk_folder(demo, tmp_path / "may")
    source = synctalk2d(folder, folder / "unet_328.onnx", folder / "audio_encoder.onnx")
    root = tmp_path / "avatars"
    report = write_package(source, root, "may")
    config = tmp_path / "lipstream.yaml"
    config.write_text(f"avatars:\n  root: {root}\n  demo: false\n")
    out = tmp_path / "preview.mp4"
    wav = _speech_wav(tmp_path / "a.wav", seconds=3.0)
    argv = ["--config", str(config), "avatar", "preview", "may", "--audio", str(wav)]
    assert main([*argv, "--out", str(out), "--seconds", "1"]) == 0
    assert "wrote" in capsys.readouterr().out
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="gray") for f in container.decode(video=0)]
    assert len(frames) == 25  # 1 s of the 3 s audio
    rects = json.loads((report.path / "rects.json").read_text())
    x1, y1, x2, _ = rects[0]
    top_edge = frames[0][y1, x1 + 10 : x2 - 10]
    inside = frames[0][y1 + 10, x1 + 10 : x2 - 10]
    assert top_edge.mean() > 230  # the white outline
    assert inside.mean() < 200  # not the face


async def test_the_admin_api_imports_into_a_running_server(demo: Path, tmp_path: Path) -> None:
    incoming = tmp_path / "incoming"
    synctalk_folder(demo, incoming / "may")
    (tmp_path / "secret.onnx").write_bytes(b"outside the import root")
    root = tmp_path / "avatars"
    settings = Settings.model_validate(
        {
            "avatars": {
                "root": str(root),
                "data_dir": str(tmp_path / "data"),
                "demo": False,
                "import_root": str(incoming),
            }
        }
    )
    wanted = {
        "source": "synctalk2d",
        "directory": "may",
        "lipsync": "may/unet_328.onnx",
        "audio_encoder": "may/audio_encoder.onnx",
        "id": "may",
    }
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        escape = await client.post(
            "/admin/avatars/import", json={**wanted, "lipsync": "../secret.onnx"}
        )
        assert escape.status == 400
        assert (await escape.json())["error"]["code"] == "bad_path"
        broken = await client.post(
            "/admin/avatars/import", json={**wanted, "audio_encoder": "may/unet_328.onnx"}
        )
        assert broken.status == 422
        assert (await broken.json())["error"]["code"] == "import_failed"
        assert not root.exists() or _leftovers(root) == []
        bad_clip = await client.post(
            "/admin/avatars/import", json={**wanted, "clips": {"thinking": [4, 9]}}
        )
        assert bad_clip.status == 422
        assert (
            "clips.thinking: [4, 9] must be a [start, stop) range"
            in ((await bad_clip.json())["error"]["message"])
        )
        assert not (root / "may").exists()
        response = await client.post(
            "/admin/avatars/import", json={**wanted, "clips": {"thinking": [2, 6]}}
        )
        assert response.status == 201, await response.text()
        imported = await response.json()
        assert (imported["id"], imported["frames"], imported["dynamic_batch"]) == ("may", 6, False)
        assert imported["frame_size"] == [1280, 720]
        assert AvatarLocator(root).load("may").clips == {"idle": (0, 6), "thinking": (2, 6)}
        models = await (await client.get("/admin/models")).json()
        assert "may" in [m["id"] for m in models["models"]]
        loaded = await client.post("/admin/models/may/load")
        assert loaded.status == 200, await loaded.text()
        again = await client.post("/admin/avatars/import", json=wanted)
        assert again.status == 409
        assert (await again.json())["error"]["code"] == "avatar_exists"
        busy = await client.post("/admin/avatars/import", json={**wanted, "replace": True})
        assert busy.status == 409
        assert (await busy.json())["error"]["code"] == "model_in_use"
