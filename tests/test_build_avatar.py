"""Building an avatar from a video: decoding, a face detector's boxes, gaps, the segment.

The video is encoded here from the demo avatar's frames; the "face detector" is a tiny
ONNX graph with SCRFD-style outputs (per stride a score and a box per anchor) that
reports one fixed face, or none when the frame is black, so every rect is known exactly.
"""

from __future__ import annotations

import json
import wave
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.validation import validate_package
from inference_core.importers import ImportFailedError, parse_clip, write_package
from inference_core.importers.build import build_from_video, prepare_synctalk
from tests.onnx_builders import tiny_lipsync
from web.cli.main import main

FRAMES = 40
# The fixed face: stride 32, grid cell (col 10, row 6), distances (2, 3, 2, 2) strides,
# i.e. (256, 96, 384, 256) in the 640 input, (512, 192, 768, 512) in a 1280x720 frame.
FACE_BOX = (512, 192, 768, 512)
# crop_rect: side 256, bottom 512 + 0.05 * 256 = 524.8 → (512, 268.8, 768, 524.8),
# rounded (512, 269, 768, 525), snapped to even pixels:
EXPECTED_RECT = [512, 268, 768, 526]


def scrfd_like_detector(path: Path) -> Path:
    """Scores and boxes for strides 8, 16, 32 (2 anchors); one face unless the frame is dark."""
    nodes = [
        helper.make_node("ReduceMean", ["input.1"], ["mean"], keepdims=0),
        helper.make_node("Sub", ["mean", "dark"], ["lit"]),
        helper.make_node("Mul", ["lit", "sharp"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["gate"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(-0.9, np.float32), "dark"),
        numpy_helper.from_array(np.array(50.0, np.float32), "sharp"),
    ]
    outputs = []
    for stride in (8, 16, 32):
        n = (640 // stride) ** 2 * 2
        scores = np.zeros((n, 1), np.float32)
        boxes = np.ones((n, 4), np.float32)
        if stride == 32:
            anchor = (6 * 20 + 10) * 2
            scores[anchor] = 0.95
            boxes[anchor] = (2, 3, 2, 2)
        inits += [
            numpy_helper.from_array(scores, f"s{stride}"),
            numpy_helper.from_array(boxes, f"b{stride}"),
        ]
        nodes += [
            helper.make_node("Mul", [f"s{stride}", "gate"], [f"score_{stride}"]),
            helper.make_node("Identity", [f"b{stride}"], [f"bbox_{stride}"]),
        ]
        outputs.append((f"score_{stride}", [n, 1], f"bbox_{stride}", [n, 4]))
    graph = helper.make_graph(
        nodes,
        "scrfd_like",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, 640, 640])],
        [helper.make_tensor_value_info(s, TensorProto.FLOAT, d) for s, d, _, _ in outputs]
        + [helper.make_tensor_value_info(b, TensorProto.FLOAT, d) for _, _, b, d in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_avatar(tmp_path_factory.mktemp("demo") / "demo", count=FRAMES)


def person_video(demo: Path, path: Path, *, dark: range = range(0)) -> Path:
    """An mp4 of the demo frames (those in ``dark`` black) with a 48 kHz tone as audio."""
    with av.open(str(path), mode="w") as out:
        video = out.add_stream("libx264", rate=25)
        video.width, video.height, video.pix_fmt = 1280, 720, "yuv420p"
        audio = out.add_stream("aac", rate=48000, layout="mono")
        for i in range(FRAMES):
            image = cv2.imread(str(demo / "frames" / f"{i:05d}.jpg"))
            if i in dark:
                image[:] = 0
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts, frame.time_base = i, Fraction(1, 25)
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        t = np.arange(48000 * FRAMES // 25) / 48000
        tone = (0.2 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
        for start in range(0, len(tone), 1024):
            block = tone[None, start : start + 1024]
            chunk = av.AudioFrame.from_ndarray(block, format="fltp", layout="mono")
            chunk.sample_rate, chunk.pts = 48000, start
            out.mux(audio.encode(chunk))
        out.mux(audio.encode(None))
    return path


def test_build_from_video_with_a_detector_gives_a_valid_avatar(demo: Path, tmp_path: Path) -> None:
    video = person_video(demo, tmp_path / "person.mp4")
    lipsync = tiny_lipsync(tmp_path / "unet.onnx")
    source = build_from_video(
        video,
        lipsync,
        demo / "audio_encoder.onnx",
        tmp_path / "work",
        detector=scrfd_like_detector(tmp_path / "scrfd.onnx"),
        min_seconds=1.0,
    )
    assert source.frame_size == (1280, 720)
    assert 25 <= len(source.frames) <= FRAMES
    assert source.rects.tolist() == [EXPECTED_RECT] * len(source.frames)
    assert "the segment whose two ends move least" in source.notes[0]
    report = write_package(source, tmp_path / "avatars", "person")
    assert validate_package(report.path) == []
    assert report.frames == len(source.frames)


def test_short_gaps_are_interpolated_long_ones_refused(demo: Path, tmp_path: Path) -> None:
    detector = scrfd_like_detector(tmp_path / "scrfd.onnx")
    lipsync = tiny_lipsync(tmp_path / "unet.onnx")
    short = person_video(demo, tmp_path / "short.mp4", dark=range(10, 13))
    source = build_from_video(
        short, lipsync, None, tmp_path / "w1", detector=detector, min_seconds=1.6
    )
    assert "3 frame(s) without a face were interpolated" in " ".join(source.notes)
    assert source.rects.tolist() == [EXPECTED_RECT] * len(source.frames)
    long = person_video(demo, tmp_path / "long.mp4", dark=range(5, 25))
    with pytest.raises(ImportFailedError, match=r"no face in frames 5-24 .* --rects"):
        build_from_video(long, lipsync, None, tmp_path / "w2", detector=detector)


def test_rects_file_instead_of_a_detector(demo: Path, tmp_path: Path) -> None:
    video = person_video(demo, tmp_path / "person.mp4")
    rects = tmp_path / "faces.json"
    rects.write_text(json.dumps([list(FACE_BOX)] * FRAMES))
    source = build_from_video(
        video, tiny_lipsync(tmp_path / "u.onnx"), None, tmp_path / "w", rects_file=rects
    )
    assert source.rects.tolist() == [EXPECTED_RECT] * len(source.frames)
    rects.write_text(json.dumps([list(FACE_BOX)] * 10))
    with pytest.raises(ImportFailedError, match=r"10 rects for 40 frames"):
        build_from_video(
            video, tiny_lipsync(tmp_path / "u.onnx"), None, tmp_path / "w3", rects_file=rects
        )


def test_clips_count_in_the_video_and_the_kept_segment_holds_them(
    demo: Path, tmp_path: Path
) -> None:
    video = person_video(demo, tmp_path / "person.mp4")
    rects = tmp_path / "faces.json"
    rects.write_text(json.dumps([list(FACE_BOX)] * FRAMES))
    lipsync = tiny_lipsync(tmp_path / "u.onnx")
    clips = [parse_clip("idle=10:20"), parse_clip("wave=1.2s:1.4s")]  # frames 30-34
    source = build_from_video(
        video,
        lipsync,
        demo / "audio_encoder.onnx",
        tmp_path / "w",
        rects_file=rects,
        min_seconds=0.4,
        clips=clips,
    )
    first = int(source.frames[0].stem)
    assert first <= 10
    assert int(source.frames[-1].stem) >= 34
    assert source.clips == {"idle": (10 - first, 20 - first), "wave": (30 - first, 35 - first)}
    assert any(note.startswith("clips, in the kept frames: idle") for note in source.notes)
    report = write_package(source, tmp_path / "avatars", "person")
    manifest = json.loads((report.path / "avatar.json").read_text())
    assert manifest["clips"] == {name: list(span) for name, span in source.clips.items()}
    with pytest.raises(ImportFailedError, match=r"--clip 'wave=38:45': frames \[38, 45\) are past"):
        build_from_video(
            video,
            lipsync,
            None,
            tmp_path / "w2",
            rects_file=rects,
            clips=[parse_clip("wave=38:45")],
        )


def test_bad_detectors_and_videos_are_refused_by_name(tmp_path: Path) -> None:
    not_scrfd = tiny_lipsync(tmp_path / "not_a_detector.onnx")
    video = tmp_path / "broken.mp4"
    video.write_bytes(b"not a video" * 100)
    with pytest.raises(ImportFailedError, match=r"not_a_detector\.onnx: outputs .* SCRFD-style"):
        build_from_video(video, not_scrfd, None, tmp_path / "w", detector=not_scrfd)
    detector = scrfd_like_detector(tmp_path / "scrfd.onnx")
    with pytest.raises(ImportFailedError, match=r"broken\.mp4: not a readable video"):
        build_from_video(video, not_scrfd, None, tmp_path / "w", detector=detector)
    with pytest.raises(ImportFailedError, match="exactly one of --face-detector and --rects"):
        build_from_video(video, not_scrfd, None, tmp_path / "w")


def test_prepare_synctalk_writes_its_training_inputs(demo: Path, tmp_path: Path) -> None:
    video = person_video(demo, tmp_path / "person.mp4")
    clip, wav = prepare_synctalk(video, tmp_path / "dataset" / "may", "may")
    assert clip == tmp_path / "dataset" / "may" / "may.mp4"
    with av.open(str(clip)) as container:
        stream = container.streams.video[0]
        assert stream.average_rate == 25
        assert sum(1 for _ in container.decode(video=0)) == FRAMES
    with wave.open(str(wav)) as w:
        assert (w.getframerate(), w.getnchannels()) == (16000, 1)
        assert abs(w.getnframes() - 16000 * FRAMES / 25) < 2048


def test_the_cli_builds_from_a_video(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    video = person_video(demo, tmp_path / "Person.mp4")
    config = tmp_path / "lipstream.yaml"
    root = tmp_path / "avatars"
    config.write_text(f"avatars:\n  root: {root}\n  demo: false\n")
    argv = ["--config", str(config), "avatar", "build", "--video", str(video)]
    detector = ["--face-detector", str(scrfd_like_detector(tmp_path / "d.onnx"))]
    models = ["--lipsync", str(tiny_lipsync(tmp_path / "u.onnx"))]
    models += ["--audio-encoder", str(demo / "audio_encoder.onnx")]
    assert main([*argv, *detector, *models, "--min-seconds", "1"]) == 0
    out = capsys.readouterr().out
    assert "imported person from video" in out
    assert "note: kept frames" in out
    assert sorted(p.name for p in root.iterdir()) == ["person"]  # no work dirs left
    assert main([*argv, "--prepare-synctalk", str(tmp_path / "st")]) == 0
    assert (tmp_path / "st" / "person.mp4").is_file()
    assert main([*argv, *detector]) == 2  # no model and nothing to prepare
    assert "needs --lipsync" in capsys.readouterr().err
