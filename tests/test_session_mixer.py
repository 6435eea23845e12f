"""The mixer's microphone buffer keeps what jitter needs and skips a stall's backlog.

Each test plays ticks (one ``next_chunk`` per 20 ms of the timeline) against packets
(960 samples, the 20 ms a browser sends) fed in some order, as the session's inbound
track would. Every sample of packet ``k`` has the value ``k / 10_000``, so a chunk
shows which packet it came from.
"""

from __future__ import annotations

import numpy as np

from streaming.audio_rates import CHUNK_SAMPLES
from streaming.live.mixer import (
    INBOUND_SLACK_MS,
    INBOUND_WINDOW_TICKS,
    MAX_CONCEALED_MS,
    OWED_FOR_S,
    AudioMixer,
)

KEEP_MS = 20 + INBOUND_SLACK_MS  # one chunk for the tick plus the slack


class Caller:
    """Numbered 20 ms packets."""

    def __init__(self, mixer: AudioMixer) -> None:
        self.mixer = mixer
        self.sent = 0

    def send(self, packets: int = 1, samples: int = CHUNK_SAMPLES) -> None:
        for _ in range(packets):
            self.mixer.feed_inbound(np.full(samples, self.sent / 10_000, dtype=np.float32))
            self.sent += 1


def packet_of(chunk: np.ndarray) -> int:
    """Which packet a chunk (from one packet) came from."""
    return round(float(chunk[-1]) * 10_000)


def test_a_steady_caller_loses_nothing_and_waits_one_chunk_at_most() -> None:
    mixer = AudioMixer()
    caller = Caller(mixer)
    for tick in range(10 * INBOUND_WINDOW_TICKS):
        caller.send()
        assert packet_of(mixer.next_chunk()) == tick
        assert mixer.inbound_ms == 0
    assert mixer.inbound_dropped_samples == 0
    assert mixer.underruns == 0


def test_jitter_of_a_packet_is_absorbed_not_skipped() -> None:
    """Every 5th packet comes a tick late with the next: the buffer rides it out."""
    mixer = AudioMixer()
    caller = Caller(mixer)
    caller.send()  # one packet of slack, as a jitter buffer would build
    for tick in range(10 * INBOUND_WINDOW_TICKS):
        if tick % 5 != 0:
            caller.send(2 if tick % 5 == 1 else 1)
        mixer.next_chunk()
    assert mixer.inbound_dropped_samples == 0
    assert mixer.underruns == 0


def test_a_stalls_backlog_is_skipped_within_two_windows_and_the_newest_audio_kept() -> None:
    mixer = AudioMixer()
    caller = Caller(mixer)
    for _ in range(INBOUND_WINDOW_TICKS + 3):
        caller.send()
        mixer.next_chunk()
    # A stall: the timeline made 7 chunks without microphone audio (silence), then the
    # 7 packets held back arrive at once with the current one.
    for _ in range(7):
        mixer.next_chunk()
    caller.send(8)
    assert mixer.inbound_ms == 8 * 20
    for _ in range(2 * INBOUND_WINDOW_TICKS):
        caller.send()
        mixer.next_chunk()
    assert mixer.inbound_ms <= KEEP_MS, "the backlog stayed: delay built up"
    assert mixer.inbound_dropped_samples >= (8 - KEEP_MS / 20) * CHUNK_SAMPLES
    # What is played is the caller's newest audio, at most the slack behind.
    caller.send()
    assert caller.sent - 1 - packet_of(mixer.next_chunk()) <= INBOUND_SLACK_MS / 20
    # And it holds: nothing more is skipped while the caller is steady.
    dropped = mixer.inbound_dropped_samples
    for _ in range(4 * INBOUND_WINDOW_TICKS):
        caller.send()
        mixer.next_chunk()
    assert mixer.inbound_dropped_samples == dropped


def test_a_caller_whose_clock_runs_fast_does_not_build_delay() -> None:
    """1% more samples than our clock takes: 4 s of it would be 40 ms of backlog."""
    mixer = AudioMixer()
    caller = Caller(mixer)
    highest = 0.0
    for _ in range(20 * INBOUND_WINDOW_TICKS):
        caller.send(samples=CHUNK_SAMPLES + CHUNK_SAMPLES // 100)
        mixer.next_chunk()
        highest = max(highest, mixer.inbound_ms)
    assert highest <= KEEP_MS + 20, highest  # at most a window's growth past the keep
    assert mixer.underruns == 0


def test_sound_is_announced_and_pushed_audio_can_wait_for_its_chunk() -> None:
    """``on_sound`` hears the caller's audio that is not zeros and every push (a timeline
    sleeping through silence wakes on it); chunks before ``hold_pushed`` take no pushed
    audio, the caller's as ever."""
    mixer = AudioMixer()
    heard: list[int] = []
    mixer.on_sound = lambda: heard.append(1)
    mixer.feed_inbound(np.zeros(CHUNK_SAMPLES, np.float32))
    assert heard == []
    mixer.feed_inbound(np.full(CHUNK_SAMPLES, 0.25, np.float32))
    assert len(heard) == 1
    mixer.hold_pushed(2)
    mixer.push(np.full(CHUNK_SAMPLES, 0.5, np.float32))
    assert len(heard) == 2
    first, second, third = (mixer.next_chunk() for _ in range(3))
    assert not first.any()  # the caller's zeros; the push waits
    assert np.all(second == 0.25)  # the caller's sound; the push still waits
    assert np.all(third == 0.5)  # chunk 2: the pushed audio


# -- a packet that comes after its tick while the caller speaks ---------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


MADE_UP = -1.0  # what the concealment gives: no packet's value


def _concealing(clock: Clock) -> tuple[AudioMixer, Caller, list[int]]:
    mixer = AudioMixer(clock=clock)
    asked: list[int] = []

    def conceal(samples: int) -> np.ndarray:
        asked.append(samples)
        return np.full(samples, MADE_UP, np.float32)

    mixer.set_concealment(conceal)
    return mixer, Caller(mixer), asked


def _tick(mixer: AudioMixer, clock: Clock) -> np.ndarray:
    clock.now += 0.02
    return mixer.next_chunk()


def test_a_late_packet_mid_speech_is_made_up_and_skipped_when_it_comes() -> None:
    """Its tick is the caller's voice made up, not a hole of silence, and the packet,
    when it comes, is skipped: the next tick plays the next packet, the delay as before."""
    clock = Clock()
    mixer, caller, asked = _concealing(clock)
    caller.sent = 1  # non-zero values: the caller speaks
    for _ in range(5):
        caller.send()
        assert packet_of(_tick(mixer, clock)) == caller.sent - 1
    late = caller.sent
    chunk = _tick(mixer, clock)  # packet `late` is not in yet
    assert np.all(chunk == MADE_UP)
    assert asked == [CHUNK_SAMPLES]
    caller.send(2)  # it comes, with the next
    assert packet_of(_tick(mixer, clock)) == late + 1
    assert mixer.inbound_ms == 0  # nothing held: no delay added
    assert mixer.inbound_concealed_ms == 20
    for _ in range(2 * INBOUND_WINDOW_TICKS):
        caller.send()
        assert packet_of(_tick(mixer, clock)) == caller.sent - 1
    assert mixer.inbound_dropped_samples == 0  # the window had nothing to skip after it


def test_a_stall_is_made_up_for_100_ms_then_silence_and_its_backlog_skipped() -> None:
    clock = Clock()
    mixer, caller, _ = _concealing(clock)
    caller.sent = 1
    for _ in range(5):
        caller.send()
        _tick(mixer, clock)
    chunks = [_tick(mixer, clock) for _ in range(7)]  # 140 ms with nothing from the caller
    made_up = MAX_CONCEALED_MS / 20
    assert [bool(np.all(c == MADE_UP)) for c in chunks] == [i < made_up for i in range(7)]
    assert not any(c.any() for c in chunks[int(made_up) :])  # then silence, as a pause
    assert mixer.inbound_concealed_ms == MAX_CONCEALED_MS
    first_held = caller.sent
    caller.send(8)  # the held packets come at once with the current one
    # The made-up 100 ms of them are skipped at once; the window skips the rest.
    assert mixer.inbound_ms == (8 - made_up) * 20
    assert packet_of(_tick(mixer, clock)) == first_held + made_up


def test_a_silent_or_paused_caller_is_not_made_up() -> None:
    clock = Clock()
    mixer, _, asked = _concealing(clock)
    for _ in range(5):
        mixer.feed_inbound(np.zeros(CHUNK_SAMPLES, np.float32))  # a muted microphone
        _tick(mixer, clock)
    assert not _tick(mixer, clock).any()  # a DTX pause after silence: silence
    assert asked == []
    assert mixer.inbound_concealed_ms == 0


def test_made_up_audio_is_owed_only_briefly() -> None:
    """A packet that comes long after the tick made up for it is new audio (a caller that
    paused with DTX, then spoke): none of it is skipped."""
    clock = Clock()
    mixer, caller, _ = _concealing(clock)
    caller.sent = 1
    caller.send()
    _tick(mixer, clock)
    assert np.all(_tick(mixer, clock) == MADE_UP)
    clock.now += OWED_FOR_S + 0.01
    caller.send()
    assert mixer.inbound_ms == 20  # kept whole


def test_after_a_made_up_stall_each_chunk_is_timed_from_the_packet_it_took() -> None:
    """``chunk_arrivals`` (what the caller's audio delay is measured from) names the
    arrival of the packet a chunk plays, not of the late packets skipped before it."""
    clock = Clock()
    mixer, caller, _ = _concealing(clock)
    caller.sent = 1
    for _ in range(3):
        caller.send()
        _tick(mixer, clock)
    for _ in range(5):  # 100 ms: the caller's packets held back, made up here
        _tick(mixer, clock)
    for _ in range(5):  # they come, one by one, then the current one
        clock.now += 0.002
        caller.send()
    clock.now += 0.002
    arrived = clock.now
    caller.send()
    chunk = mixer.next_chunk()
    assert packet_of(chunk) == caller.sent - 1
    assert mixer.chunk_arrivals[8] == arrived
