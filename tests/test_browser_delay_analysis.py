"""benchmarks/browser_delay.py: bursts are found and matched to their own echo."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.browser_delay import BLOCK, burst_delays_ms, onsets

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
