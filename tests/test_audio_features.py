"""Per-frame audio features: streaming equals offline, lookahead as documented, real ONNX."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compositor.sequencer import FrameSequencer
from inference_core.exceptions import ModelInputError, ModelLoadError
from inference_core.features.encoder import AudioEncoder
from inference_core.features.mel import melspectrogram
from inference_core.features.stream import (
    NO_FEATURES,
    SILENCE_DB,
    AudioFeatureStream,
    FrameAudio,
    offline_features,
)
from inference_core.features.timing import lookahead_ms

Speech = tuple[np.ndarray, list[tuple[float, float]]]
SR = 16000
FPS = 25


def save_model(path: Path, graph: onnx.GraphProto) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def linear_encoder(
    path: Path,
    *,
    batch: int | str = "batch",
    in_shape: tuple[int, ...] = (1, 80, 16),
    input_name: str = "audio_features",
) -> Path:
    """A random linear layer [B,1,80,16] → [B,512], the shape of the AVE encoder."""
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((int(np.prod(in_shape)), 512)) * 0.01).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", [input_name], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "w"], ["features"]),
        ],
        "linear_encoder",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch, *in_shape])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [batch, 512])],
        [numpy_helper.from_array(weights, "w")],
    )
    return save_model(path, graph)


def sum_encoder(path: Path) -> Path:
    """Writes each window's sum into all 512 slots, so rows can be traced back."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["mel", "axes"], ["total"], keepdims=1),
            helper.make_node("Reshape", ["total", "col"], ["total2d"]),
            helper.make_node("Mul", ["total2d", "ones"], ["features"]),
        ],
        "sum_encoder",
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["n", 1, 80, 16])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n", 512])],
        [
            numpy_helper.from_array(np.array([1, 2, 3], dtype=np.int64), "axes"),
            numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), "col"),
            numpy_helper.from_array(np.ones((1, 512), dtype=np.float32), "ones"),
        ],
    )
    return save_model(path, graph)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("encoders")
    return {
        "dynamic": linear_encoder(tmp / "dynamic.onnx"),
        "static1": linear_encoder(tmp / "static1.onnx", batch=1, input_name="input"),
        "sum": sum_encoder(tmp / "sum.onnx"),
    }


@pytest.fixture(scope="module")
def encoder(models: dict[str, Path]) -> AudioEncoder:
    return AudioEncoder.from_path(models["dynamic"])


def push_chunks(stream: AudioFeatureStream, samples: np.ndarray, size: int) -> list[FrameAudio]:
    frames: list[FrameAudio] = []
    for start in range(0, len(samples), size):
        frames += stream.push(samples[start : start + size])
    return frames + stream.flush()


def assert_same_frames(got: list[FrameAudio], want: list[FrameAudio]) -> None:
    assert [f.index for f in got] == [f.index for f in want]
    assert [f.level_db for f in got] == [f.level_db for f in want]
    for a, b in zip(got, want, strict=True):
        assert a.features.dtype == np.float32
        assert a.features.shape == b.features.shape
        # onnxruntime may pick a different GEMM kernel per batch size: allow its rounding.
        np.testing.assert_allclose(a.features, b.features, rtol=0, atol=1e-6)


def direct_ave(samples: np.ndarray, encode: AudioEncoder, right_context: int = 7) -> np.ndarray:
    """docs/design/model.md §3 written out the obvious way, whole signal at once: ``[F,16,512]``."""
    mel = melspectrogram(samples)
    n_windows = int((len(mel) - 16) / 3.2) + 2
    windows = []
    for m in range(n_windows):
        start = int(80.0 * m / FPS)
        window = mel[start : start + 16] if start + 16 <= len(mel) else mel[-16:]
        windows.append(window.T[np.newaxis])
    feats = encode.encode(np.stack(windows))
    extended = np.concatenate((feats[:1], feats, feats[-1:]))
    n_frames = int(np.ceil(len(samples) * FPS / SR))
    out = np.zeros((n_frames, 16, 512), dtype=np.float32)
    for i in range(n_frames):
        for k in range(16):
            j = i - 8 + k
            if 0 <= j < len(extended) and j <= i + right_context:
                out[i, k] = extended[j]
    return out


def test_streamed_20ms_chunks_equal_offline(speech_16k: Speech, encoder: AudioEncoder) -> None:
    samples, _ = speech_16k
    offline = offline_features(samples, encoder)
    streamed = push_chunks(AudioFeatureStream(encoder), samples, 320)
    assert len(offline) == -(-len(samples) * FPS // SR)
    assert offline[0].features.shape == (32, 16, 16)
    assert_same_frames(streamed, offline)


@pytest.mark.parametrize(("kind", "right_context"), [("ave", 3), ("ave", 0), ("mel", 7)])
def test_random_chunks_equal_offline(
    speech_16k: Speech, encoder: AudioEncoder, kind: str, right_context: int
) -> None:
    samples, _ = speech_16k
    rng = np.random.default_rng(right_context)
    enc = encoder if kind == "ave" else None
    offline = offline_features(samples, enc, kind=kind, right_context=right_context)  # type: ignore[arg-type]
    stream = AudioFeatureStream(enc, kind=kind, right_context=right_context)  # type: ignore[arg-type]
    streamed: list[FrameAudio] = []
    start = 0
    while start < len(samples):
        size = int(rng.integers(1, 3000))
        streamed += stream.push(samples[start : start + size])
        start += size
    streamed += stream.flush()
    assert_same_frames(streamed, offline)


@pytest.mark.parametrize("kind", ["ave", "mel"])
@pytest.mark.parametrize("n", [1, 100, 639, 640, 641, 1999, 3399, 3400, 5000, 12345])
def test_total_frames_is_ceil_of_duration(encoder: AudioEncoder, kind: str, n: int) -> None:
    samples = (np.random.default_rng(n).standard_normal(n) * 0.1).astype(np.float32)
    enc = encoder if kind == "ave" else None
    stream = AudioFeatureStream(enc, kind=kind)  # type: ignore[arg-type]
    frames = push_chunks(stream, samples, 320)
    assert [f.index for f in frames] == list(range(stream.frames_for_samples(n)))
    assert len(frames) == int(np.ceil(n * FPS / SR))
    assert all(np.isfinite(f.features).all() for f in frames)
    assert_same_frames(frames, offline_features(samples, enc, kind=kind))  # type: ignore[arg-type]


def test_empty_stream_emits_nothing(encoder: AudioEncoder) -> None:
    stream = AudioFeatureStream(encoder)
    assert stream.push(np.zeros(0, dtype=np.float32)) == []
    assert stream.flush() == []


def samples_needed(i: int, right_context: int) -> int:
    """Independent statement of the rule: frame i's last row is window i+R−1's encoding."""
    window = max(i + right_context - 1, 0)
    last_mel = int(80 * window / FPS) + 15
    return max(200 * last_mel + 400, 640 * i + 320)


@pytest.mark.parametrize("right_context", [7, 3, 0])
def test_frames_arrive_with_the_documented_lookahead(
    speech_16k: Speech, encoder: AudioEncoder, right_context: int
) -> None:
    samples, _ = speech_16k
    stream = AudioFeatureStream(encoder, right_context=right_context)
    lookahead_s = stream.lookahead_ms / 1000.0
    emitted = 0
    for k in range(320, len(samples) + 1, 320):
        emitted += len(stream.push(samples[k - 320 : k]))
        due = [i for i in range(200) if i / FPS + lookahead_s <= k / SR + 1e-9]
        assert emitted >= len(due), f"after {k} samples frame {emitted} is late"
        assert all(samples_needed(i, right_context) <= k for i in range(emitted)), (
            f"after {k} samples frame {emitted - 1} came out before its audio"
        )
        # Frame-exact: the next frame is held back only because its audio is missing.
        assert samples_needed(emitted, right_context) > k


def test_lookahead_figures() -> None:
    figures = [lookahead_ms(r) for r in range(8)]
    assert 450.0 <= figures[7] <= 465.0
    for r in range(2, 8):
        assert figures[r] - figures[r - 1] == pytest.approx(40.0)
    # Frame 0's own row is window 0, so R=0 waits as long as R=1 (212.5 ms).
    assert figures[0] == figures[1] == pytest.approx(212.5)
    assert lookahead_ms(7, kind="mel") == pytest.approx(212.5)
    stream = AudioFeatureStream(None, kind="mel")
    assert stream.lookahead_ms == lookahead_ms(0, kind="mel")


def test_right_context_3_zeroes_future_rows_and_emits_sooner(
    speech_16k: Speech, encoder: AudioEncoder
) -> None:
    samples, _ = speech_16k
    full = AudioFeatureStream(encoder, right_context=7)
    short = AudioFeatureStream(encoder, right_context=3)
    full_count = short_count = 0
    ahead = False
    for start in range(0, len(samples), 320):
        chunk = samples[start : start + 320]
        full_count += len(full.push(chunk))
        short_count += len(short.push(chunk))
        assert short_count >= full_count
        ahead = ahead or short_count > full_count
    assert ahead
    assert short.lookahead_ms == pytest.approx(full.lookahead_ms - 160.0)
    full.flush()
    short.flush()
    r7 = offline_features(samples, encoder, right_context=7)
    r3 = offline_features(samples, encoder, right_context=3)
    for a, b in zip(r3, r7, strict=True):
        view_a, view_b = a.features.reshape(16, 512), b.features.reshape(16, 512)
        assert not view_a[12:].any()
        np.testing.assert_array_equal(view_a[:12], view_b[:12])
    assert any(b.features.reshape(16, 512)[12:].any() for b in r7)


def test_rows_follow_the_design_layout(speech_16k: Speech, models: dict[str, Path]) -> None:
    samples, _ = speech_16k
    summing = AudioEncoder.from_path(models["sum"])
    frames = offline_features(samples, summing)
    want = direct_ave(samples, summing)
    got = np.stack([f.features.reshape(16, 512) for f in frames])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-3)
    # Row 8 of frame i is extended row i: frame 0 row 8 repeats window 0, frame 1 row 8 is
    # window 0 itself, frame 2 row 8 is window 1.
    mel = melspectrogram(samples)
    window_sum = [float(mel[int(3.2 * m) : int(3.2 * m) + 16].sum()) for m in range(2)]
    assert got[0, 8, 0] == pytest.approx(window_sum[0], rel=1e-5)
    assert got[1, 8, 0] == pytest.approx(window_sum[0], rel=1e-5)
    assert got[2, 8, 0] == pytest.approx(window_sum[1], rel=1e-5)
    assert not got[0, :8].any()  # rows before the start are zero
    # [32,16,16] is the 16×512 view read row-major.
    np.testing.assert_array_equal(frames[5].features.reshape(-1), got[5].reshape(-1))


def test_level_db_follows_speech_and_pauses(speech_16k: Speech, encoder: AudioEncoder) -> None:
    samples, spans = speech_16k
    frames = offline_features(samples, encoder)
    times = np.array([f.index / FPS for f in frames])
    levels = np.array([f.level_db for f in frames])
    in_speech = np.zeros(len(frames), dtype=bool)
    near_speech = np.zeros(len(frames), dtype=bool)
    for start, end in spans:
        in_speech |= (times >= start + 0.05) & (times <= end - 0.05)
        near_speech |= (times >= start - 0.1) & (times <= end + 0.1)
    assert in_speech.sum() > 20
    assert np.median(levels[in_speech]) > -35.0
    assert (~near_speech).sum() > 20
    assert levels[~near_speech].max() <= -60.0
    assert SILENCE_DB in levels[~near_speech]


def test_int16_input_equals_float(speech_16k: Speech, encoder: AudioEncoder) -> None:
    samples, _ = speech_16k
    pcm16 = np.round(np.clip(samples, -1, 1) * 32767).astype(np.int16)
    from_int = push_chunks(AudioFeatureStream(encoder), pcm16, 320)
    from_float = offline_features(pcm16.astype(np.float32) / 32768.0, encoder)
    assert_same_frames(from_int, from_float)


def test_rejects_unusable_pcm(encoder: AudioEncoder) -> None:
    stream = AudioFeatureStream(encoder)
    with pytest.raises(ModelInputError, match="mono"):
        stream.push(np.zeros((320, 2), dtype=np.float32))
    with pytest.raises(ModelInputError, match="int16"):
        stream.push(np.zeros(320, dtype=np.int32))


def test_reset_drops_pending_audio(speech_16k: Speech, encoder: AudioEncoder) -> None:
    samples, _ = speech_16k
    stream = AudioFeatureStream(encoder)
    assert stream.push(samples[:20000])
    stream.reset()
    assert stream.frames_emitted == 0
    assert stream.memory_bytes == 0
    assert_same_frames(push_chunks(stream, samples, 640), offline_features(samples, encoder))


def test_memory_stays_bounded(encoder: AudioEncoder) -> None:
    rng = np.random.default_rng(3)
    samples = (rng.standard_normal(SR * 60) * 0.1).astype(np.float32)
    stream = AudioFeatureStream(encoder)
    sizes = []
    for start in range(0, len(samples), 320):
        stream.push(samples[start : start + 320])
        sizes.append(stream.memory_bytes)
    # About 0.5 s of samples, 40 mel frames and 16 feature rows, however long the stream.
    assert max(sizes) < 120_000
    assert max(sizes[-500:]) <= max(sizes[:500]) + 4096


def test_mel_kind_gives_clamped_mel_windows(speech_16k: Speech) -> None:
    samples, _ = speech_16k
    frames = push_chunks(AudioFeatureStream(None, kind="mel"), samples, 320)
    mel = melspectrogram(samples)
    assert len(frames) == int(np.ceil(len(samples) * FPS / SR))
    for frame in frames:
        start = int(80.0 * frame.index / FPS)
        window = mel[start : start + 16] if start + 16 <= len(mel) else mel[-16:]
        assert frame.features.shape == (1, 80, 16)
        np.testing.assert_array_equal(frame.features[0], window.T)


def test_static_batch_encoder_equals_dynamic(speech_16k: Speech, models: dict[str, Path]) -> None:
    samples, _ = speech_16k
    static = AudioEncoder.from_path(models["static1"])
    dynamic = AudioEncoder.from_path(models["dynamic"])
    assert static.static_batch == 1
    assert dynamic.static_batch is None
    assert_same_frames(offline_features(samples, static), offline_features(samples, dynamic))


def test_encoder_checks_its_input(encoder: AudioEncoder) -> None:
    out = encoder.encode(np.zeros((3, 1, 80, 16), dtype=np.float32))
    assert out.shape == (3, 512)
    assert out.dtype == np.float32
    with pytest.raises(ModelInputError, match=r"\[n,1,80,16\]"):
        encoder.encode(np.zeros((3, 80, 16), dtype=np.float32))


def test_wrong_input_shape_is_a_load_error(tmp_path: Path) -> None:
    path = linear_encoder(tmp_path / "wide.onnx", in_shape=(1, 80, 20))
    with pytest.raises(ModelLoadError, match=r"\[\?,1,80,20\].*expected.*\[B,1,80,16\]"):
        AudioEncoder.from_path(path)


def test_wrong_output_shape_is_a_load_error(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["mel"], ["flat"], axis=1)],
        "flatten_only",
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["n", 1, 80, 16])],
        [helper.make_tensor_value_info("flat", TensorProto.FLOAT, ["n", 1280])],
    )
    path = save_model(tmp_path / "flat.onnx", graph)
    with pytest.raises(ModelLoadError, match=r"\[\?,1280\].*expected an output \[B,512\]"):
        AudioEncoder.from_path(path)


def test_corrupt_or_missing_file_is_a_load_error(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"this is not a protobuf" * 10)
    with pytest.raises(ModelLoadError, match="cannot load audio encoder") as info:
        AudioEncoder.from_path(corrupt)
    assert str(corrupt) in str(info.value)
    assert info.value.__cause__ is not None
    missing = tmp_path / "missing.onnx"
    with pytest.raises(ModelLoadError, match="not found") as info:
        AudioEncoder.from_path(missing)
    assert str(missing) in str(info.value)


def test_encoder_wraps_an_existing_session(models: dict[str, Path]) -> None:
    session = ort.InferenceSession(str(models["static1"]), providers=["CPUExecutionProvider"])
    wrapped = AudioEncoder(session)
    windows = np.random.default_rng(1).standard_normal((3, 1, 80, 16)).astype(np.float32)
    np.testing.assert_allclose(
        wrapped.encode(windows),
        np.concatenate([session.run(None, {"input": w[np.newaxis]})[0] for w in windows]),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"right_context": 8}, r"right_context must be in 0\.\.7"),
        ({"right_context": -1}, r"right_context must be in 0\.\.7"),
        ({"fps": 0}, "fps must be a positive integer"),
        ({"kind": "wav2vec"}, "kind must be 'ave' or 'mel'"),
        ({"sample_rate": 48000}, "sample_rate must be 16000"),
    ],
)
def test_invalid_arguments(encoder: AudioEncoder, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AudioFeatureStream(encoder, **kwargs)  # type: ignore[arg-type]


def test_ave_needs_an_encoder() -> None:
    with pytest.raises(ValueError, match="needs an AudioEncoder"):
        AudioFeatureStream(None)
    with pytest.raises(ValueError, match=r"right_context must be in 0\.\.7"):
        lookahead_ms(9)


class CountingEncoder(AudioEncoder):
    """Counts the windows that go through the ONNX model."""

    windows = 0

    def encode(self, windows: npt.ArrayLike) -> np.ndarray:
        batch = np.asarray(windows)
        self.windows += len(batch)
        return super().encode(batch)


class SequencerGate:
    """A FrameGate over the live speech gate, as the timeline's: records what it decided."""

    def __init__(self, *, hangover: int = 4, blend: int = 3, also: set[int] | None = None) -> None:
        self.sequencer = FrameSequencer(10, hangover_frames=hangover, blend_frames=blend)
        self.threshold_db = self.sequencer.threshold_db
        self.frames_after = hangover + blend
        self.also = also or set()  # frames inferred whatever their level
        self.inferred: list[int] = []

    def infer(self, index: int, level_db: float) -> bool:
        infer = self.sequencer.step(level_db).infer or index in self.also
        if infer:
            self.inferred.append(index)
        return infer


def quiet_noise(seconds: float, seed: int = 0) -> np.ndarray:
    """Room noise at about −70 dBFS: not digital silence, far below the speech gate."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(round(seconds * SR)) * 3e-4).astype(np.float32)


def gated_and_ungated(
    samples: np.ndarray, encoder_path: Path, gate: SequencerGate
) -> tuple[list[FrameAudio], list[FrameAudio], CountingEncoder, AudioFeatureStream]:
    counting = CountingEncoder.from_path(encoder_path)
    assert isinstance(counting, CountingEncoder)
    gated = AudioFeatureStream(counting)
    ungated = AudioFeatureStream(AudioEncoder.from_path(encoder_path))
    got: list[FrameAudio] = []
    want: list[FrameAudio] = []
    for start in range(0, len(samples), 320):
        got += gated.push(samples[start : start + 320], gate)
        want += ungated.push(samples[start : start + 320])
    return got, want, counting, gated


def test_a_gated_stream_encodes_only_what_inferred_frames_use(
    speech_16k: Speech, models: dict[str, Path]
) -> None:
    speech, _ = speech_16k
    silent_s = 8.0
    samples = np.concatenate((quiet_noise(silent_s), speech, quiet_noise(4.0, seed=1)))
    gate = SequencerGate()
    got, want, counting, stream = gated_and_ungated(samples, models["dynamic"], gate)
    assert [f.index for f in got] == [f.index for f in want]
    assert [f.level_db for f in got] == [f.level_db for f in want]
    silent_frames = int(silent_s * FPS) - 12  # well before the speech's first window
    assert gate.inferred
    assert min(gate.inferred) > silent_frames
    # Bit for bit what the ungated stream gives, for every frame the gate inferred.
    for a, b in zip(got, want, strict=True):
        if a.index in gate.inferred:
            assert a.features.shape == (32, 16, 16)
            np.testing.assert_array_equal(a.features, b.features)
        else:
            assert a.features is NO_FEATURES
    # Not one window for the long stretch before the speech, nor for the one after it.
    first_window = min(gate.inferred) - 9
    last_window = max(gate.inferred) + 6
    assert counting.windows == stream.windows_encoded
    assert counting.windows <= (last_window - first_window + 1) + 2 * len(gate.inferred)
    assert counting.windows < len(want) / 2


def test_windows_of_a_loud_frame_are_encoded_before_it_is_inferred(
    speech_16k: Speech, models: dict[str, Path]
) -> None:
    """The first frame of speech finds its context encoded (its latency is unchanged):
    only the windows that became ready in its own push are encoded when it comes out."""
    speech, _ = speech_16k
    samples = np.concatenate((quiet_noise(3.0), speech))
    gate = SequencerGate()
    counting = CountingEncoder.from_path(models["dynamic"])
    assert isinstance(counting, CountingEncoder)
    stream = AudioFeatureStream(counting)
    ungated = AudioFeatureStream(AudioEncoder.from_path(models["dynamic"]))
    for start in range(0, len(samples), 320):
        chunk = samples[start : start + 320]
        before = counting.windows
        frames = stream.push(chunk, gate)
        ungated_frames = ungated.push(chunk)
        if gate.inferred and frames and frames[0].index <= gate.inferred[0]:
            # Pushes emitting the first inferred frame encode no more than ungated ones do.
            assert counting.windows - before <= 2
            for a, b in zip(frames, ungated_frames, strict=True):
                if a.features is not NO_FEATURES:
                    np.testing.assert_array_equal(a.features, b.features)
            break
    else:
        pytest.fail("no frame was inferred")


def test_a_frame_inferred_outside_loud_audio_still_gets_its_features(
    models: dict[str, Path],
) -> None:
    samples = quiet_noise(4.0)
    gate = SequencerGate(also={30, 31, 77})
    got, want, counting, _ = gated_and_ungated(samples, models["dynamic"], gate)
    assert gate.inferred == [30, 31, 77]
    for index in gate.inferred:
        np.testing.assert_array_equal(got[index].features, want[index].features)
    assert counting.windows < 3 * 16
    assert all(f.features is NO_FEATURES for f in got if f.index not in gate.inferred)
