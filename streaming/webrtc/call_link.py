"""The call's link, set up on its peer connection (``docs/architecture.md`` §19).

:func:`open_link` makes a call's :class:`~streaming.link.LinkController` once the answer
is made: it reads what the two sides negotiated (the video's SSRC and its RTX stream,
the header extension ids, whether the caller offered transport-cc), builds the link's
sender on the video transport's own send, routes every packet out and every RTCP
packet in through the link (``webrtc/compat.py``), and returns the answer with
transport-cc added when the caller offered it.
"""

from __future__ import annotations

from collections.abc import Callable

from aiortc import RTCRtpCodecParameters, RTCRtpTransceiver
from aiortc.codecs import is_rtx

from streaming.link import LinkController, MediaSender, Pacer, Streams
from streaming.webrtc.answer_sdp import abs_send_time_id, offers_transport_cc, with_transport_cc
from streaming.webrtc.compat import (
    negotiated_codecs,
    route_transport,
    sender_ssrcs,
    transport_send,
)
from streaming.webrtc.video_encoder import LipstreamH264Encoder


def open_link(
    video: RTCRtpTransceiver,
    codec: RTCRtpCodecParameters,
    encoder: LipstreamH264Encoder,
    *,
    offer: str,
    answer: str,
    fps: int,
    audio: bool,
    on_audio_loss: Callable[[float], None] | None,
) -> tuple[LinkController, str]:
    """The call's link on ``video``'s transport (it sends ``codec`` with ``encoder``),
    and the answer to send; the caller runs :meth:`LinkController.run` as a task."""
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
    sender = MediaSender(streams, transport_send(transport), Pacer(encoder.target_bitrate))
    link = LinkController(
        sender,
        encoder,
        top_bps=encoder.config.bitrate,
        fps=fps,
        audio=audio,
        on_audio_loss=on_audio_loss,
    )
    route_transport(transport, sender.send, link.rtcp)
    if transport_cc is not None:
        answer = with_transport_cc(answer, transport_cc)
    return link, answer
