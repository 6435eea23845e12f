"""The call's link, set up on its peer connection (``docs/design/link.md`` §19).

:func:`open_link` makes a call's :class:`~streaming.link.LinkController` once the answer
is made: it reads what the two sides negotiated (the video's SSRC and its RTX stream,
the header extension ids, whether the caller offered transport-cc), builds the link's
sender on the video transport's own send, routes every packet out and every RTCP
packet in through the link (``webrtc/compat.py``), and returns the answer with
transport-cc added when the caller offered it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from aiortc import RTCRtpCodecParameters, RTCRtpTransceiver
from aiortc.codecs import is_rtx

from streaming.link import LinkController, MediaSender, Pacer, Streams
from streaming.link.rtp_bytes import ABS_SEND_TIME_URI, MID_URI
from streaming.link.rtp_writer import RtpWriter, StreamLayout
from streaming.webrtc.answer_sdp import (
    abs_send_time_id,
    extension_id,
    offers_transport_cc,
    with_transport_cc,
)
from streaming.webrtc.compat import (
    SenderLoop,
    SrtpSocketSend,
    negotiated_codecs,
    route_transport,
    run_rtp_with,
    sender_ssrcs,
    transport_send,
)
from streaming.webrtc.rtp_send import run_rtp_loop
from streaming.webrtc.video_encoder import LipstreamH264Encoder


def open_link(
    video: RTCRtpTransceiver,
    codec: RTCRtpCodecParameters,
    encoder: LipstreamH264Encoder,
    *,
    offer: str,
    answer: str,
    fps: int,
    audio: RTCRtpTransceiver | None,
    on_audio_loss: Callable[[float], None] | None,
) -> tuple[LinkController, str]:
    """The call's link on ``video``'s transport (it sends ``codec`` with ``encoder``),
    and the answer to send; the caller runs :meth:`LinkController.run` as a task.

    The video's sender, and ``audio``'s when it shares the transport (BUNDLE), run our
    RTP loop (``webrtc/rtp_send.py``) in place of aiortc's."""
    transport_cc = offers_transport_cc(offer)
    ssrc, rtx_ssrc = sender_ssrcs(video.sender)
    rtx = [
        c.payloadType
        for c in negotiated_codecs(video)
        if is_rtx(c) and c.parameters.get("apt") == codec.payloadType
    ]
    streams = Streams(
        video_ssrc=ssrc,
        rtx_ssrc=rtx_ssrc if rtx else None,
        rtx_payload_type=rtx[0] if rtx else None,
        abs_send_time_id=abs_send_time_id(answer),
        transport_cc_id=transport_cc,
    )
    transport = video.sender.transport
    sender = MediaSender(
        streams,
        transport_send(transport),
        Pacer(encoder.target_bitrate),
        send_now=SrtpSocketSend(transport),
    )
    link = LinkController(
        sender,
        encoder,
        top_bps=encoder.config.bitrate,
        fps=fps,
        audio=audio is not None,
        on_audio_loss=on_audio_loss,
    )
    route_transport(transport, sender.send, link.rtcp)
    _send_our_way(video, sender, answer, transport_cc, video=True)
    if audio is not None and audio.sender.transport is transport:
        _send_our_way(audio, sender, answer, transport_cc, video=False)
    if transport_cc is not None:
        answer = with_transport_cc(answer, transport_cc)
    return link, answer


def _send_our_way(
    transceiver: RTCRtpTransceiver,
    sender: MediaSender,
    answer: str,
    transport_cc: int | None,
    *,
    video: bool,
) -> None:
    """``transceiver``'s sender runs our RTP loop, with the extensions the answer gave
    its section (and transport-cc, which the link adds to the answer)."""
    kind = transceiver.kind
    loop = SenderLoop(transceiver.sender)
    ssrc = sender_ssrcs(transceiver.sender)[0]
    mid_id = extension_id(answer, MID_URI, kind)
    abs_id = extension_id(answer, ABS_SEND_TIME_URI, kind)

    async def run(codec: RTCRtpCodecParameters) -> None:
        layout = StreamLayout(
            ssrc=ssrc,
            payload_type=codec.payloadType or 0,
            mid=transceiver.mid,
            mid_id=mid_id,
            abs_send_time_id=abs_id,
            transport_cc_id=transport_cc,
        )
        writer = RtpWriter(layout, first_sequence=random.randrange(0x8000))
        await run_rtp_loop(loop, writer, sender, codec, video=video)

    run_rtp_with(transceiver.sender, run)
