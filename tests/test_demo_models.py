"""The stand-in models (demo_models) and the benchmark UNet, run in real onnxruntime sessions."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import shape_inference

from inference_core.assets.benchmark_model import DEFAULT_WIDTH, build_benchmark_unet, estimate_macs
from inference_core.assets.demo_models import (
    DEFAULT_MOUTH_CENTER,
    build_audio_encoder,
    build_lipsync_model,
    loudness_basis,
)
from inference_core.features.mel import melspectrogram

FPS = 25
SAMPLE_RATE = 16_000
MOUTH_X = round(DEFAULT_MOUTH_CENTER[0] * 320)
MOUTH_Y = round(DEFAULT_MOUTH_CENTER[1] * 320)
# Mouth box: half-width 0.16*320 ≈ 51 px, max half-height 32 px plus lips.
MOUTH_BOX = (slice(MOUTH_Y - 40, MOUTH_Y + 41), slice(MOUTH_X - 56, MOUTH_X + 57))


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    return _session(build_audio_encoder(tmp_path_factory.mktemp("enc") / "audio_encoder.onnx"))


@pytest.fixture(scope="module")
def lipsync(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    return _session(build_lipsync_model(tmp_path_factory.mktemp("lip") / "lipsync.onnx"))


def _reference(batch: int, seed: int = 3) -> np.ndarray:
    """A textured reference crop (and its masked copy) in [0, 1]."""
    rng = np.random.default_rng(seed)
    ref = rng.uniform(0.0, 1.0, (batch, 3, 320, 320)).astype(np.float32)
    masked = ref.copy()
    masked[:, :, 5:310, 5:315] = 0.0
    return np.concatenate([ref, masked], axis=1)


def _mel_windows(mel: np.ndarray) -> np.ndarray:
    """Per video frame the 80×16 mel window of docs/design/model.md §3, as ``[N, 1, 80, 16]``."""
    frames = int(len(mel) / 80 * FPS)
    starts = [min(int(3.2 * k), len(mel) - 16) for k in range(frames)]
    return np.stack([mel[s : s + 16].T for s in starts])[:, None].astype(np.float32)


def _audio_inputs(embeddings: np.ndarray) -> np.ndarray:
    """Frame i's ``[32, 16, 16]`` input: extended features i-8..i+7, zero outside."""
    extended = np.concatenate([embeddings[:1], embeddings, embeddings[-1:]])
    count = len(embeddings)
    out = np.zeros((count, 16, 512), dtype=np.float32)
    for i in range(count):
        for row in range(16):
            j = i + row - 8
            if 0 <= j < len(extended):
                out[i, row] = extended[j]
    return out.reshape(count, 32, 16, 16)


def _constant_loudness_audio(encoder: ort.InferenceSession, loudness: float) -> np.ndarray:
    """Audio input for a frame in the middle of a stretch of constant loudness."""
    mel = np.full((1, 1, 80, 16), 8.0 * loudness - 4.0, dtype=np.float32)
    embedding = encoder.run(None, {"mel": mel})[0][0]
    return np.tile(embedding, 16).reshape(1, 32, 16, 16)


def test_loudness_basis_is_orthonormal_and_stable() -> None:
    basis = loudness_basis()
    assert basis.shape == (16, 512)
    assert basis.dtype == np.float32
    np.testing.assert_allclose(basis @ basis.T, np.eye(16), atol=1e-5)
    assert np.array_equal(basis, loudness_basis())


def test_audio_encoder_loudness_is_recoverable(encoder: ort.InferenceSession) -> None:
    rng = np.random.default_rng(7)
    mel = rng.uniform(-4.0, 4.0, (5, 1, 80, 16)).astype(np.float32)
    [embedding] = encoder.run(None, {"mel": mel})
    assert embedding.shape == (5, 512)
    expected = (mel[:, 0].mean(axis=1) + 4.0) / 8.0
    np.testing.assert_allclose(embedding @ loudness_basis().T, expected, atol=1e-5)
    one_by_one = np.concatenate([encoder.run(None, {"mel": mel[i : i + 1]})[0] for i in range(5)])
    np.testing.assert_allclose(one_by_one, embedding, atol=1e-6)


def test_lipsync_io_and_dynamic_batch(lipsync: ort.InferenceSession) -> None:
    inputs = {i.name: i.shape for i in lipsync.get_inputs()}
    assert inputs == {"input": ["batch", 6, 320, 320], "audio": ["batch", 32, 16, 16]}
    [output] = lipsync.get_outputs()
    assert (output.name, output.shape) == ("output", ["batch", 3, 320, 320])
    for batch in (1, 3):
        audio = np.zeros((batch, 32, 16, 16), dtype=np.float32)
        [out] = lipsync.run(None, {"input": _reference(batch), "audio": audio})
        assert out.shape == (batch, 3, 320, 320)
        assert out.dtype == np.float32


def test_silent_audio_returns_the_reference(
    encoder: ort.InferenceSession, lipsync: ort.InferenceSession
) -> None:
    silent_mel = np.full((6, 1, 80, 16), -4.0, dtype=np.float32)
    audio = _audio_inputs(encoder.run(None, {"mel": silent_mel})[0])
    visual = _reference(6)
    [out] = lipsync.run(None, {"input": visual, "audio": audio})
    assert np.abs(out - visual[:, :3]).max() <= 1.0 / 255.0


def test_speech_opens_the_mouth_and_pauses_keep_it_closed(
    encoder: ort.InferenceSession,
    lipsync: ort.InferenceSession,
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
) -> None:
    pcm, spans = speech_16k
    windows = _mel_windows(melspectrogram(pcm))
    audio = _audio_inputs(encoder.run(None, {"mel": windows})[0])
    visual = _reference(1)
    diffs = []
    for i in range(len(audio)):
        [out] = lipsync.run(None, {"input": visual, "audio": audio[i : i + 1]})
        diffs.append(np.abs(out[0] - visual[0, :3]))
    times = np.arange(len(audio)) / FPS
    speaking = np.zeros(len(audio), dtype=bool)
    quiet = np.ones(len(audio), dtype=bool)
    for start, end in spans:
        speaking |= (times > start + 0.1) & (times < end - 0.1)
        # Row 8's window starts 40 ms early and the mel frames are 50 ms long.
        quiet &= ~((times > start - 0.25) & (times < end + 0.25))
    assert speaking.sum() >= 20
    assert quiet.sum() >= 20
    mouth_change = np.array([d[:, MOUTH_BOX[0], MOUTH_BOX[1]].mean() for d in diffs])
    assert (mouth_change[speaking] > 0.05).mean() >= 0.8
    assert max(float(diffs[i].max()) for i in np.flatnonzero(quiet)) <= 1.0 / 255.0
    outside = np.ones((320, 320), dtype=bool)
    outside[MOUTH_BOX] = False
    assert max(float(d[:, outside].max()) for d in diffs) <= 1.0 / 255.0


def test_mouth_change_grows_with_loudness(
    encoder: ort.InferenceSession, lipsync: ort.InferenceSession
) -> None:
    visual = _reference(1)
    changed = []
    for loudness in (0.0, 0.18, 0.23, 0.28, 0.33):
        audio = _constant_loudness_audio(encoder, loudness)
        [out] = lipsync.run(None, {"input": visual, "audio": audio})
        diff = np.abs(out[0] - visual[0, :3]).max(axis=0)
        changed.append(int((diff > 0.05).sum()))
    assert changed[0] == 0
    assert all(a < b for a, b in itertools.pairwise(changed)), changed
    # The opening at full loudness: a sizeable dark area, not a few pixels.
    assert changed[-1] > 3000


def test_lipsync_batch_equals_one_by_one(
    encoder: ort.InferenceSession, lipsync: ort.InferenceSession
) -> None:
    levels = (0.0, 0.2, 0.3, 0.5)
    audio = np.concatenate([_constant_loudness_audio(encoder, v) for v in levels])
    visual = _reference(len(levels), seed=11)
    [batched] = lipsync.run(None, {"input": visual, "audio": audio})
    for i in range(len(levels)):
        [single] = lipsync.run(None, {"input": visual[i : i + 1], "audio": audio[i : i + 1]})
        np.testing.assert_allclose(batched[i], single[0], atol=1e-6)
    assert not np.allclose(batched[0], batched[3], atol=0.05)


def test_output_stays_in_unit_range(
    encoder: ort.InferenceSession, lipsync: ort.InferenceSession
) -> None:
    visual = np.ones((1, 6, 320, 320), dtype=np.float32)
    [out] = lipsync.run(None, {"input": visual, "audio": _constant_loudness_audio(encoder, 1.0)})
    assert out.min() >= 0.0
    assert out.max() <= 1.0
    assert out.min() < 0.5  # the open mouth is drawn even on a white crop


def test_stand_in_models_are_byte_deterministic(tmp_path: Path) -> None:
    for build in (build_audio_encoder, build_lipsync_model):
        first = build(tmp_path / "a.onnx").read_bytes()
        second = build(tmp_path / "b.onnx").read_bytes()
        assert first == second


def test_lipsync_rejects_inverted_loudness_ramp(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="loudness_closed"):
        build_lipsync_model(tmp_path / "x.onnx", loudness_closed=0.4, loudness_open=0.2)


def _graph_conv_macs(path: Path) -> int:
    """MACs counted from the ONNX graph: weight shapes times inferred output sizes."""
    model = shape_inference.infer_shapes(onnx.load(str(path)), strict_mode=True)
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*model.graph.value_info, *model.graph.output]
    }
    total = 0
    for node in model.graph.node:
        if node.op_type == "Conv":
            cout, cin, kh, kw = weights[node.input[1]]
            _, channels, h, w = shapes[node.output[0]]
            assert channels == cout
            total += cout * cin * kh * kw * h * w
    return total


@pytest.mark.parametrize("width", [4, 7, DEFAULT_WIDTH])
def test_benchmark_mac_estimate_matches_graph(tmp_path: Path, width: int) -> None:
    path = build_benchmark_unet(tmp_path / "unet.onnx", width=width)
    assert _graph_conv_macs(path) == estimate_macs(width)


def test_benchmark_default_costs_about_4_9_gmac() -> None:
    assert abs(estimate_macs() / 4.9e9 - 1.0) <= 0.10
    assert estimate_macs(DEFAULT_WIDTH + 1) > estimate_macs(DEFAULT_WIDTH)


def test_benchmark_unet_runs_with_dynamic_batch(tmp_path: Path) -> None:
    session = _session(build_benchmark_unet(tmp_path / "unet.onnx", width=4))
    inputs = {i.name: i.shape for i in session.get_inputs()}
    assert inputs == {"input": ["batch", 6, 320, 320], "audio": ["batch", 32, 16, 16]}
    rng = np.random.default_rng(5)
    visual = rng.uniform(0, 1, (3, 6, 320, 320)).astype(np.float32)
    audio = rng.standard_normal((3, 32, 16, 16)).astype(np.float32)
    [batched] = session.run(None, {"input": visual, "audio": audio})
    assert batched.shape == (3, 3, 320, 320)
    assert batched.min() > 0.0
    assert batched.max() < 1.0
    [single] = session.run(None, {"input": visual[1:2], "audio": audio[1:2]})
    np.testing.assert_allclose(single[0], batched[1], atol=1e-5)
    # The audio path reaches the output.
    [muted] = session.run(None, {"input": visual[1:2], "audio": np.zeros_like(audio[1:2])})
    assert not np.allclose(muted, single, atol=1e-4)


def test_benchmark_unet_is_seeded(tmp_path: Path) -> None:
    a = build_benchmark_unet(tmp_path / "a.onnx", width=2, seed=1).read_bytes()
    b = build_benchmark_unet(tmp_path / "b.onnx", width=2, seed=1).read_bytes()
    c = build_benchmark_unet(tmp_path / "c.onnx", width=2, seed=2).read_bytes()
    assert a == b
    assert a != c
