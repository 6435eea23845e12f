"""Frame sequencing: bounce order, speech gate with hangover, alpha ramps."""

from __future__ import annotations

import math

import pytest

from compositor.sequencer import FrameSequencer, FrameStep, bounce_index

LOUD, QUIET = -20.0, -70.0


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, [0, 0, 0, 0, 0]),
        (2, [0, 1, 0, 1, 0, 1]),
        (5, [0, 1, 2, 3, 4, 3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1, 0]),
    ],
)
def test_bounce_index_pattern(count: int, expected: list[int]) -> None:
    assert [bounce_index(n, count) for n in range(len(expected))] == expected


def test_bounce_index_rejects_empty_avatar() -> None:
    with pytest.raises(ValueError, match="count"):
        bounce_index(3, 0)


def _alphas(seq: FrameSequencer, levels: list[float]) -> list[float]:
    return [seq.step(level).alpha for level in levels]


def test_silence_never_infers_and_walks_the_bounce() -> None:
    seq = FrameSequencer(3)
    steps = [seq.step(QUIET) for _ in range(6)]
    assert [s.output_index for s in steps] == [0, 1, 2, 3, 4, 5]
    assert [s.avatar_index for s in steps] == [0, 1, 2, 1, 0, 1]
    assert all(s.alpha == 0.0 and not s.infer for s in steps)


def test_speech_onset_ramps_up_over_blend_frames() -> None:
    seq = FrameSequencer(10, threshold_db=-45.0, hangover_frames=0, blend_frames=3)
    alphas = _alphas(seq, [QUIET, LOUD, LOUD, LOUD, LOUD])
    assert alphas == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0, 1.0])
    step = seq.step(LOUD)
    assert step.infer
    assert step.alpha == 1.0


def test_threshold_is_inclusive() -> None:
    seq = FrameSequencer(10, threshold_db=-45.0, blend_frames=0)
    assert seq.step(-45.0).alpha == 1.0
    assert FrameSequencer(10, threshold_db=-45.0, blend_frames=0).step(-45.01).alpha == 0.0


def test_hangover_keeps_speaking_then_ramps_down() -> None:
    seq = FrameSequencer(10, hangover_frames=4, blend_frames=2)
    alphas = _alphas(seq, [LOUD, LOUD] + [QUIET] * 7)
    # Ramp up, four hangover frames at full strength, then down over two frames.
    assert alphas == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 0.0])


def test_pause_shorter_than_hangover_does_not_flicker() -> None:
    seq = FrameSequencer(10, hangover_frames=3, blend_frames=0)
    alphas = _alphas(seq, [LOUD, QUIET, QUIET, QUIET, LOUD, QUIET, QUIET])
    assert alphas == [1.0] * 7


def test_blend_zero_switches_instantly() -> None:
    seq = FrameSequencer(10, hangover_frames=0, blend_frames=0)
    assert _alphas(seq, [QUIET, LOUD, QUIET, LOUD]) == [0.0, 1.0, 0.0, 1.0]


def test_reset_goes_idle_and_keeps_bounce_position() -> None:
    seq = FrameSequencer(4, hangover_frames=10, blend_frames=2)
    for _ in range(5):
        seq.step(LOUD)
    assert seq.output_index == 5
    seq.reset()
    step = seq.idle()
    assert step == FrameStep(output_index=5, avatar_index=bounce_index(5, 4), alpha=0.0)
    assert not step.infer
    assert seq.step(LOUD).alpha == 0.5  # speech after a reset ramps up again


def test_idle_is_silence_and_nan_level_is_silence() -> None:
    seq = FrameSequencer(10, hangover_frames=0, blend_frames=1)
    assert seq.step(LOUD).alpha == 1.0
    assert seq.idle().alpha == 0.0
    assert seq.step(math.nan).alpha == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"frame_count": 0},
        {"frame_count": 5, "hangover_frames": -1},
        {"frame_count": 5, "blend_frames": -1},
    ],
)
def test_invalid_settings_are_rejected(kwargs: dict[str, int]) -> None:
    frame_count = kwargs.pop("frame_count")
    with pytest.raises(ValueError, match="must be >= "):
        FrameSequencer(frame_count, **kwargs)
