"""Offline render of the demo avatar: length, streams, and lips that move only with speech."""

from __future__ import annotations

import math
from pathlib import Path

import av
import numpy as np
import pytest

from config.settings import AvatarsSettings
from inference_core.assets.builtin import avatar_locator
from inference_core.avatars.package import AvatarPackage
from streaming.offline.render import RenderOptions, render_file
from tests.media import write_wav

FPS = 25


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> AvatarPackage:
    data = tmp_path_factory.mktemp("data")
    return avatar_locator(AvatarsSettings(root=data / "no-root", data_dir=data)).load("demo")


def _decode(path: Path) -> tuple[list[np.ndarray], float, float]:
    """Video frames as BGR, the video duration and the audio duration (s)."""
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        audio = container.streams.audio[0]
        assert video.codec_context.name == "h264"
        assert audio.codec_context.name == "aac"
        frames = [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]
        assert video.duration is not None
        assert audio.duration is not None
        video_s = float(video.duration * video.time_base)
        audio_s = float(audio.duration * audio.time_base)
    return frames, video_s, audio_s


def _mouth_box(package: AvatarPackage, avatar_index: int) -> tuple[slice, slice]:
    """The part of the crop rect where the demo model draws the mouth."""
    x1, y1, x2, _ = (int(v) for v in package.rects[avatar_index])
    side = x2 - x1
    cx, cy = x1 + side // 2, y1 + int(0.42 * side)
    return slice(cy - side // 8, cy + side // 8), slice(cx - side // 5, cx + side // 5)


def _bounce(n: int, count: int) -> int:
    period = 2 * (count - 1)
    m = n % period
    return m if m < count else period - m


def test_speech_render_has_right_length_and_lips_move_only_with_speech(
    demo: AvatarPackage,
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
    tmp_path: Path,
) -> None:
    pcm, spans = speech_16k
    # Hand the renderer stereo 44.1 kHz to exercise resampling and down-mixing.
    t_in = np.arange(round(len(pcm) * 44_100 / 16_000)) * (16_000 / 44_100)
    pcm_44k = np.interp(t_in, np.arange(len(pcm)), pcm).astype(np.float32)
    stereo = np.stack([pcm_44k, pcm_44k], axis=1).reshape(-1)
    speech_wav = write_wav(tmp_path / "speech.wav", stereo, 44_100, channels=2)
    silent_wav = write_wav(tmp_path / "silence.wav", np.zeros_like(pcm), 16_000)
    options = RenderOptions(crf=0)  # lossless, so silent frames must match exactly

    speech = render_file(demo, speech_wav, tmp_path / "speech.mp4", options)
    silent = render_file(demo, silent_wav, tmp_path / "silence.mp4", options)

    duration = len(pcm) / 16_000
    expected_frames = math.ceil(duration * FPS)
    speech_frames, video_s, audio_s = _decode(speech.path)
    silent_frames, _, _ = _decode(silent.path)
    assert speech.frames == expected_frames
    assert len(speech_frames) == expected_frames
    assert len(silent_frames) == expected_frames
    assert abs(video_s - duration) <= 1 / FPS
    assert abs(audio_s - duration) <= 0.05
    assert silent.inferred_frames == 0  # silence never runs the model
    assert 0 < speech.inferred_frames < expected_frames

    # Frame i shows time i/25. Allow the hangover + blend after speech and a little before.
    margin_before, margin_after = 3, options.hangover_frames + options.blend_frames + 3
    speaking = np.zeros(expected_frames, dtype=bool)
    near = np.zeros(expected_frames, dtype=bool)
    for start, end in spans:
        a, b = math.floor(start * FPS), math.ceil(end * FPS)
        speaking[a:b] = True
        near[max(0, a - margin_before) : b + margin_after] = True

    diffs = []
    for i in range(expected_frames):
        rows, cols = _mouth_box(demo, _bounce(i, demo.frame_count))
        a = speech_frames[i][rows, cols].astype(np.int16)
        b = silent_frames[i][rows, cols].astype(np.int16)
        diffs.append(float(np.abs(a - b).mean()))
    diff = np.array(diffs)
    quiet = ~near
    assert quiet.sum() >= 20  # the test really looks at pauses
    assert diff[quiet].max() < 0.05, f"mouth moved in silence: {diff[quiet].round(1)}"
    moving = diff[speaking] > 6.0
    assert moving.mean() > 0.6, f"mouth still during speech: {diff[speaking].round(1)}"

    # Away from the face, speech and silence renders are the same picture.
    corner = (slice(0, 120), slice(0, 200))
    for i in range(0, expected_frames, 10):
        a, b = speech_frames[i][corner].astype(np.int16), silent_frames[i][corner]
        assert np.abs(a - b).mean() < 1.5


def test_render_accepts_short_and_odd_rate_audio(demo: AvatarPackage, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    noise = (rng.normal(0, 0.2, 8_000 * 7 // 10)).astype(np.float32)  # 0.7 s at 8 kHz
    wav = write_wav(tmp_path / "short.wav", noise, 8_000)
    result = render_file(demo, wav, tmp_path / "short.mp4", RenderOptions(max_batch_size=3))
    frames, video_s, _ = _decode(result.path)
    assert abs(video_s - 0.7) <= 1 / FPS
    assert len(frames) == math.ceil(0.7 * FPS) == result.frames
    assert result.inferred_frames > 0  # loud noise counts as sound
    assert not list(tmp_path.glob(".*partial*"))  # no temporary file left behind
