"""What the answer adds to aiortc's (transport-cc when offered, Opus in-band FEC and DTX),
and what the offer asks of our audio (DTX)."""

from __future__ import annotations

from aiortc import RTCPeerConnection, RTCSessionDescription, sdp

from streaming.link.rtp_bytes import ABS_SEND_TIME_URI, TRANSPORT_CC_URI
from streaming.webrtc.answer_sdp import (
    abs_send_time_id,
    extension_id,
    offers_transport_cc,
    with_opus_params,
    with_transport_cc,
)
from streaming.webrtc.offer_check import OfferLimits, check_offer

#: An offer as Chromium makes one (trimmed to what matters: BUNDLE, Opus, H.264, RTX,
#: its header extensions and feedback), host candidates only.
CHROMIUM_OFFER = "\r\n".join(
    [
        "v=0",
        "o=- 4611731400430051336 2 IN IP4 127.0.0.1",
        "s=-",
        "t=0 0",
        "a=group:BUNDLE 0 1",
        "a=msid-semantic: WMS",
        "m=audio 9 UDP/TLS/RTP/SAVPF 111",
        "c=IN IP4 0.0.0.0",
        "a=rtcp:9 IN IP4 0.0.0.0",
        "a=ice-ufrag:abcd",
        "a=ice-pwd:abcdefghijklmnopqrstuvwx",
        "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
        "a=setup:actpass",
        "a=mid:0",
        "a=extmap:1 urn:ietf:params:rtp-hdrext:ssrc-audio-level",
        f"a=extmap:2 {ABS_SEND_TIME_URI}",
        f"a=extmap:3 {TRANSPORT_CC_URI}",
        "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid",
        "a=recvonly",
        "a=rtcp-mux",
        "a=rtpmap:111 opus/48000/2",
        "a=rtcp-fb:111 transport-cc",
        "a=fmtp:111 minptime=10;useinbandfec=1",
        "m=video 9 UDP/TLS/RTP/SAVPF 102 103",
        "c=IN IP4 0.0.0.0",
        "a=rtcp:9 IN IP4 0.0.0.0",
        "a=ice-ufrag:abcd",
        "a=ice-pwd:abcdefghijklmnopqrstuvwx",
        "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
        "a=setup:actpass",
        "a=mid:1",
        f"a=extmap:2 {ABS_SEND_TIME_URI}",
        f"a=extmap:3 {TRANSPORT_CC_URI}",
        "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid",
        "a=recvonly",
        "a=rtcp-mux",
        "a=rtcp-rsize",
        "a=rtpmap:102 H264/90000",
        "a=rtcp-fb:102 goog-remb",
        "a=rtcp-fb:102 transport-cc",
        "a=rtcp-fb:102 ccm fir",
        "a=rtcp-fb:102 nack",
        "a=rtcp-fb:102 nack pli",
        "a=fmtp:102 level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f",
        "a=rtpmap:103 rtx/90000",
        "a=fmtp:103 apt=102",
        "",
    ]
)


async def test_the_offers_transport_cc_is_found_and_named_in_every_section() -> None:
    assert offers_transport_cc(CHROMIUM_OFFER) == 3
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio", direction="sendonly")
        pc.addTransceiver("video", direction="sendonly")
        await pc.setRemoteDescription(RTCSessionDescription(CHROMIUM_OFFER, "offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        answer = pc.localDescription.sdp
    finally:
        await pc.close()
    assert "transport-cc" not in answer  # aiortc knows no transport-cc
    assert abs_send_time_id(answer) == 2  # the offer's id for aiortc's abs-send-time
    munged = with_opus_params(with_transport_cc(answer, 3), dtx=True)
    parsed = sdp.SessionDescription.parse(munged)  # still an SDP aiortc reads
    for media in parsed.media:
        assert extension_id(munged, TRANSPORT_CC_URI, media.kind) == 3
        feedback = {(c.payloadType, f.type) for c in media.rtp.codecs for f in c.rtcpFeedback}
        primary = [c.payloadType for c in media.rtp.codecs if c.name.lower() != "rtx"]
        assert all((pt, "transport-cc") in feedback for pt in primary)
    (audio,) = [m for m in parsed.media if m.kind == "audio"]
    (opus,) = [c for c in audio.rtp.codecs if c.name.lower() == "opus"]
    assert opus.parameters.get("useinbandfec") == 1
    assert opus.parameters.get("usedtx") == "1"  # the caller's silence as DTX
    assert with_transport_cc(munged, 3) == munged  # nothing twice
    assert with_opus_params(munged, dtx=True) == munged


def test_an_offer_without_transport_cc_feedback_is_not_given_it() -> None:
    no_feedback = CHROMIUM_OFFER.replace("a=rtcp-fb:102 transport-cc\r\n", "")
    assert offers_transport_cc(no_feedback) is None
    no_extension = CHROMIUM_OFFER.replace(f"a=extmap:3 {TRANSPORT_CC_URI}\r\n", "")
    assert offers_transport_cc(no_extension) is None


def test_an_opus_format_without_parameters_gets_them() -> None:
    answer = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 opus/48000/2\r\n"
    assert "a=fmtp:96 useinbandfec=1;usedtx=1" in with_opus_params(answer, dtx=True)
    assert "a=fmtp:96 useinbandfec=1\r\n" in with_opus_params(answer, dtx=False)
    existing = answer + "a=fmtp:96 minptime=10;usedtx=0\r\n"  # the answer's own word stays
    assert "a=fmtp:96 minptime=10;usedtx=0;useinbandfec=1\r\n" in with_opus_params(
        existing, dtx=True
    )


def test_an_offer_asking_for_opus_dtx_is_told_apart() -> None:
    plain = check_offer(CHROMIUM_OFFER, OfferLimits())
    assert not plain.opus_dtx  # usedtx defaults to 0 (RFC 7587): the caller gets 50 a second
    asking = CHROMIUM_OFFER.replace("useinbandfec=1", "useinbandfec=1;usedtx=1")
    assert check_offer(asking, OfferLimits()).opus_dtx
    declining = CHROMIUM_OFFER.replace("useinbandfec=1", "useinbandfec=1;usedtx=0")
    assert not check_offer(declining, OfferLimits()).opus_dtx
