"""Watchdogs on a hand-stepped clock: ICE timeout, a silent peer, no audio."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from streaming.live.watchdogs import (
    PEER_CHECK_S,
    PEER_SILENCE_S,
    AudioActivity,
    PeerSilence,
    connect_timed_out,
    ice_failure,
    peer_silent,
    went_idle,
)
from streaming.webrtc.peer import PeerState, transport_packets


class FakeTime:
    """A clock that moves only when the code under test sleeps.

    ``at(t, action)`` runs ``action`` when time passes ``t`` (during a sleep, with the
    clock reading ``t``), as if something happened then. ``sleep`` raises
    :class:`SleptTooOftenError` after ``max_sleeps`` sleeps, so a loop that never returns ends.
    """

    def __init__(self, now: float = 1000.0, max_sleeps: int = 10_000) -> None:
        self.now = now
        self.sleeps: list[float] = []
        self._max_sleeps = max_sleeps
        self._events: list[tuple[float, Callable[[], None]]] = []

    def clock(self) -> float:
        return self.now

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._events.append((when, action))
        self._events.sort(key=lambda event: event[0])

    async def sleep(self, seconds: float) -> None:
        if len(self.sleeps) >= self._max_sleeps:
            raise SleptTooOftenError
        self.sleeps.append(seconds)
        end = self.now + seconds
        while self._events and self._events[0][0] <= end:
            when, action = self._events.pop(0)
            self.now = when
            action()
        self.now = end


class SleptTooOftenError(Exception):
    """The loop under test slept ``max_sleeps`` times without returning."""


@dataclass
class Stat:
    type: str
    packetsReceived: int = 0  # noqa: N815 - aiortc's name


@dataclass
class FakePeer:
    """What the watchdogs read of a call's peer (``streaming.live.watchdogs.WatchedPeer``)."""

    state: PeerState = PeerState.CONNECTED
    ice_connected: bool = True
    received: int = 0
    stats_read: int = 0

    async def packets_received(self) -> int:
        self.stats_read += 1
        return self.received

    def receive(self, packets: int = 1) -> None:
        self.received += packets


# -- ICE ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state", [PeerState.NEW, PeerState.CONNECTING, PeerState.FAILED, PeerState.CLOSED]
)
async def test_ice_timeout_when_not_connected_by_then(state: PeerState) -> None:
    time = FakeTime()
    peer = FakePeer(state=state)
    assert await connect_timed_out(peer, 10.0, sleep=time.sleep)
    assert time.sleeps == [10.0]


async def test_no_ice_timeout_once_connected() -> None:
    time = FakeTime()
    peer = FakePeer(state=PeerState.CONNECTING)
    time.at(time.now + 9.9, lambda: setattr(peer, "state", PeerState.CONNECTED))
    assert not await connect_timed_out(peer, 10.0, sleep=time.sleep)


async def test_the_ice_watchdog_names_what_did_not_connect() -> None:
    time = FakeTime()
    no_path = FakePeer(state=PeerState.CONNECTING, ice_connected=False)
    assert await ice_failure(no_path, 10.0, "s", sleep=time.sleep) == "ICE timeout"
    no_dtls = FakePeer(state=PeerState.CONNECTING, ice_connected=True)
    assert await ice_failure(no_dtls, 10.0, "s", sleep=time.sleep) == "DTLS handshake timed out"
    connected = FakePeer(state=PeerState.CONNECTED)
    assert await ice_failure(connected, 10.0, "s", sleep=time.sleep) is None


# -- peer silence: the decision -------------------------------------------------------


def test_peer_silence_fires_exactly_when_the_count_stopped_for_the_silence_time() -> None:
    silence = PeerSilence(now=0.0, silence_s=15.0)
    assert silence.check(1.0, 100, connected=True) is None  # first reading
    assert silence.check(2.0, 120, connected=True) is None  # last movement at t=2
    for t in range(3, 17):
        assert silence.check(float(t), 120, connected=True) is None, t
    assert silence.check(17.0, 120, connected=True) == 15.0
    assert silence.check(17.5, 120, connected=True) == 15.5  # still silent


def test_a_moving_count_restarts_the_silence() -> None:
    silence = PeerSilence(now=0.0, silence_s=15.0)
    silence.check(1.0, 5, connected=True)
    assert silence.check(15.0, 5, connected=True) is None  # 14 s quiet
    assert silence.check(15.5, 6, connected=True) is None  # one packet: heard again
    assert silence.check(30.0, 6, connected=True) is None  # 14.5 s quiet
    assert silence.check(30.5, 6, connected=True) == 15.0


def test_no_peer_silence_while_not_connected() -> None:
    silence = PeerSilence(now=0.0, silence_s=15.0)
    for t in range(1, 60):
        assert silence.check(float(t), 0, connected=False) is None
    # Connected from t=60 with the count still at 0: silent from the last reading before.
    assert silence.check(60.0, 0, connected=True) is None
    assert silence.check(73.9, 0, connected=True) is None
    assert silence.check(74.0, 0, connected=True) == 15.0


# -- peer silence: the loop -----------------------------------------------------------


def test_packets_received_counts_only_transports() -> None:
    stats = [Stat("transport", 7), Stat("transport", 5), Stat("inbound-rtp", 10_000)]
    assert transport_packets(stats) == 12


async def test_peer_silent_returns_when_the_peer_stops_sending() -> None:
    time = FakeTime(now=0.0)
    peer = FakePeer()
    # The peer sends until t=5.5 (RTCP every 0.5 s), then vanishes.
    for k in range(1, 12):
        time.at(k * 0.5, peer.receive)
    quiet_s = await peer_silent(peer, clock=time.clock, sleep=time.sleep)
    # The count last moved between the checks at t=5 and t=6: silent from t=6, for
    # PEER_SILENCE_S at t=21.
    assert quiet_s == PEER_SILENCE_S
    assert time.now == 6.0 + PEER_SILENCE_S
    assert time.sleeps == [PEER_CHECK_S] * 21
    assert peer.stats_read == 21


async def test_peer_silent_never_returns_while_the_peer_sends() -> None:
    time = FakeTime(now=0.0, max_sleeps=600)
    peer = FakePeer()
    for k in range(1, 600):
        time.at(k * 1.0 - 0.1, peer.receive)
    with pytest.raises(SleptTooOftenError):
        await peer_silent(peer, clock=time.clock, sleep=time.sleep)


async def test_peer_silent_never_returns_before_connecting() -> None:
    time = FakeTime(now=0.0, max_sleeps=600)
    peer = FakePeer(state=PeerState.CONNECTING)  # nothing received, ICE still going
    with pytest.raises(SleptTooOftenError):
        await peer_silent(peer, clock=time.clock, sleep=time.sleep)


# -- idle -----------------------------------------------------------------------------


def test_audio_moves_the_idle_moment_on() -> None:
    time = FakeTime(now=100.0)
    activity = AudioActivity(clock=time.clock, sleep=time.sleep)
    assert activity.last_audio_at == 100.0
    assert activity.idle_in(104.0, timeout_s=10.0) == 6.0
    time.now = 104.0
    activity.heard()
    assert activity.last_audio_at == 104.0
    assert activity.idle_in(110.0, timeout_s=10.0) == 4.0
    assert activity.idle_in(114.0, timeout_s=10.0) == 0.0  # idle


async def test_idle_after_the_timeout_without_audio() -> None:
    time = FakeTime(now=100.0)
    activity = AudioActivity(clock=time.clock, sleep=time.sleep)
    assert await went_idle(activity, 10.0, "s") == "idle"  # the reason the call ends with
    assert time.now == 110.0
    assert time.sleeps == [10.0]


async def test_audio_meanwhile_postpones_idle() -> None:
    time = FakeTime(now=100.0)
    activity = AudioActivity(clock=time.clock, sleep=time.sleep)
    time.at(104.0, activity.heard)
    time.at(112.0, activity.heard)
    await activity.idle(10.0)
    # Woken at 110 (6 s quiet) and at 114 (2 s quiet), idle at 122.
    assert time.now == 122.0
    assert time.sleeps == [10.0, 4.0, 8.0]
