"""Checks on an SDP offer before a peer connection is made for it.

aiortc parses whatever it is given: a 906 KiB offer with 15,000 candidates stalls the
event loop for about 20 s, and malformed offers raise from deep inside it or leave
internal tasks failing later (``docs/design/webrtc.md`` §6). So first the raw text is
checked against size limits in one pass (microseconds, whatever the offer), then it is
parsed with aiortc's own SDP parser and every section we would answer is checked for
what a connection needs. A bad offer is refused before a peer connection exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiortc import sdp as aiortc_sdp

from streaming.exceptions import OfferError

_MID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
_ICE_UFRAG = re.compile(r"^[A-Za-z0-9+/]{4,256}$")  # ice-char, RFC 8839
_ICE_PWD = re.compile(r"^[A-Za-z0-9+/]{22,256}$")
_FINGERPRINT = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){19,63}$")
_FINGERPRINT_ALGORITHMS = {"sha-1", "sha-224", "sha-256", "sha-384", "sha-512"}
_CODECS = {
    "audio": {"audio/opus", "audio/pcmu", "audio/pcma", "audio/g722"},
    "video": {"video/h264", "video/vp8"},
}


@dataclass(frozen=True)
class OfferLimits:
    """What an offer may contain."""

    max_bytes: int = 64 * 1024
    max_media: int = 3
    max_candidates_per_media: int = 20
    max_line_chars: int = 4096
    #: Whether the offer must receive video (a call, a viewer); a WHIP publisher's
    #: offer need not, and must send audio instead.
    video: bool = True


@dataclass(frozen=True)
class OfferInfo:
    """What the answer must cover."""

    kinds: frozenset[str]
    offers_h264: bool
    #: The caller asks for Opus DTX (``usedtx=1`` on its first Opus format).
    opus_dtx: bool = False


def check_offer(sdp: str, limits: OfferLimits) -> OfferInfo:
    """Raise :class:`OfferError` naming the first problem; else describe the offer."""
    _check_text(sdp, limits)
    try:
        description = aiortc_sdp.SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc's parser raises many types on bad input
        raise OfferError(f"the offer cannot be parsed: {exc!r}"[:300]) from None
    kinds: list[str] = []
    mids: set[str] = set()
    offers_h264 = opus_dtx = False
    for number, media in enumerate(description.media, start=1):
        where = f"media section {number} ({media.kind})"
        if media.kind not in (*_CODECS, "application"):
            raise OfferError(f"{where}: only audio, video and a data channel are supported")
        if media.kind in kinds:
            raise OfferError(f"{where}: send one {media.kind} section, not several")
        kinds.append(media.kind)
        mid = media.rtp.muxId
        if not mid or not _MID.match(mid) or mid in mids:
            raise OfferError(f"{where}: needs a unique a=mid token")
        mids.add(mid)
        ice = media.ice
        if (
            ice is None
            or not _ICE_UFRAG.match(ice.usernameFragment or "")
            or not _ICE_PWD.match(ice.password or "")
        ):
            raise OfferError(f"{where}: needs a well-formed a=ice-ufrag and a=ice-pwd")
        if media.dtls is None or not media.dtls.fingerprints:
            raise OfferError(f"{where}: needs an a=fingerprint")
        for fingerprint in media.dtls.fingerprints:
            algorithm = str(fingerprint.algorithm).lower()
            if algorithm not in _FINGERPRINT_ALGORITHMS or not _FINGERPRINT.match(
                str(fingerprint.value)
            ):
                raise OfferError(f"{where}: malformed a=fingerprint")
        if media.dtls.role not in ("auto", "client", "server"):
            raise OfferError(f"{where}: a=setup must be actpass, active or passive")
        if media.kind == "application":  # the caller's events channel (docs/apps.md)
            if "SCTP" not in str(media.profile) or media.fmt != ["webrtc-datachannel"]:
                raise OfferError(
                    f"{where}: a data channel must be UDP/DTLS/SCTP webrtc-datachannel"
                )
            continue
        if media.direction not in ("sendrecv", "sendonly", "recvonly", "inactive"):
            raise OfferError(f"{where}: unknown direction {media.direction!r}")
        codecs = {str(c.mimeType).lower() for c in media.rtp.codecs}
        if not codecs & _CODECS[media.kind]:
            wanted = ", ".join(sorted(_CODECS[media.kind]))
            raise OfferError(f"{where}: offers none of the codecs we speak ({wanted})")
        offers_h264 = offers_h264 or "video/h264" in codecs
        if media.kind == "audio":
            opus = [c for c in media.rtp.codecs if str(c.mimeType).lower() == "audio/opus"]
            opus_dtx = bool(opus) and str(opus[0].parameters.get("usedtx")) == "1"
    if limits.video and "video" not in kinds:
        raise OfferError("the offer has no video section: add a recvonly video transceiver")
    if not limits.video and "audio" not in kinds:
        raise OfferError("a WHIP offer must send audio (the avatar speaks it); this one has none")
    for group in description.group:
        if group.semantic == "BUNDLE" and set(map(str, group.items)) != mids:
            raise OfferError("a=group:BUNDLE must list exactly the offer's media sections")
    return OfferInfo(frozenset(kinds), offers_h264, opus_dtx)


def _check_text(sdp: str, limits: OfferLimits) -> None:
    size = len(sdp.encode("utf-8", errors="replace"))
    if size > limits.max_bytes:
        raise OfferError(f"the offer is {size} bytes; at most {limits.max_bytes} are accepted")
    if "\x00" in sdp:
        raise OfferError("the offer contains NUL characters")
    if not sdp.startswith("v=0"):
        raise OfferError("the offer is not SDP: it must start with 'v=0'")
    media = 0
    candidates = 0
    for number, line in enumerate(sdp.splitlines(), start=1):
        if len(line) > limits.max_line_chars:
            raise OfferError(
                f"line {number} of the offer has {len(line)} characters; "
                f"at most {limits.max_line_chars}"
            )
        if line.startswith("m="):
            media += 1
            candidates = 0
            if media > limits.max_media:
                raise OfferError(
                    f"the offer has more than {limits.max_media} media sections; "
                    "send one audio, one video and at most one data channel section"
                )
        elif line.startswith("a=candidate:"):
            candidates += 1
            if candidates > limits.max_candidates_per_media:
                raise OfferError(
                    f"media section {media} has more than {limits.max_candidates_per_media} "
                    "ICE candidates"
                )
    if media == 0:
        raise OfferError("the offer has no media section: add audio and video transceivers")
