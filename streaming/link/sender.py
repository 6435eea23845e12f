"""Every packet a call sends passes here on its way to encryption.

:meth:`MediaSender.send` stands in for the transport's send (``webrtc/compat.py`` hooks
it, ``docs/design/link.md`` §19). For each packet it:

- lets RTCP and audio through at once (audio is never paced, never waits for video);
- holds a video packet until the pacer lets it leave (:mod:`.pacer`), and remembers it
  for retransmission (:mod:`.history`);
- writes the absolute send time of the moment it actually leaves (a packet held by the
  pacer would otherwise tell the caller's delay estimator it queued on the link) and,
  when transport-cc was negotiated, the next transport-wide sequence number, noting
  when and how big it left (:class:`~.feedback.SentPackets`).

The video's sender reports are corrected on their way out: aiortc pairs an RTP
timestamp with the time its packet was handed over, which the pacer may have held back
by a frame time or more, while the audio's pairs carry no such wait; the caller's A/V
sync would take the difference for a video that lags and delay it to match. So each
video SR's NTP time is set to when the frame of its RTP timestamp came out of the
encoder, as libwebrtc stamps them (by capture time, not send time).

It also sends what the link controller asks for: retransmissions of NACKed packets (as
RTX when the caller negotiated it) and probes (:mod:`.probes`): recent packets resent as
RTX, or padding, at the probe's rate. Sent SRs are noted so that a receiver report's
LSR/DLSR gives the round trip.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from streaming.link.feedback import RateWindow, SentPackets
from streaming.link.history import SendHistory
from streaming.link.pacer import Pacer
from streaming.link.probes import Cluster
from streaming.link.rtcp_bytes import SR, RtcpPart, sender_report_lsr, split_compound
from streaming.link.rtp_bytes import (
    RtpHeader,
    abs_send_time,
    extension_elements,
    is_rtcp,
    padding_packet,
    parse_rtp,
    rtx_packet,
    with_extensions,
)
from streaming.link.rtp_writer import RtpWriter

#: Seconds from the NTP epoch (1900) to the Unix epoch (1970).
NTP_EPOCH_OFFSET = 2_208_988_800
#: Bytes a packet takes on the wire beyond its RTP bytes: SRTP tag, UDP, IPv4.
WIRE_OVERHEAD = 10 + 8 + 20
#: Resent packets under this size are padded out by padding packets in a probe.
PROBE_MIN_PACKET = 400

_SEQUENCE = struct.Struct("!H")
_TIMESTAMP = struct.Struct("!I")

Send = Callable[[bytes], Awaitable[None]]
#: Sends a plaintext packet at once if it can (True), else leaves it to :data:`Send`.
SendNow = Callable[[bytearray], bool]


@dataclass(frozen=True)
class Streams:
    """What the call sends on: the video SSRC, its RTX stream if negotiated, and the
    header extension ids the link writes (None: not negotiated)."""

    video_ssrc: int
    rtx_ssrc: int | None = None
    rtx_payload_type: int | None = None
    abs_send_time_id: int | None = None
    transport_cc_id: int | None = None


class MediaSender:
    """The call's send path below aiortc's senders (module doc)."""

    def __init__(
        self,
        streams: Streams,
        send: Send,
        pacer: Pacer,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        send_now: SendNow | None = None,
    ) -> None:
        self.streams = streams
        self._send = send
        self._send_now = send_now
        self.pacer = pacer
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self.sent = SentPackets()
        self.history = SendHistory()
        self.rate = RateWindow(1.0)
        self._rtx_sequence = random.randrange(0x8000)
        self._last_video_timestamp: int | None = None
        self._reports: OrderedDict[int, float] = OrderedDict()  # LSR → when the SR left
        self._handed: OrderedDict[int, float] = OrderedDict()  # video RTP ts → wall time
        self.video_packets = 0
        self.direct_packets = 0  # written packets sent by ``send_now``, not aiortc's send
        self.probe_packets = 0

    async def send(self, data: bytes) -> None:
        """Send ``data`` (serialised RTP or RTCP) as the module doc says."""
        if is_rtcp(data):
            await self._send(self._sender_reports(data))
            return
        try:
            header = parse_rtp(data)
        except ValueError:
            await self._send(data)
            return
        if header.ssrc == self.streams.video_ssrc:
            now = self._clock()
            self.history.add(header.sequence, data, now)
            self._handed_over(header.timestamp)
            self.video_packets += 1
            wait = self.pacer.wait_s(len(data), now)
            if wait > 0:
                await self._sleep(wait)
        await self._stamped(data, header, None)

    async def send_written(
        self,
        packets: list[bytearray],
        writer: RtpWriter,
        video: bool,
        on_sent: Callable[[int, int], None] | None = None,
    ) -> None:
        """One frame's ``packets`` from our own packetiser (:mod:`.rtp_writer`): as
        :meth:`send` does, with the header's layout known, so nothing is parsed and the
        send time and transport-wide sequence number are written in place.
        ``on_sent(payload_size, rtp_timestamp)`` is told of each packet once it is sent."""
        header_size = writer.header_size
        timestamp = _TIMESTAMP.unpack_from(packets[0], 4)[0] if packets else 0
        clock, sent, send_now = self._clock, self.sent, self._send_now
        abs_at, tcc_at = writer.abs_send_time_at, writer.transport_cc_at
        if video and packets:
            self._handed_over(timestamp)
        for packet in packets:
            now = clock()
            size = len(packet) + WIRE_OVERHEAD
            if video:
                self.video_packets += 1
                wait = self.pacer.wait_s(len(packet), now)
                if wait > 0:
                    await self._sleep(wait)
                    now = clock()
            if abs_at >= 0:
                packet[abs_at : abs_at + 3] = abs_send_time(self._wall_clock())
            if tcc_at >= 0:
                _SEQUENCE.pack_into(packet, tcc_at, sent.next_sequence())
                sent.sent(now, size, None)
            if video:  # as sent, for a NACK
                self.history.add(_SEQUENCE.unpack_from(packet, 2)[0], bytes(packet), now)
            self.rate.add(now, size)
            if send_now is not None and send_now(packet):
                self.direct_packets += 1
            else:
                await self._send(bytes(packet))
            if on_sent is not None:
                on_sent(len(packet) - header_size, timestamp)

    def _handed_over(self, timestamp: int) -> None:
        """A video frame stamped ``timestamp`` came from the encoder now (for its SR)."""
        self._last_video_timestamp = timestamp
        if timestamp not in self._handed:
            self._handed[timestamp] = self._wall_clock()
            while len(self._handed) > 64:
                self._handed.popitem(last=False)

    async def _stamped(self, data: bytes, header: RtpHeader, cluster: int | None) -> None:
        streams, values = self.streams, {}
        if streams.abs_send_time_id is not None and (
            streams.abs_send_time_id in extension_elements(data, header)
        ):
            values[streams.abs_send_time_id] = abs_send_time(self._wall_clock())
        now = self._clock()
        if streams.transport_cc_id is not None:
            values[streams.transport_cc_id] = self.sent.next_sequence().to_bytes(2, "big")
        out = with_extensions(data, header, values)
        if streams.transport_cc_id is not None:
            self.sent.sent(now, len(out) + WIRE_OVERHEAD, cluster)
        self.rate.add(now, len(out) + WIRE_OVERHEAD)
        await self._send(out)

    # -- what the controller asks for --------------------------------------------------

    async def retransmit(self, sequences: list[int], rtt_s: float, budget_bps: float) -> int:
        """Resend the NACKed ``sequences`` still held (module doc); how many were sent."""
        sent = 0
        for sequence in sequences:
            now = self._clock()
            data = self.history.for_resend(sequence, now, rtt_s, budget_bps)
            if data is None:
                continue
            packet = self._as_rtx(data)
            self.pacer.spend(len(packet), now)
            await self._stamped(packet, parse_rtp(packet), None)
            sent += 1
        return sent

    def _as_rtx(self, data: bytes) -> bytes:
        streams = self.streams
        if streams.rtx_ssrc is None or streams.rtx_payload_type is None:
            return data  # no RTX negotiated: the packet again, as it was
        self._rtx_sequence = (self._rtx_sequence + 1) & 0xFFFF
        return rtx_packet(
            data,
            parse_rtp(data),
            payload_type=streams.rtx_payload_type,
            sequence=self._rtx_sequence,
            ssrc=streams.rtx_ssrc,
        )

    @property
    def can_probe(self) -> bool:
        """Probes need transport-cc (to see them arrive) and RTX (to carry them)."""
        streams = self.streams
        return streams.transport_cc_id is not None and streams.rtx_ssrc is not None

    async def probe(self, cluster: Cluster) -> bool:
        """Send ``cluster``'s packets at its rate; False if there was nothing to send
        them with (no RTX, or no video sent yet)."""
        last, streams = self._last_video_timestamp, self.streams
        if not self.can_probe or last is None:
            return False
        assert streams.rtx_ssrc is not None
        assert streams.rtx_payload_type is not None
        resent = [p for p in self.history.latest(cluster.packets) if len(p) >= PROBE_MIN_PACKET]
        for index in range(cluster.packets):
            if index < len(resent):
                packet = self._as_rtx(resent[index])
            else:
                self._rtx_sequence = (self._rtx_sequence + 1) & 0xFFFF
                packet = padding_packet(
                    payload_type=streams.rtx_payload_type,
                    sequence=self._rtx_sequence,
                    timestamp=last,
                    ssrc=streams.rtx_ssrc,
                    size=255 + 12,
                )
            now = self._clock()
            self.pacer.spend(len(packet), now)
            self.probe_packets += 1
            await self._stamped(packet, parse_rtp(packet), cluster.ident)
            if index < cluster.packets - 1:
                await self._sleep(8 * (len(packet) + WIRE_OVERHEAD) / cluster.rate_bps)
        return True

    # -- round trips -------------------------------------------------------------------

    def _sender_reports(self, data: bytes) -> bytes:
        """``data`` with the video SR's NTP time corrected (module doc); notes when
        each SR left, for the round trip."""
        out = bytearray()
        for part in split_compound(data):
            packet = part.data
            if part.packet_type == SR and len(packet) >= 20:
                ssrc, rtp_timestamp = (
                    struct.unpack_from("!I", packet, 4)[0],
                    struct.unpack_from("!I", packet, 16)[0],
                )
                handed = (
                    self._handed.get(rtp_timestamp) if ssrc == self.streams.video_ssrc else None
                )
                if handed is not None:
                    ntp = int((handed + NTP_EPOCH_OFFSET) * (1 << 32)) & 0xFFFFFFFFFFFFFFFF
                    packet = packet[:8] + ntp.to_bytes(8, "big") + packet[16:]
                sent = sender_report_lsr(RtcpPart(part.packet_type, part.fmt, packet))
                if sent is not None and sent[0] == self.streams.video_ssrc:
                    self._reports[sent[1]] = self._clock()
                    while len(self._reports) > 16:
                        self._reports.popitem(last=False)
            out += packet
        return bytes(out) if out else data

    def round_trip_s(self, lsr: int, dlsr_s: float) -> float | None:
        """The round trip a receiver report's LSR and DLSR give, if we sent that SR."""
        sent_at = self._reports.get(lsr)
        if sent_at is None or lsr == 0:
            return None
        rtt = self._clock() - sent_at - dlsr_s
        return rtt if rtt >= 0 else None
