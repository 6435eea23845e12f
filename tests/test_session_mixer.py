"""The mixer's microphone buffer keeps what jitter needs and skips a stall's backlog.

Each test plays ticks (one ``next_chunk`` per 20 ms of the timeline) against packets
(960 samples, the 20 ms a browser sends) fed in some order, as the session's inbound
track would. Every sample of packet ``k`` has the value ``k / 10_000``, so a chunk
shows which packet it came from.
"""

from __future__ import annotations

import numpy as np

from streaming.audio_rates import CHUNK_SAMPLES
from streaming.live.mixer import INBOUND_SLACK_MS, INBOUND_WINDOW_TICKS, AudioMixer

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
