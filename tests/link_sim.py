"""A seeded, in-process link for the link controller's tests: a call without a network.

:class:`Bottleneck` is what ``tc tbf`` makes of a link: packets leave one after another
at its rate, wait in a queue up to ``queue_s`` and are dropped beyond it; ``loss`` drops
a share at random (seeded). :class:`SimulatedCall` is one call's
:class:`~streaming.link.LinkController` and :class:`~streaming.link.MediaSender` on
virtual time: an encoder stand-in makes 25 frames a second of the size its target asks,
packetised as RTP with abs-send-time, every packet the sender sends crosses the
bottleneck, and every 100 ms the arrivals come back as transport-cc feedback (or, with
``remb``, as a REMB of what a receive-side estimate would say). Time is virtual
(:class:`Clock`): every sleep waits for the clock, which the call moves on a millisecond
at a time, so a minute of call takes a second or two and each decision can be checked
by value, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import struct
from collections import deque
from dataclasses import dataclass, field

from aiortc.rtp import RTCP_PSFB_APP, RtcpPsfbPacket, pack_remb_fci

from streaming.link import LinkController, MediaSender, Pacer, Streams
from streaming.link.rtp_bytes import TRANSPORT_CC_URI, extension_elements, parse_rtp
from tests.link_wire import transport_feedback
from tests.test_link_wire import ABS, TWCC, aiortc_packet

__all__ = ["TRANSPORT_CC_URI", "Bottleneck", "Clock", "SimulatedCall"]

VIDEO_SSRC, RTX_SSRC, RTX_PT = 1234, 4321, 103
PACKET_BYTES = 1100


class Clock:
    """Virtual time: :meth:`sleep` waits until :meth:`advance` has moved past its end."""

    def __init__(self) -> None:
        self.now = 0.0
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []
        self._count = 0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._count += 1
        heapq.heappush(self._waiting, (self.now + max(0.0, seconds), self._count, future))
        await future

    async def advance(self, to: float) -> None:
        """Move to ``to``, waking each sleeper at its time, in order."""
        while self._waiting and self._waiting[0][0] <= to:
            deadline, _, future = heapq.heappop(self._waiting)
            self.now = max(self.now, deadline)
            if not future.done():
                future.set_result(None)
            for _ in range(3):  # let it run up to its next sleep
                await asyncio.sleep(0)
        self.now = max(self.now, to)


@dataclass
class Bottleneck:
    """A token-bucket-shaped link (module doc): tokens refill at ``rate_bps`` up to
    ``burst_bytes``; a packet leaves once the bucket holds its size (a burst passes at
    once), waits at most ``queue_s`` for it and is dropped beyond. ``rate_bps`` may be
    changed at any time."""

    rate_bps: float
    queue_s: float = 0.3
    loss: float = 0.0
    seed: int = 0
    burst_bytes: int = 15_000
    _tokens: float = field(init=False)
    _updated: float = 0.0
    _random: random.Random = field(init=False)
    dropped: int = 0
    max_delay_s: float = 0.0

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._tokens = float(self.burst_bytes)

    def arrival(self, now: float, size: int) -> float | None:
        """When a packet of ``size`` bytes sent ``now`` arrives, or None (dropped)."""
        refill = (now - self._updated) * self.rate_bps / 8
        self._tokens = min(float(self.burst_bytes), self._tokens + refill)
        self._updated = now
        wait = max(0.0, (size - self._tokens) * 8 / self.rate_bps)
        if wait > self.queue_s:
            self.dropped += 1
            return None
        self._tokens -= size  # a debt while it waits: later packets wait behind it
        if self._random.random() < self.loss:
            self.dropped += 1
            return None
        self.max_delay_s = max(self.max_delay_s, wait)
        return now + wait + 0.01  # 10 ms of propagation


class FakeEncoder:
    """What the controller steers, recording what it was told."""

    def __init__(self) -> None:
        self.keyframe_interval_s = 0.0
        self.steady_idle = False
        self.estimate_measured = False
        self.keyframe_requests = 0
        self.keyframe_requests_ignored = 0
        self.qps: deque[float] = deque()
        self.source_size = (1280, 720)
        self.target_bitrate = 0
        self.steps: list[tuple[float, int]] = []

    def set_link(self, scale: float, fps: int, bitrate: int) -> None:
        if not self.steps or self.steps[-1] != (scale, fps):
            self.steps.append((scale, fps))
        self.target_bitrate = bitrate


class SimulatedCall:
    """A call over ``link`` (module doc)."""

    def __init__(self, link: Bottleneck, *, remb: bool = False, top_bps: int = 2_500_000) -> None:
        self.clock = Clock()
        self.link = link
        self.remb = remb
        self.encoder = FakeEncoder()
        streams = Streams(
            video_ssrc=VIDEO_SSRC,
            rtx_ssrc=RTX_SSRC,
            rtx_payload_type=RTX_PT,
            abs_send_time_id=ABS,
            transport_cc_id=None if remb else TWCC,
        )
        self.sender = MediaSender(
            streams,
            self._on_wire,
            Pacer(top_bps),
            clock=self.clock,
            wall_clock=self.clock,
            sleep=self.clock.sleep,
        )
        self.controller = LinkController(
            self.sender,
            self.encoder,
            top_bps=top_bps,
            fps=25,
            audio=False,
            clock=self.clock,
            sleep=self.clock.sleep,
        )
        self._arrivals: dict[int, float | None] = {}
        self._next_feedback = 0.1
        self._tasks: list[asyncio.Future[None]] | None = None
        self._reported = 0
        self._sequence = 0
        self.frames = 0
        self.received_bytes: list[tuple[float, int]] = []
        #: While set, each frame is this many bytes whatever the target (the avatar
        #: listening: a small idle loop); the next frame after it is set, a keyframe of
        #: ``keyframe_bytes``.
        self.frame_bytes: int | None = None
        self.keyframe_bytes: int | None = None

    async def _on_wire(self, data: bytes) -> None:
        header = parse_rtp(data)
        arrival = self.link.arrival(self.clock.now, len(data))
        if arrival is not None:
            self.received_bytes.append((arrival, len(data)))
        twcc = extension_elements(data, header).get(TWCC)
        if twcc is not None:
            self._arrivals[struct.unpack("!H", twcc)[0]] = arrival
        elif self.remb and arrival is not None:
            self._arrivals[len(self._arrivals)] = arrival

    async def run(self, until_s: float) -> None:
        """Go on with the call until ``until_s`` (virtual seconds)."""
        if self._tasks is None:
            self._queue: asyncio.Queue[bytes] = asyncio.Queue()
            self._tasks = [
                asyncio.ensure_future(self._send_loop()),
                asyncio.ensure_future(self.controller.run()),
            ]
        while self.clock.now < until_s:
            step = self.clock.now + 0.001
            if step >= self.frames * 0.04:
                self._frame()
            await self.clock.advance(step)
            for _ in range(3):  # the send loop takes what it can before the next step
                await asyncio.sleep(0)
            self._feedback()

    def _frame(self) -> None:
        """The encoder's next frame, of the size its target asks, to the send loop."""
        size = max(200, self.encoder.target_bitrate // 25 // 8)
        if self.keyframe_bytes is not None:
            size, self.keyframe_bytes = self.keyframe_bytes, None
        elif self.frame_bytes is not None:
            size = self.frame_bytes
        for offset in range(0, size, PACKET_BYTES):
            payload = b"\x65" * min(PACKET_BYTES, size - offset)
            data = bytearray(aiortc_packet(payload))
            struct.pack_into("!HI", data, 2, self._sequence & 0xFFFF, self.frames * 3600)
            self._sequence += 1
            self._queue.put_nowait(bytes(data))
        self.frames += 1

    async def _send_loop(self) -> None:
        """aiortc's sender: one packet after another, each awaited (the pacer's wait)."""
        while True:
            await self.sender.send(await self._queue.get())

    async def close(self) -> None:
        for task in self._tasks or []:
            task.cancel()
        await asyncio.gather(*(self._tasks or []), return_exceptions=True)

    def _feedback(self) -> None:
        if self.clock.now < self._next_feedback:
            return
        self._next_feedback += 0.1
        now = self.clock.now
        if self.remb:
            arrived = [a for a in self._arrivals.values() if a is not None and now - 1 < a <= now]
            rate = 8 * PACKET_BYTES * len(arrived)
            fci = pack_remb_fci(int(min(rate * 1.5, self.link.rate_bps * 0.9)), [VIDEO_SSRC])
            message = RtcpPsfbPacket(fmt=RTCP_PSFB_APP, ssrc=9, media_ssrc=0, fci=fci)
            self.controller.rtcp(bytes(message))
            return
        pending = sorted(self._arrivals)
        ready = []
        for sequence in pending:  # up to the first packet still on its way
            arrival = self._arrivals[sequence]
            if arrival is not None and arrival > now:
                break
            ready.append(self._arrivals.pop(sequence))
        if ready:
            self.controller.rtcp(transport_feedback(pending[0], ready, media_ssrc=VIDEO_SSRC))

    def received_bps(self, since: float, until: float) -> float:
        total = sum(size for at, size in self.received_bytes if since <= at < until)
        return 8 * total / (until - since)
