"""When a call should end by itself: ICE never connected, the peer vanished, nobody spoke.

Each watchdog is a decision of ``now`` (:class:`PeerSilence`, :class:`AudioActivity`) and a
thin coroutine that drives it with a clock and a sleep and returns the reason once the
call should end. The session runs these coroutines as tasks of its own, and a task that
returns a reason ends the call (``docs/design/threads.md`` §7); nothing here closes
anything. Tests hand in their own clock and sleep and step time by hand. The peer is
read through :class:`WatchedPeer` (:class:`~streaming.webrtc.peer.Peer` is one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from streaming.webrtc.peer import PeerState

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

# A connected peer that sends nothing for this long is gone. Every WebRTC endpoint that
# receives media sends RTCP receiver reports every few seconds (aiortc about every 1 s),
# so this only fires for a peer that vanished; it frees it sooner and more surely than
# aioice's consent checks (6 failures 4-6 s apart: 27-39 s, docs/design/failure.md §12).
PEER_SILENCE_S = 15.0
PEER_CHECK_S = 1.0


class WatchedPeer(Protocol):
    """What the watchdogs read of a call's peer connection."""

    @property
    def state(self) -> PeerState: ...

    @property
    def ice_connected(self) -> bool: ...

    async def packets_received(self) -> int: ...


async def connect_timed_out(
    peer: WatchedPeer, timeout_s: float, *, sleep: Sleep = asyncio.sleep
) -> bool:
    """Wait ``timeout_s``; whether the peer had not connected by then (the call ends if so)."""
    await sleep(timeout_s)
    return peer.state != PeerState.CONNECTED


async def ice_failure(
    peer: WatchedPeer, timeout_s: float, session_id: str, *, sleep: Sleep = asyncio.sleep
) -> str | None:
    """Why the call must end if it is not connected within ``timeout_s`` (None once it
    is): no ICE path at all, or ICE connected but no DTLS handshake finished."""
    if not await connect_timed_out(peer, timeout_s, sleep=sleep):
        return None
    if peer.ice_connected:
        # ICE found a path; then neither side started DTLS, or the peer stopped
        # answering it: a different fault from no path at all.
        logger.warning(
            "DTLS handshake timed out: session=%s (ICE connected; no DTLS handshake "
            "completed in %.0f s)",
            session_id,
            timeout_s,
        )
        return "DTLS handshake timed out"
    logger.info(
        "session not connected after %.0f s: session=%s state=%s",
        timeout_s,
        session_id,
        peer.state,
    )
    return "ICE timeout"


class PeerSilence:
    """Tells when a connected peer has sent nothing for ``silence_s``.

    Fed readings of the peer's running packet count: a count that moves, or a connection
    that is not (or no longer) connected, restarts the count-down from that reading.
    """

    def __init__(self, now: float, silence_s: float = PEER_SILENCE_S) -> None:
        self._silence_s = silence_s
        self._received = -1
        self._heard_at = now

    def check(self, now: float, received: int, connected: bool) -> float | None:
        """Record a reading; the seconds the peer has been silent once that is
        ``silence_s`` or more, else None."""
        if received != self._received or not connected:
            self._received, self._heard_at = received, now
            return None
        quiet_s = now - self._heard_at
        return quiet_s if quiet_s >= self._silence_s else None


async def peer_silent(
    peer: WatchedPeer,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
    silence_s: float = PEER_SILENCE_S,
    check_s: float = PEER_CHECK_S,
) -> float:
    """Return once the connected peer has sent nothing for ``silence_s``: the seconds silent.

    Reads the packet count every ``check_s``.
    """
    silence = PeerSilence(clock(), silence_s)
    while True:
        await sleep(check_s)
        now = clock()
        received = await peer.packets_received()
        quiet_s = silence.check(now, received, peer.state == PeerState.CONNECTED)
        if quiet_s is not None:
            return quiet_s


class AudioActivity:
    """When the session last had audio, and when that makes it idle.

    Audio is pushed or spoken audio, or caller audio above ``audio.vad_threshold_db``.
    """

    def __init__(self, *, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep) -> None:
        self._clock = clock
        self._sleep = sleep
        self.last_audio_at = clock()

    def heard(self) -> None:
        """There is audio now (idle moves on)."""
        self.last_audio_at = self._clock()

    def idle_in(self, now: float, timeout_s: float) -> float:
        """Seconds from ``now`` until ``timeout_s`` without audio have passed (<= 0: idle)."""
        return timeout_s - (now - self.last_audio_at)

    async def idle(self, timeout_s: float) -> None:
        """Return once there has been no audio for ``timeout_s``."""
        # Sleep until the session would be idle; audio meanwhile moves that moment on
        # (a deadline, not a poll: there is nothing to wait on for "no audio").
        while (left_s := self.idle_in(self._clock(), timeout_s)) > 0:
            await self._sleep(left_s)


async def peer_gone(peer: WatchedPeer, session_id: str) -> str:
    """Return ``"peer silent"`` once the connected peer has sent nothing for
    :data:`PEER_SILENCE_S` (:func:`peer_silent`)."""
    quiet_s = await peer_silent(peer)
    logger.info("nothing from the peer for %.0f s: session=%s", quiet_s, session_id)
    return "peer silent"


async def went_idle(activity: AudioActivity, timeout_s: float, session_id: str) -> str:
    """Return ``"idle"`` after ``timeout_s`` with no audio (:meth:`AudioActivity.idle`)."""
    await activity.idle(timeout_s)
    logger.info("session idle for %g s: session=%s", timeout_s, session_id)
    return "idle"
