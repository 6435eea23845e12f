"""The caller's RTP, handled in the socket's callback (``docs/design/rtp-send.md`` §20).

aioice puts every datagram that is not STUN on a queue, and the DTLS transport's receive
task wakes for each one to unprotect it, parse it, route it and await its receiver. For
a caller's microphone that is a task step per 20 ms packet on the event loop, for work
that never waits: the audio receiver decodes on arrival (:mod:`.audio_receive`) and
sends nothing back. :class:`DirectReceive` takes the caller's RTP in aioice's callback
instead: it unprotects the packet with the transport's own SRTP session, counts it in
the transport's stats and runs the transport's own handling of it there and then. DTLS,
RTCP (the link reads it first, §19) and whatever comes before SRTP is keyed take
aioice's queue as before.

That handling is a coroutine; an audio packet's never suspends. One that does (a video
receiver sending a NACK or a PLI) is finished in a task, and the packets that arrive
meanwhile wait behind it, in order, as they would behind the transport's task; at most
:data:`MAX_BEHIND` of them, later ones are dropped (a real-time stream drops, it does not
queue).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import pylibsrtp
from aiortc.rtp import is_rtcp

from streaming.webrtc.compat import ReceiveHooks

logger = logging.getLogger(__name__)

#: Packets that may wait behind one whose handling suspended (about a second of audio).
MAX_BEHIND = 64
_RTP_HEADER = 12


class DirectReceive:
    """One transport's incoming RTP, handled as it arrives (module doc).

    ``connect(receive)`` routes the transport's datagrams to ``receive`` and returns the
    hooks (:func:`~streaming.webrtc.compat.intercept_datagrams` for a real transport).
    """

    def __init__(self, connect: Callable[[Callable[[bytes, int], None]], ReceiveHooks]) -> None:
        self._hooks = connect(self.datagram)
        self._behind: deque[tuple[bytes, int]] | None = None  # while a handling waits
        self._finishing: asyncio.Task[None] | None = None
        self.handled = 0  # RTP packets handled here
        self.passed_on = 0  # datagrams left to aioice's queue (DTLS, RTCP, before SRTP)
        self.refused = 0  # packets SRTP would not unprotect (replayed, forged, damaged)
        self.dropped = 0  # packets beyond MAX_BEHIND while a handling waited

    def datagram(self, data: bytes, component: int) -> None:
        """aioice's hand-off of one datagram that is not STUN."""
        hooks = self._hooks
        srtp = hooks.srtp()
        if srtp is None or len(data) < _RTP_HEADER or not 127 < data[0] < 192 or is_rtcp(data):
            self.passed_on += 1
            hooks.queue(data, component)
            return
        hooks.counted(len(data))
        arrival_ms = hooks.now_ms()
        behind = self._behind
        if behind is not None:
            if len(behind) < MAX_BEHIND:
                behind.append((data, arrival_ms))
            else:
                self.dropped += 1
            return
        packet = self._unprotect(srtp, data)
        if packet is None:
            return
        handling = hooks.handle_rtp(packet, arrival_ms)
        try:
            waiting = handling.send(None)
        except StopIteration:
            self.handled += 1
            return
        except Exception:
            logger.exception("the caller's RTP packet could not be handled; dropped")
            return
        self._behind = deque()
        self._finishing = asyncio.get_running_loop().create_task(
            self._finish(handling, waiting), name="rtp receive: a packet that waits"
        )

    async def close(self) -> None:
        """Cancel a handling still waiting (the call ends)."""
        task = self._finishing
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _unprotect(self, srtp: pylibsrtp.Session, data: bytes) -> bytes | None:
        try:
            packet: bytes = srtp.unprotect(data)
        except pylibsrtp.Error as exc:
            self.refused += 1
            logger.debug("SRTP refused a packet of the caller: %s", exc)
            return None
        return packet

    async def _finish(self, handling: Coroutine[Any, Any, None], waiting: object) -> None:
        """Finish the handling that suspended on ``waiting``, then the packets that came
        meanwhile, in order."""
        try:
            await _drive(handling, waiting)
            self.handled += 1
            behind = self._behind
            while behind:
                data, arrival_ms = behind.popleft()
                srtp = self._hooks.srtp()
                packet = None if srtp is None else self._unprotect(srtp, data)
                if packet is not None:
                    try:
                        await self._hooks.handle_rtp(packet, arrival_ms)
                    except Exception:
                        logger.exception("the caller's RTP packet could not be handled; dropped")
                    else:
                        self.handled += 1
        finally:
            self._behind = None


async def _drive(handling: Coroutine[Any, Any, None], waiting: object) -> None:
    """Run ``handling`` on from where it suspended, yielding ``waiting``, as a task would:
    wait for what it awaits, then resume it, until it returns."""
    try:
        while True:
            if isinstance(waiting, asyncio.Future):
                await asyncio.wait([waiting])  # its result or error reaches it on resume
            else:  # a bare yield (asyncio.sleep(0))
                await asyncio.sleep(0)
            try:
                waiting = handling.send(None)
            except StopIteration:
                return
            except Exception:
                logger.exception("the caller's RTP packet could not be handled; dropped")
                return
    finally:
        handling.close()  # a no-op once it returned; a cancelled call stops it here
