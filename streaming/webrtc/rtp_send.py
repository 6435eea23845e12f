"""A call's RTP loops, ours in place of aiortc's (``docs/design/rtp-send.md`` §20).

aiortc's sender loop takes the track's next frame, makes an ``RtpPacket`` object for each
of its payloads, serialises it and awaits the transport's send, which encrypts it
through pylibsrtp (two copies) and awaits aioice's send, for every packet. On a
listening call, that per-packet work was most of what the call cost
(``docs/performance/networks.md``). :func:`run_rtp_loop` is the loop each of the call's senders
runs instead (:func:`~streaming.webrtc.compat.run_rtp_with`): the same track, the same
packetiser (``aiortc``'s ``pack``, which our encoder fills), then our writer lays the
packets out in bytes (:class:`~streaming.link.rtp_writer.RtpWriter`), the link paces and
stamps them (:meth:`~streaming.link.sender.MediaSender.send_written`), and each is
protected in one buffer and handed to the socket
(:class:`~streaming.webrtc.compat.SrtpSocketSend`). Where that cannot go (a TURN relay)
a packet takes aiortc's transport send. What aiortc's sender reports and ``getStats``
read (packet and octet counts, the last RTP timestamp and its NTP time) is kept up to
date per packet.

Everything else stays aiortc's: RTCP (sender reports, receiving the caller's), ICE,
DTLS, and what the link does with NACK, PLI and the estimate.
"""

from __future__ import annotations

import logging
import random

from aiortc import RTCRtpCodecParameters
from aiortc.mediastreams import MediaStreamError

from streaming.link.rtp_writer import RtpWriter
from streaming.link.sender import MediaSender
from streaming.webrtc.compat import SenderLoop

logger = logging.getLogger(__name__)


async def run_rtp_loop(
    loop: SenderLoop,
    writer: RtpWriter,
    sender: MediaSender,
    codec: RTCRtpCodecParameters,
    *,
    video: bool,
) -> None:
    """Send the track's frames until it ends, the transport closes or the task is
    cancelled (by aiortc's ``stop()``, which waits for :meth:`SenderLoop.exited`)."""
    origin = random.getrandbits(32)  # RFC 3550 §5.1: a random first timestamp
    loop.started()
    try:
        while True:
            frame = await loop.next_frame(codec)
            if frame is None:
                continue
            payloads, timestamp = frame
            timestamp = (origin + timestamp) & 0xFFFFFFFF
            packets = writer.write(payloads, timestamp)
            await sender.send_written(packets, writer, video, loop.packet_sent)
    except (ConnectionError, MediaStreamError):
        pass
    except Exception:  # aiortc's loop logs and ends too: stop() must not hang on it
        logger.exception("RTP loop failed: %s", "video" if video else "audio")
    finally:  # cancelled too: aiortc's stop() cancels this task and waits for exited
        loop.exited()
