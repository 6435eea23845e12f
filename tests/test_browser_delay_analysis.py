"""benchmarks/browser_delay.py: the analysis of what the page records, on synthetic signals.

No browser: bursts, echoes, mouth openness and clocks are made up here with known
onsets, delays and offsets, and each function must find them again.
"""

from __future__ import annotations

import json
import math
import wave
from pathlib import Path

import numpy as np
import pytest

from benchmarks.browser_delay import (
    BLOCK,
    BURST_S,
    ECHO_WINDOW_S,
    GAPS_S,
    RATE,
    Burst,
    av_offsets_ms,
    burst_delays_ms,
    context_to_perf_s,
    match_bursts,
    mouth_box,
    mouth_onsets,
    onsets,
    recovery_s,
    rising_edges,
    write_bursts,
)
from inference_core.assets.demo_avatar import draw_face_frames

STEP = BLOCK / 48_000


def energy_with_bursts(starts_s: list[float], seconds: float = 12.0) -> list[float]:
    values = np.full(int(seconds / STEP), 0.001)
    for start in starts_s:
        values[int(start / STEP) : int((start + 0.3) / STEP)] = 0.5
    return values.tolist()


def test_onsets_are_the_starts_of_bursts_after_quiet() -> None:
    found = onsets(energy_with_bursts([1.0, 2.5, 2.9, 5.0]), STEP)
    # 2.9 follows 2.5's burst with 0.1 s of quiet: the same sound, not a new onset.
    assert found == pytest.approx([1.0, 2.5, 5.0], abs=STEP)


def test_each_burst_is_matched_to_its_own_echo_not_an_earlier_sound() -> None:
    said = [1.0, 3.3, 5.0, 7.6]
    heard = [0.4] + [t + 0.62 for t in said]  # 0.4: a sound before any burst came back
    energy = {
        "mic": energy_with_bursts(said),
        "remote": energy_with_bursts(heard),
        "rate": 48_000,
        "block": BLOCK,
    }
    delays = burst_delays_ms(energy, configured_ms=532.5)
    assert delays == pytest.approx([620.0] * 4, abs=1000 * STEP)


def test_rising_edges_take_irregular_sample_times() -> None:
    times = [0.0, 0.05, 0.09, 0.16, 0.2, 0.27, 0.31, 0.5, 0.52, 0.61]
    values = [0, 0, 1, 1, 0, 0, 1, 0, 0, 1]
    # 0.31 comes 0.15 s after the last loud sample (0.16): too soon for a new onset.
    assert rising_edges(times, values, 0.5, quiet_s=0.2) == [0.09, 0.61]


def openness_track(
    onsets_s: list[float], seconds: float = 8.0, seed: int = 0
) -> tuple[list[float], list[float], list[float]]:
    """Darkness per presented frame: 40 ms frames shown on a 60 Hz display (some frames
    missed), a shut mouth around 6.7 with compression noise, and per burst a fade in
    over three frames to about 25 for four frames. Also returns when each opening
    was first shown."""
    rng = np.random.default_rng(seed)
    frame_times = np.arange(round(seconds / 0.04)) * 0.04
    shown = np.ceil(frame_times * 60 - 1e-6) / 60  # the next vsync
    keep = rng.random(len(shown)) > 0.08  # the page misses some frames
    values = 6.7 + rng.normal(0.0, 0.3, len(shown))
    firsts = [int(np.searchsorted(frame_times, onset - 1e-9)) for onset in onsets_s]
    for first in firsts:
        for k, level in enumerate((0.33, 0.67, 1.0, 1.0, 1.0, 1.0)):
            values[first + k] = 6.7 + level * 18.5
        keep[first] = True  # the onset frame itself is seen (a missed one is a test below)
    return shown[keep].tolist(), values[keep].tolist(), shown[firsts].tolist()


def test_mouth_onsets_are_the_first_presented_frames_of_an_opening() -> None:
    said = [0.5, 1.6, 2.3, 3.7, 4.4, 5.9, 6.6]
    times, values, first_shown = openness_track(said)
    assert mouth_onsets(times, values) == pytest.approx(first_shown, abs=1e-9)


def test_a_mouth_that_never_opens_has_no_onsets() -> None:
    rng = np.random.default_rng(1)
    times = np.arange(0.0, 5.0, 0.04).tolist()
    assert mouth_onsets(times, (6.7 + rng.normal(0.0, 0.3, len(times))).tolist()) == []
    assert mouth_onsets(times, [6.7] * len(times)) == []


def test_an_echo_outside_the_window_leaves_its_burst_lost() -> None:
    said = [1.0, 2.0, 3.0]
    # 2.0's echo would be at 2.6: 3.05 is too late for it and too soon for 3.0.
    heard = [1.6, 3.05, 3.65]
    bursts = match_bursts(said, heard, earliest_s=0.5125, window_s=0.4)
    assert [b.said_s for b in bursts] == said
    assert [b.delay_ms for b in bursts] == pytest.approx([600.0, None, 650.0])


def test_offsets_pair_each_sound_with_the_nearest_mouth_within_reach() -> None:
    sound = [1.0, 2.0, 3.0, 4.0]
    mouth = [1.03, 1.5, 1.98, 3.3, 4.19]
    # 3.0 has no mouth within 0.2 s; 4.0's is 190 ms late.
    assert av_offsets_ms(sound, mouth) == pytest.approx([30.0, -20.0, 190.0])


def bursts_every(start: float, delays: list[float | None], interval: float = 0.5) -> list[Burst]:
    return [Burst(start + i * interval, d) for i, d in enumerate(delays)]


def test_recovery_is_the_first_good_burst_after_the_last_bad_one() -> None:
    # Hog ends at 10.0; steady delay 600 ms. Said at 9.5, 10.0, 10.5, ... .
    bursts = bursts_every(9.5, [900, 800, None, 700, 640, 610, 590, 600])
    # Last bad: the 700 ms one (said 11.0); next: said 11.5 + 0.64 heard at 12.14.
    assert recovery_s(bursts, 10.0, 600.0, 50.0) == pytest.approx(2.14)


def test_recovery_without_a_bad_burst_is_the_first_one_heard_after_the_hog() -> None:
    bursts = bursts_every(9.0, [600, 610, 590, 600])
    # Said 9.0 heard 9.6 (before the hog ended), said 9.5 heard at 10.11.
    assert recovery_s(bursts, 10.0, 600.0, 50.0) == pytest.approx(0.11)


def test_recovery_that_never_comes_or_cannot_be_seen() -> None:
    assert recovery_s(bursts_every(10.0, [600, 600, 700]), 10.0, 600.0, 50.0) == math.inf
    assert recovery_s(bursts_every(10.0, [600, None]), 10.0, 600.0, 50.0) == math.inf
    assert recovery_s(bursts_every(5.0, [600]), 10.0, 600.0, 50.0) == math.inf


def test_audio_clock_steps_are_followed_between_output_timestamps() -> None:
    # The context clock stops for 0.2 s at context time 5 s (the audio thread was late).
    context = np.arange(0.0, 10.0, 0.2)
    perf_ms = 1000 * (context + 0.8 + np.where(context >= 5.0, 0.2, 0.0))
    clock = np.stack([context, perf_ms], axis=1)
    shift = context_to_perf_s(np.array([1.0, 4.0, 6.0, 9.9]), clock)
    assert shift == pytest.approx([0.8, 0.8, 1.0, 1.0])


def test_the_mouth_box_holds_the_demo_avatars_mouth_in_every_frame(tmp_path: Path) -> None:
    frames = list(draw_face_frames(count=40))
    (tmp_path / "rects.json").write_text(json.dumps([list(f.rect) for f in frames]))
    adapter = {"crop_size": 328, "crop_border": 4, "input_size": 320}
    (tmp_path / "avatar.json").write_text(json.dumps({"adapter": adapter}))
    x, y, w, h = mouth_box(tmp_path)
    for frame in frames:
        mx, my = frame.mouth
        side = frame.rect[2] - frame.rect[0]
        # The model's open mouth: ±0.16 × 320 of the crop wide, ±0.10 × 320 high.
        assert x <= mx - 0.156 * side
        assert mx + 0.156 * side <= x + w
        assert y <= my - 0.097 * side
        assert my + 0.097 * side <= y + h
    assert w * h < 200 * 140  # small enough to read at every presented frame


def test_the_bursts_are_further_apart_than_an_echo_window(tmp_path: Path) -> None:
    with wave.open(str(write_bursts(tmp_path / "bursts.wav"))) as wav:
        assert wav.getframerate() == RATE
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2") / 32768
    blocks = pcm[: len(pcm) // BLOCK * BLOCK].reshape(-1, BLOCK)
    found = onsets(np.sqrt((blocks**2).mean(axis=1)).tolist(), STEP, quiet_s=0.25)
    assert len(found) == len(GAPS_S)
    apart = np.diff(found)
    assert apart.min() > ECHO_WINDOW_S + 0.02
    # Onset to onset is the gap plus the burst before it.
    assert apart == pytest.approx(np.asarray(GAPS_S[1:]) + BURST_S, abs=2 * STEP)
