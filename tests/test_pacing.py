"""Track pacing on a hand-stepped clock: waiting for a slot, catching up, skipping."""

from __future__ import annotations

from typing import Any

import av
import numpy as np
import pytest

from streaming.audio_rates import AUDIO_CHUNK_S
from streaming.webrtc.pacing import CATCH_UP_S, SessionClock, Slot, next_slot, wait_for_slot
from streaming.webrtc.tracks import AvatarAudioTrack, AvatarVideoTrack, stamped

FPS = 25
FRAME_S = 1 / FPS
DELAY_S = 0.5
START = 1000.0


class ManualTime:
    """A clock that moves only when the code under test sleeps, or the test moves it."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _clock(time: ManualTime) -> SessionClock:
    return SessionClock(DELAY_S, clock=time.clock, sleep=time.sleep)


# -- the decision -----------------------------------------------------------------------


def test_an_early_slot_waits_until_it_is_due() -> None:
    assert next_slot(now=10.0, due=10.03, index=7, period_s=FRAME_S) == Slot(
        7, 0, pytest.approx(0.03)
    )


def test_a_slot_up_to_catch_up_late_is_sent_at_once() -> None:
    assert next_slot(now=10.0, due=10.0, index=7, period_s=FRAME_S) == Slot(7, 0, 0.0)
    assert next_slot(now=10.0 + CATCH_UP_S, due=10.0, index=7, period_s=FRAME_S) == Slot(7, 0, 0.0)


def test_a_slot_later_than_that_skips_to_the_current_one() -> None:
    late = next_slot(now=10.25, due=10.0, index=7, period_s=FRAME_S)  # 6.25 frames late
    assert late == Slot(13, 6, 0.0)
    audio = next_slot(now=10.25, due=10.0, index=100, period_s=AUDIO_CHUNK_S)
    assert audio == Slot(112, 12, 0.0)


def test_a_tracks_first_slot_is_sent_however_late_and_the_next_ones_skip() -> None:
    """A receiver counts frames from the first one it gets: that must be slot 0."""
    first = next_slot(now=11.0, due=10.0, index=0, period_s=FRAME_S)  # a second late
    assert first == Slot(0, 0, 0.0)
    assert next_slot(now=11.0, due=10.04, index=1, period_s=FRAME_S) == Slot(25, 24, 0.0)


# -- the clock ----------------------------------------------------------------------------


async def test_the_clock_starts_at_the_first_ask_and_tells_who_waits() -> None:
    time = ManualTime(START)
    clock = _clock(time)
    assert clock.start is None
    time.now = START + 3.0
    assert clock.due(0.2) == START + 3.0 + DELAY_S + 0.2  # asking starts it
    time.now = START + 9.0
    assert clock.started() == START + 3.0  # once
    assert await clock.wait_started() == START + 3.0


async def test_a_track_on_time_sleeps_to_each_slot_and_skips_none() -> None:
    time = ManualTime(START)
    clock = _clock(time)
    clock.started()
    for index in range(5):
        slot = await wait_for_slot(clock, index, FRAME_S)
        assert slot == Slot(index, 0, pytest.approx(time.sleeps[-1]))
        assert time.now == pytest.approx(START + DELAY_S + index * FRAME_S)


async def test_a_small_stall_is_caught_up_and_the_next_slots_are_early_again() -> None:
    time = ManualTime(START)
    clock = _clock(time)
    clock.started()
    await wait_for_slot(clock, 0, FRAME_S)
    time.now += 0.09  # a 90 ms stall: slots 1 and 2 are late, within CATCH_UP_S
    assert await wait_for_slot(clock, 1, FRAME_S) == Slot(1, 0, 0.0)
    assert await wait_for_slot(clock, 2, FRAME_S) == Slot(2, 0, 0.0)
    sleeps = len(time.sleeps)
    slot = await wait_for_slot(clock, 3, FRAME_S)  # due 120 ms after slot 0: early again
    assert slot.skipped == 0
    assert slot.wait_s > 0
    assert len(time.sleeps) == sleeps + 1
    assert time.now == pytest.approx(START + DELAY_S + 3 * FRAME_S)  # no delay kept


async def test_a_long_stall_skips_the_missed_slots_instead_of_queueing_them() -> None:
    time = ManualTime(START)
    clock = _clock(time)
    clock.started()
    await wait_for_slot(clock, 0, FRAME_S)
    time.now += 0.5  # half a second stalled: slot 1 is 460 ms late
    slot = await wait_for_slot(clock, 1, FRAME_S)
    assert slot == Slot(12, 11, 0.0)  # slot 12 is the one due now
    nxt = await wait_for_slot(clock, slot.index + 1, FRAME_S)
    assert nxt.skipped == 0
    assert nxt.wait_s == pytest.approx(13 * FRAME_S - 0.5)  # its own due time, absolute


# -- the tracks ---------------------------------------------------------------------------


class Frames:
    """A video source: frame n is a grey picture; records what was sent."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.asked: list[int] = []
        self.sent_indices: list[int] = []
        self.fail_at = fail_at

    async def frame_for(self, index: int) -> np.ndarray:
        self.asked.append(index)
        if index == self.fail_at:
            raise RuntimeError("no frame")
        return np.full((24, 16), 128, np.uint8)  # 16x16 yuv420p

    async def packet_for(self, index: int, encoder: Any) -> av.Packet[Any]:
        raise AssertionError("no encoder was given")

    def sent(self, index: int) -> None:
        self.sent_indices.append(index)


async def test_the_video_track_counts_what_it_skipped_and_asks_for_the_slot_it_sends() -> None:
    time = ManualTime(START)
    clock = _clock(time)
    frames = Frames()
    track = AvatarVideoTrack(clock, FPS, frames, on_failure=lambda *_: None)
    first = await track.recv()
    assert isinstance(first, av.VideoFrame)
    assert first.pts == 0
    time.now += 0.3  # stalled: slot 1 is 260 ms late
    frame = await track.recv()
    assert frames.asked == [0, 7]
    assert frames.sent_indices == [0, 7]
    assert isinstance(frame, av.VideoFrame)
    assert frame.pts == 7 * 90_000 // FPS
    assert track.frames_skipped == 6
    assert track.frames_sent == 2
    assert track.next_index == 8


async def test_a_failing_source_ends_the_track_and_names_the_stage() -> None:
    from aiortc.mediastreams import MediaStreamError

    time = ManualTime(START)
    failures: list[tuple[str, BaseException]] = []
    track = AvatarVideoTrack(
        _clock(time), FPS, Frames(fail_at=1), on_failure=lambda s, e: failures.append((s, e))
    )
    await track.recv()
    with pytest.raises(MediaStreamError):
        await track.recv()
    assert [stage for stage, _ in failures] == ["encode"]
    assert track.readyState == "ended"


async def test_the_audio_track_sends_each_chunk_at_its_slot_and_skips_like_video() -> None:
    time = ManualTime(START)
    clock = _clock(time)
    asked: list[int] = []

    def packet(index: int) -> av.Packet[Any]:
        asked.append(index)
        return stamped(b"\xf8", index)

    track = AvatarAudioTrack(clock, packet, on_failure=lambda *_: None)
    for _ in range(3):
        await track.recv()
    assert time.now == pytest.approx(START + DELAY_S + 2 * AUDIO_CHUNK_S)
    time.now += 0.2  # 180 ms late for chunk 3: 9 chunks skipped
    await track.recv()
    assert asked == [0, 1, 2, 12]
    assert track.chunks_skipped == 9
