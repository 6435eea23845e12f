"""Per-packet cost of sending RTP: aiortc's path against lipstream's, in one run.

    .venv/bin/python -m benchmarks.rtp_send [--packets 20000] [--rounds 5]

Two aiortc peer connections are connected over loopback (real ICE, DTLS and SRTP), and
one sends 720p-sized video frames (five packets of 1,200 bytes) to the other in a tight
loop, three ways, alternating every round:

* ``aiortc``: what aiortc's RTP loop does per packet (an ``RtpPacket`` with mid and
  abs-send-time, serialised), then the DTLS transport's ``_send_rtp`` (pylibsrtp's
  protect, aioice's send);
* ``aiortc + link``: the same, through the link's ``MediaSender.send`` (parse, history,
  pacer, stamp) as every call's packets went before ``docs/design/rtp-send.md`` §20;
* ``lipstream``: ``RtpWriter`` + ``MediaSender.send_written`` + ``SrtpSocketSend``, the
  path calls take now.

The pacer is given a rate no frame reaches, so nothing waits. It prints the median CPU
(``time.process_time``) per packet of each and the ratios; the receiver's work is
excluded (it runs after each round). On a noisy 2-core VM compare the ratios, not the
microseconds. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtp import HeaderExtensionsMap, RtpPacket

from benchmarks.common import machine, print_table
from streaming.link import MediaSender, Pacer, Streams
from streaming.link.rtp_bytes import ABS_SEND_TIME_URI, MID_URI
from streaming.link.rtp_writer import RtpWriter, StreamLayout
from streaming.webrtc.compat import SrtpSocketSend, loopback_only_ice, transport_send

FRAME = [b"\x7c\x85" + b"\x55" * 1198] * 4 + [b"\x7c\x45" + b"\x55" * 600]
SSRC, PT, MID_ID, ABS_ID = 0x1234, 102, 1, 3


async def _connected() -> tuple[RTCPeerConnection, RTCPeerConnection]:
    sender, receiver = RTCPeerConnection(), RTCPeerConnection()
    sender.addTransceiver("video", direction="sendonly")
    await sender.setLocalDescription(await sender.createOffer())
    assert sender.localDescription is not None
    await receiver.setRemoteDescription(sender.localDescription)
    await receiver.setLocalDescription(await receiver.createAnswer())
    assert receiver.localDescription is not None
    await sender.setRemoteDescription(
        RTCSessionDescription(receiver.localDescription.sdp, "answer")
    )
    connected = asyncio.Event()

    def changed() -> None:
        if sender.connectionState == "connected":
            connected.set()

    sender.on("connectionstatechange", changed)
    if sender.connectionState != "connected":
        await connected.wait()
    return sender, receiver


def _extensions() -> HeaderExtensionsMap:
    extensions = HeaderExtensionsMap()
    extensions.configure(
        RTCRtpParameters(
            headerExtensions=[
                RTCRtpHeaderExtensionParameters(id=MID_ID, uri=MID_URI),
                RTCRtpHeaderExtensionParameters(id=ABS_ID, uri=ABS_SEND_TIME_URI),
            ]
        )
    )
    return extensions


def _aiortc_way(
    send: Callable[[bytes], Awaitable[None]], numbers: RtpWriter
) -> Callable[[int], Awaitable[None]]:
    """aiortc's per-packet work; sequence numbers go on from ``numbers``'s (SRTP refuses
    to protect a number twice)."""
    extensions = _extensions()

    async def frame(n: int) -> None:
        for i, payload in enumerate(FRAME):  # as RTCRtpSender._run_rtp
            packet = RtpPacket(payload_type=PT, sequence_number=numbers.sequence)
            numbers.sequence = (numbers.sequence + 1) & 0xFFFF
            packet.timestamp = n * 3600
            packet.ssrc = SSRC
            packet.payload = payload
            packet.marker = int(i == len(FRAME) - 1)
            packet.extensions.abs_send_time = 0
            packet.extensions.mid = "0"
            await send(packet.serialize(extensions))

    return frame


async def _round(frame: Callable[[int], Awaitable[None]], packets: int) -> float:
    frames = packets // len(FRAME)
    start = time.process_time()
    for n in range(frames):
        await frame(n)
    spent = time.process_time() - start
    await asyncio.sleep(0.3)  # the receiver drains (outside the measurement)
    return 1e6 * spent / (frames * len(FRAME))


async def run(packets: int, rounds: int) -> dict[str, list[float]]:
    with loopback_only_ice():
        pc, other = await _connected()
    try:
        transport = pc.getTransceivers()[0].sender.transport
        streams = Streams(video_ssrc=SSRC, abs_send_time_id=ABS_ID)
        fast = 10**12  # bits/s: the pacer never holds a packet

        def link() -> MediaSender:
            return MediaSender(streams, transport_send(transport), Pacer(fast))

        writer = RtpWriter(StreamLayout(SSRC, PT, "0", MID_ID, ABS_ID), first_sequence=0)
        ours = MediaSender(
            streams, transport_send(transport), Pacer(fast), send_now=SrtpSocketSend(transport)
        )

        async def lipstream(n: int) -> None:
            await ours.send_written(writer.write(FRAME, n * 3600), writer, True)

        ways: dict[str, Callable[[int], Awaitable[None]]] = {
            "aiortc": _aiortc_way(transport_send(transport), writer),
            "aiortc + link": _aiortc_way(link().send, writer),
            "lipstream": lipstream,
        }
        results: dict[str, list[float]] = {name: [] for name in ways}
        for r in range(rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for name in order:
                results[name].append(await _round(ways[name], packets))
        return results
    finally:
        await pc.close()
        await other.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packets", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = asyncio.run(run(args.packets, args.rounds))
    medians = {name: statistics.median(values) for name, values in results.items()}
    if args.json:
        print(json.dumps({"machine": machine(), "us_per_packet": results}))
        return
    base = medians["aiortc + link"]
    rows = [
        [name, f"{value:.1f}", f"{value / base:.2f}", " ".join(f"{v:.1f}" for v in results[name])]
        for name, value in medians.items()
    ]
    print_table(
        f"CPU per RTP packet, {args.packets} packets x {args.rounds} rounds",
        ["path", "us/packet (median)", "vs aiortc + link", "rounds"],
        rows,
    )


if __name__ == "__main__":
    main()
