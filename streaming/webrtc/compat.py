"""Every use of aiortc, aioice and pylibsrtp internals, in one place.

aiortc has no public way to do a few things lipstream needs: give a sender our own H.264
encoder (and read its bitrate back), give an audio receiver a buffer that does not hold
packets back (``streaming/webrtc/audio_receive.py``), see which codec a transceiver
negotiated, take the caller's RTP in aioice's callback (``webrtc/rtp_receive.py``),
stop an ICE consent task that would outlive its connection, gather only loopback candidates
in a sandbox, answer as the DTLS server, and say why a DTLS handshake failed. Each
private attribute or hook used for that is listed in
:data:`INTERNALS` and reached only through the functions here; no other module touches
aiortc's or aioice's private state (``docs/design/webrtc.md`` §6).

:func:`missing_internals` builds a real peer connection and lists what the installed
aiortc/aioice no longer has; ``tests/test_webrtc_compat.py`` fails naming each one, and
the server logs them at start (:func:`report_missing_internals`). ``pyproject.toml``
pins aiortc, aioice and pylibsrtp to the versions in :data:`TESTED_VERSIONS`: an upgrade is a
change to review here first. Why one module of about 400 lines: it is the one place
that touches aiortc's and aioice's private state (a test holds every other module to
that), so an upgrade is reviewed in one file.

The consent-task leak: aioice (0.13) starts its consent-freshness task (RFC 7675) at the
end of ``Connection.connect()``, and aiortc runs that ``connect()`` in a task that
``RTCPeerConnection.close()`` does not cancel. A call hung up while ICE is finishing
(the caller hangs up at once, an ICE timeout, a DELETE during set-up) therefore gets its
consent task created *after* the connection closed: nothing cancels it, and it wakes
every ~5 s for the life of the process, holding the connection's objects (one such task
per side for every call hung up during ICE; tests/test_cycles.py).
:func:`close_peer_connection` makes a consent check that starts after the close a no-op
before closing; a check already running is cancelled by aioice's own ``close()``.

The DTLS role (issue 16): aiortc answers an ``a=setup:actpass`` offer with ``active``,
so it is the DTLS client and offers only ECDHE-ECDSA cipher suites; a caller whose
certificate is RSA is then a DTLS server that cannot pick any of them, and fails with
OpenSSL's "no shared cipher" (GStreamer's webrtcbin, whose default certificate is RSA).
:func:`answer_as_dtls_server` makes the answer ``a=setup:passive`` instead: the server
is the DTLS server with its own ECDSA certificate, so it chooses the suite, and every
client can negotiate ECDHE-ECDSA whatever its own certificate (a client's certificate
only signs; OpenSSL accepts RSA and ECDSA there). The alternative, adding ECDHE-RSA
suites to aiortc's client, means replacing aiortc's private SSL context for every
handshake and still leaves the server at the mercy of each caller's certificate type.
RFC 5763 recommends ``active`` in answers because the answerer may start DTLS before
the offerer has the answer; lipstream's callers cannot start ICE before they have the
answer (no trickle), so ``passive`` costs no round trip. An offer that says ``active``
or ``passive`` gets the role it asked for.

Why a handshake failed (:class:`DtlsFailure`): aiortc reports only a "failed" state,
and the OpenSSL error is usually raised where aiortc reads a handshake record and
discards it. While a transport shakes hands its OpenSSL connection is wrapped to keep
the first error (e.g. "tls alert handshake failure" as DTLS client, "no shared cipher"
as DTLS server); a handshake that completed but failed aiortc's checks is told apart as
a fingerprint mismatch or no common SRTP profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import aioice
import aioice.ice
import pylibsrtp
from aiortc import (
    RTCDtlsTransport,
    RTCPeerConnection,
    RTCRtpCodecParameters,
    RTCRtpSender,
    RTCRtpTransceiver,
)
from aiortc import clock as aiortc_clock
from aiortc import sdp as aiortc_sdp
from aiortc.codecs.h264 import H264Encoder
from aiortc.rtcdtlstransport import State as DtlsState
from OpenSSL import SSL
from pylibsrtp import SRTP_MAX_TRAILER_LEN
from pylibsrtp._binding import ffi as srtp_ffi
from pylibsrtp._binding import lib as srtp_lib

logger = logging.getLogger(__name__)

#: The releases whose internals this module was written and tested against.
TESTED_VERSIONS = {"aiortc": "1.16.0", "aioice": "0.13.0", "pylibsrtp": "1.0.0"}

_SENDER_ENCODER = "_RTCRtpSender__encoder"  # name-mangled ``RTCRtpSender.__encoder``
_RECEIVER_CODECS = "_RTCRtpReceiver__codecs"  # name-mangled ``RTCRtpReceiver.__codecs``
_RECEIVER_JITTER = "_RTCRtpReceiver__jitter_buffer"  # ``RTCRtpReceiver.__jitter_buffer``
_SENDER_KEYFRAME = "_send_keyframe"  # RTCRtpSender's reaction to a PLI or FIR
_TRANSCEIVER_CODECS = "_codecs"
_ICE_CONNECTION = "_connection"
_DTLS_SET_ROLE = "_set_role"
_DTLS_ROLE = "_role"
_DTLS_SSL = "_ssl"
_DTLS_HANDSHAKE = "_do_handshake"
_DTLS_SEND_RTP = "_send_rtp"  # every RTP and RTCP packet a transport sends, before SRTP
_DTLS_HANDLE_RTCP = "_handle_rtcp_data"  # every compound RTCP packet it receives
_SENDER_SSRC = "_ssrc"
_SENDER_RTX_SSRC = "_rtx_ssrc"
# The sender's RTP loop, replaced by ours, and the state aiortc's other methods share with it.
_SENDER_RUN_RTP = "_run_rtp"
_SENDER_NEXT_FRAME = "_next_encoded_frame"
_SENDER_TRACK = "_RTCRtpSender__track"
_SENDER_RTP_STARTED = "_RTCRtpSender__rtp_started"
_SENDER_RTP_EXITED = "_RTCRtpSender__rtp_exited"
_SENDER_NTP = "_RTCRtpSender__ntp_timestamp"  # the last packet's, for the next SR
_SENDER_RTP_TIMESTAMP = "_RTCRtpSender__rtp_timestamp"
_SENDER_OCTETS = "_RTCRtpSender__octet_count"
_SENDER_PACKETS = "_RTCRtpSender__packet_count"
_DTLS_STATE = "_state"  # behind the ``state`` property, which formats an enum per call
_DTLS_TX_SRTP = "_tx_srtp"  # the transport's outbound pylibsrtp.Session
_DTLS_TX_BYTES = "_RTCDtlsTransport__tx_bytes"
_DTLS_TX_PACKETS = "_RTCDtlsTransport__tx_packets"
_SRTP_CONTEXT = "_srtp"  # pylibsrtp.Session's srtp_t
# The caller's packets, straight from the socket (webrtc/rtp_receive.py).
_ICE_DATA_RECEIVED = "data_received"  # aioice.Connection: every datagram that is not STUN
_DTLS_RX_SRTP = "_rx_srtp"  # the transport's inbound pylibsrtp.Session, once keyed
_DTLS_HANDLE_RTP = "_handle_rtp_data"  # parse, route to a receiver, hand it the packet
_DTLS_RX_BYTES = "_RTCDtlsTransport__rx_bytes"
_DTLS_RX_PACKETS = "_RTCDtlsTransport__rx_packets"
_ICE_NOMINATED = "_nominated"  # aioice.Connection's chosen pair per component


@dataclass(frozen=True)
class Internal:
    """One private attribute or hook of aiortc/aioice that lipstream relies on."""

    owner: str
    name: str
    used_for: str


INTERNALS: tuple[Internal, ...] = (
    Internal("aiortc.RTCRtpSender", _SENDER_ENCODER, "install our H.264 encoder; read its bitrate"),
    Internal("aiortc.RTCRtpSender", _SENDER_KEYFRAME, "PLI/FIR reach frames we encode ourselves"),
    Internal("aiortc.RTCRtpTransceiver", _TRANSCEIVER_CODECS, "the codec a transceiver negotiated"),
    Internal("aiortc.RTCRtpReceiver", _RECEIVER_CODECS, "the codecs a receiver accepts"),
    Internal("aiortc.RTCRtpReceiver", _RECEIVER_JITTER, "audio packets on at once, not prefetched"),
    Internal("aiortc.RTCIceTransport", _ICE_CONNECTION, "its aioice Connection (consent checks)"),
    Internal("aioice.Connection", "query_consent", "made a no-op once a connection closes"),
    Internal("aioice.ice", "get_host_addresses", "gather loopback candidates only"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_SET_ROLE, "answer actpass as the DTLS server"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_ROLE, "our DTLS role, named when it fails"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_HANDSHAKE, "wrapped: keep the handshake's error"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_SSL, "its OpenSSL connection: errors, SRTP"),
    Internal("aiortc.RTCDtlsTransport", "encrypted", "whether the handshake itself completed"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_SEND_RTP, "every packet out: the call's link"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_HANDLE_RTCP, "the caller's RTCP: the link first"),
    Internal("aiortc.RTCRtpSender", _SENDER_SSRC, "the video stream the link paces"),
    Internal("aiortc.RTCRtpSender", _SENDER_RTX_SSRC, "the stream retransmissions go on"),
    Internal("aiortc.RTCRtpSender", _SENDER_RUN_RTP, "replaced: our packets, our send"),
    Internal("aiortc.RTCRtpSender", _SENDER_NEXT_FRAME, "the track's next packet, packetised"),
    Internal("aiortc.RTCRtpSender", _SENDER_TRACK, "stopped when our RTP loop ends"),
    Internal("aiortc.RTCRtpSender", _SENDER_RTP_STARTED, "set: stop() waits for it"),
    Internal("aiortc.RTCRtpSender", _SENDER_RTP_EXITED, "set: stop() waits for it"),
    Internal("aiortc.RTCRtpSender", _SENDER_NTP, "what aiortc's sender reports say"),
    Internal("aiortc.RTCRtpSender", _SENDER_RTP_TIMESTAMP, "what aiortc's sender reports say"),
    Internal("aiortc.RTCRtpSender", _SENDER_OCTETS, "sender reports and getStats"),
    Internal("aiortc.RTCRtpSender", _SENDER_PACKETS, "sender reports and getStats"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_STATE, "connected? per packet, no enum str"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_TX_SRTP, "protect our packets in our buffer"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_TX_BYTES, "transport stats count our packets"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_TX_PACKETS, "transport stats count our packets"),
    Internal("pylibsrtp.Session", _SRTP_CONTEXT, "srtp_protect on our own buffer"),
    Internal("aioice.Connection", _ICE_NOMINATED, "the UDP socket our packets leave by"),
    Internal("aioice.Connection", _ICE_DATA_RECEIVED, "wrapped: the caller's RTP at once"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_RX_SRTP, "unprotect the caller's RTP"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_HANDLE_RTP, "the caller's RTP to its receiver"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_RX_BYTES, "transport stats count its packets"),
    Internal("aiortc.RTCDtlsTransport", _DTLS_RX_PACKETS, "transport stats count its packets"),
    # LipstreamH264Encoder subclasses aiortc's encoder: it overrides the per-frame encode,
    # calls the packetizer and keeps the codec and the packetizer's buffers in step.
    Internal("aiortc.codecs.h264.H264Encoder", "_encode_frame", "our codec per frame"),
    Internal("aiortc.codecs.h264.H264Encoder", "_split_bitstream", "NAL units of our bitstream"),
    Internal("aiortc.codecs.h264.H264Encoder", "codec", "the open codec, re-opened on resize"),
    Internal("aiortc.codecs.h264.H264Encoder", "buffer_data", "reset with the codec"),
    Internal("aiortc.codecs.h264.H264Encoder", "buffer_pts", "reset with the codec"),
)


def installed_versions() -> dict[str, str]:
    """The installed aiortc and aioice versions."""
    return {name: importlib.metadata.version(name) for name in TESTED_VERSIONS}


async def missing_internals() -> list[Internal]:
    """The entries of :data:`INTERNALS` the installed aiortc/aioice do not have.

    Builds (and closes) a peer connection with one video transceiver, so instance
    attributes set in constructors are checked on real objects.
    """
    pc = RTCPeerConnection()
    try:
        transceiver = pc.addTransceiver("video")
        ice_transport = transceiver.receiver.transport.transport
        objects: dict[str, object] = {
            "aiortc.RTCRtpSender": transceiver.sender,
            "aiortc.RTCRtpTransceiver": transceiver,
            "aiortc.RTCRtpReceiver": transceiver.receiver,
            "aiortc.RTCIceTransport": ice_transport,
            "aiortc.RTCDtlsTransport": transceiver.receiver.transport,
            "aioice.Connection": _require(ice_transport, _ICE_CONNECTION),
            "pylibsrtp.Session": _srtp_session(),
            "aioice.ice": aioice.ice,
            "aiortc.codecs.h264.H264Encoder": H264Encoder(),
        }
        return [i for i in INTERNALS if not hasattr(objects[i.owner], i.name)]
    finally:
        await pc.close()


def _srtp_session() -> pylibsrtp.Session:
    """An outbound SRTP session with a throwaway key, as aiortc's transports make them."""
    key = bytes(pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80 for _ in range(30))
    policy = pylibsrtp.Policy(
        key=key,
        ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND,
        srtp_profile=pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    )
    return pylibsrtp.Session(policy=policy)


async def report_missing_internals() -> None:
    """Log, as an error naming each one, the internals this aiortc/aioice lacks (at start)."""
    missing = await missing_internals()
    if missing:
        logger.error(
            "aiortc %s / aioice %s lack internals lipstream uses (tested with %s): %s; "
            "calls will fail until streaming.webrtc.compat is updated",
            *installed_versions().values(),
            TESTED_VERSIONS,
            "; ".join(f"{m.owner}.{m.name} ({m.used_for})" for m in missing),
        )


# -- senders and transceivers ---------------------------------------------------------


def sender_encoder(sender: RTCRtpSender) -> object | None:
    """The encoder ``sender`` encodes with (None until aiortc makes one, or for audio)."""
    return getattr(sender, _SENDER_ENCODER, None)


def _replace(owner: object, name: str, value: object) -> None:
    """Set aiortc's private ``owner.name``; a ``RuntimeError`` naming it if it is gone."""
    _require(owner, name)
    setattr(owner, name, value)


def _require(owner: object, name: str) -> Any:
    """aiortc's private ``owner.name``; a ``RuntimeError`` naming it if it is gone."""
    if not hasattr(owner, name):
        raise RuntimeError(
            f"aiortc {installed_versions()['aiortc']}'s {type(owner).__name__} has no {name} "
            f"attribute (tested with {TESTED_VERSIONS['aiortc']}): streaming.webrtc.compat "
            "must be updated for this aiortc version"
        )
    return getattr(owner, name)


def install_sender_encoder(sender: RTCRtpSender, encoder: object) -> None:
    """Make ``sender`` encode with ``encoder``: aiortc creates its own only if none is set.

    Raises ``RuntimeError`` naming the attribute if this aiortc keeps its encoder elsewhere.
    """
    _replace(sender, _SENDER_ENCODER, encoder)


def forward_keyframe_requests(sender: RTCRtpSender, request: Callable[[], None]) -> None:
    """Call ``request()`` too whenever ``sender`` is asked for a keyframe (PLI or FIR).

    aiortc hands its keyframe flag only to frames it encodes itself; a track that
    returns frames already encoded learns of the request this way.
    Raises ``RuntimeError`` naming the method if this aiortc reacts elsewhere.
    """
    aiortc_reaction: Callable[[], None] = _require(sender, _SENDER_KEYFRAME)

    def send_keyframe() -> None:
        aiortc_reaction()
        request()

    _replace(sender, _SENDER_KEYFRAME, send_keyframe)


def negotiated_codecs(transceiver: RTCRtpTransceiver) -> list[RTCRtpCodecParameters]:
    """The codecs ``transceiver`` negotiated, the one its sender sends with first."""
    return list(getattr(transceiver, _TRANSCEIVER_CODECS, None) or [])


def receiver_codecs(transceiver: RTCRtpTransceiver) -> list[RTCRtpCodecParameters]:
    """The codecs ``transceiver``'s receiver accepts, by payload type order."""
    codecs: dict[int, RTCRtpCodecParameters] = getattr(transceiver.receiver, _RECEIVER_CODECS)
    return list(codecs.values())


def install_audio_receive_buffer(transceiver: RTCRtpTransceiver, buffer: object) -> None:
    """Make an audio ``transceiver``'s receiver pass packets through ``buffer`` (an
    :class:`~streaming.webrtc.audio_receive.ArrivalOrderAudioBuffer`) instead of aiortc's
    prefetching jitter buffer. Call it before media flows (after setRemoteDescription).

    Raises ``RuntimeError`` naming the attribute if this aiortc keeps its buffer elsewhere.
    """
    if transceiver.kind != "audio":
        raise ValueError(f"only audio receivers take this buffer, not {transceiver.kind}")
    _replace(transceiver.receiver, _RECEIVER_JITTER, buffer)


def sender_ssrcs(sender: RTCRtpSender) -> tuple[int, int]:
    """``sender``'s SSRC and its RTX stream's SSRC."""
    return int(_require(sender, _SENDER_SSRC)), int(_require(sender, _SENDER_RTX_SSRC))


# -- the call's link (docs/design/link.md §19) ----------------------------------------


def transport_send(transport: RTCDtlsTransport) -> Callable[[bytes], Awaitable[None]]:
    """The transport's own send of one serialised RTP or RTCP packet (it encrypts it)."""
    send: Callable[[bytes], Awaitable[None]] = _require(transport, _DTLS_SEND_RTP)
    return send


def route_transport(
    transport: RTCDtlsTransport,
    send: Callable[[bytes], Awaitable[None]],
    read_rtcp: Callable[[bytes], bytes],
) -> None:
    """From now on every packet ``transport``'s senders and receivers send goes to
    ``send`` (which calls :func:`transport_send`'s function), and every RTCP packet it
    receives to ``read_rtcp`` first; aiortc then handles what ``read_rtcp`` returns
    (nothing, if it returns ``b""``). Call it before media flows.

    Raises ``RuntimeError`` naming the method if this aiortc sends or reads elsewhere.
    """
    aiortc_rtcp: Callable[[bytes], Awaitable[None]] = _require(transport, _DTLS_HANDLE_RTCP)

    async def handle_rtcp(data: bytes) -> None:
        rest = read_rtcp(data)
        if rest:
            await aiortc_rtcp(rest)

    _replace(transport, _DTLS_SEND_RTP, send)
    _replace(transport, _DTLS_HANDLE_RTCP, handle_rtcp)


# -- lipstream's own RTP send (docs/design/rtp-send.md §20) --------------------------------


class SenderLoop:
    """What an RTP loop run in place of aiortc's (:func:`run_rtp_with`) shares with the
    rest of aiortc's sender: the track's next packet, the events ``stop()`` waits for,
    and the counts its sender reports and ``getStats`` read.

    Raises ``RuntimeError`` naming the attribute if this aiortc keeps one elsewhere.
    """

    def __init__(self, sender: RTCRtpSender) -> None:
        self._sender = sender
        self._timestamp: int | None = None  # of the last packet sent
        self._next_frame: Callable[[RTCRtpCodecParameters], Awaitable[Any]] = _require(
            sender, _SENDER_NEXT_FRAME
        )
        for name in (_SENDER_TRACK, _SENDER_RTP_STARTED, _SENDER_RTP_EXITED, _SENDER_OCTETS):
            _require(sender, name)
        for name in (_SENDER_NTP, _SENDER_RTP_TIMESTAMP, _SENDER_PACKETS):
            _require(sender, name)

    def started(self) -> None:
        getattr(self._sender, _SENDER_RTP_STARTED).set()

    async def next_frame(self, codec: RTCRtpCodecParameters) -> tuple[list[bytes], int] | None:
        """The track's next frame as (payloads, RTP timestamp from 0); None: none to send."""
        frame = await self._next_frame(codec)
        return None if frame is None else (frame.payloads, frame.timestamp)

    def packet_sent(self, octets: int, rtp_timestamp: int) -> None:
        """A packet with ``octets`` of payload went out: counted in the next SR, whose
        RTP/NTP pair is its frame's and the time that frame's first packet left (aiortc
        reads the clock for every packet; the pair is the same to a packet's time)."""
        sender = self._sender
        if rtp_timestamp != self._timestamp:
            self._timestamp = rtp_timestamp
            setattr(sender, _SENDER_NTP, aiortc_clock.current_ntp_time())
            setattr(sender, _SENDER_RTP_TIMESTAMP, rtp_timestamp)
        setattr(sender, _SENDER_OCTETS, getattr(sender, _SENDER_OCTETS) + octets)
        setattr(sender, _SENDER_PACKETS, getattr(sender, _SENDER_PACKETS) + 1)

    def exited(self) -> None:
        """The loop ended: stop the track, as aiortc's own loop does, and tell ``stop()``."""
        sender = self._sender
        track = getattr(sender, _SENDER_TRACK)
        if track is not None:
            track.stop()
            setattr(sender, _SENDER_TRACK, None)
        getattr(sender, _SENDER_RTP_EXITED).set()


def run_rtp_with(
    sender: RTCRtpSender, run: Callable[[RTCRtpCodecParameters], Awaitable[None]]
) -> None:
    """Make ``sender`` run ``run(codec)`` as its RTP loop instead of aiortc's. Call it
    before media flows (aiortc starts the loop once the transport connects)."""
    _replace(sender, _SENDER_RUN_RTP, run)


@dataclass(frozen=True)
class ReceiveHooks:
    """What handling the caller's RTP in the socket's callback needs of aioice and a
    DTLS transport (:class:`~streaming.webrtc.rtp_receive.DirectReceive`)."""

    #: aioice's own hand-off of a datagram: its queue, which the transport's task reads.
    queue: Callable[[bytes, int], None]
    #: The transport's inbound SRTP session (None until DTLS has keyed it).
    srtp: Callable[[], pylibsrtp.Session | None]
    #: The transport's handling of one unprotected RTP packet (``arrival_time_ms``).
    handle_rtp: Callable[[bytes, int], Coroutine[Any, Any, None]]
    #: Count one received datagram of ``n`` bytes in the transport's stats.
    counted: Callable[[int], None]
    #: aiortc's clock for a packet's arrival, in ms.
    now_ms: Callable[[], int]


def intercept_datagrams(
    transport: RTCDtlsTransport, receive: Callable[[bytes, int], None]
) -> ReceiveHooks:
    """From now on every datagram of ``transport``'s ICE connection that is not STUN goes
    to ``receive(data, component)`` instead of aioice's queue; the hooks let it hand a
    datagram on to that queue, or handle an RTP packet itself. Call it before media
    flows. Raises ``RuntimeError`` naming the attribute if aiortc or aioice keep these
    elsewhere."""
    connection = _require(transport.transport, _ICE_CONNECTION)
    queue: Callable[[bytes, int], None] = _require(connection, _ICE_DATA_RECEIVED)
    handle_rtp = _require(transport, _DTLS_HANDLE_RTP)
    for name in (_DTLS_RX_SRTP, _DTLS_RX_BYTES, _DTLS_RX_PACKETS):
        _require(transport, name)

    def counted(size: int) -> None:
        setattr(transport, _DTLS_RX_BYTES, getattr(transport, _DTLS_RX_BYTES) + size)
        setattr(transport, _DTLS_RX_PACKETS, getattr(transport, _DTLS_RX_PACKETS) + 1)

    def handle(data: bytes, arrival_time_ms: int) -> Coroutine[Any, Any, None]:
        coroutine: Coroutine[Any, Any, None] = handle_rtp(data, arrival_time_ms=arrival_time_ms)
        return coroutine

    _replace(connection, _ICE_DATA_RECEIVED, receive)
    return ReceiveHooks(
        queue=queue,
        srtp=lambda: getattr(transport, _DTLS_RX_SRTP),
        handle_rtp=handle,
        counted=counted,
        now_ms=aiortc_clock.current_ms,
    )


def _udp_kind(datagrams: object) -> str | None:
    """Which UDP transport ``datagrams`` is: asyncio's own copies what it cannot send at
    once; uvloop's keeps a reference, so it is given a copy; aioice's TURN transport
    (None) hands the data on later, when the buffer is reused: such packets go aiortc's
    way."""
    if isinstance(datagrams, asyncio.BaseTransport) and hasattr(datagrams, "sendto"):
        return "asyncio"
    kind = type(datagrams)
    return "uvloop" if f"{kind.__module__}.{kind.__qualname__}" == _UVLOOP_UDP else None


_UVLOOP_UDP = "uvloop.loop.UDPTransport"


class SrtpSocketSend:
    """Sends one plaintext RTP packet on a DTLS transport's nominated UDP pair: copied
    into a buffer of its own, protected there by the transport's SRTP session, and
    handed to the socket's datagram transport; aiortc's own send makes a packet object
    for each of those steps (``docs/design/rtp-send.md`` §20). Returns False where it
    cannot (a TURN relay or TCP pair, a packet too long): send it aiortc's way then.
    Raises ``ConnectionError`` once the transport is not connected, as aiortc does.
    """

    def __init__(self, transport: RTCDtlsTransport) -> None:
        self._transport = transport
        # aioice's dict of nominated pairs: filled once ICE completes, cleared on close.
        self._nominated: dict[int, Any] = _require(
            _require(transport.transport, _ICE_CONNECTION), _ICE_NOMINATED
        )
        _require(transport, _DTLS_TX_SRTP)
        _require(transport, _DTLS_STATE)
        self._datagrams: object = None  # the pair's UDP transport last seen
        self._kind: str | None = None  # and which one it is (_udp_kind)
        self._session: Any = None  # the SRTP session the context was read from
        self._context: Any = None  # its srtp_t
        self._buffer = bytearray(2048)
        self._room = len(self._buffer) - SRTP_MAX_TRAILER_LEN
        self._pointer = srtp_ffi.from_buffer("unsigned char[]", self._buffer)
        self._length = srtp_ffi.new("int *")
        self._view = memoryview(self._buffer)
        self.packets = 0  # sent this way

    def __call__(self, packet: bytearray) -> bool:
        transport = self._transport
        if getattr(transport, _DTLS_STATE) is not DtlsState.CONNECTED:
            raise ConnectionError("Cannot send encrypted RTP, not connected")
        pair = self._nominated.get(1)
        if pair is None:
            return False
        datagrams: Any = getattr(pair.protocol, "transport", None)
        if datagrams is not self._datagrams:
            self._datagrams, self._kind = datagrams, _udp_kind(datagrams)
        size = len(packet)
        if self._kind is None or size > self._room:
            return False
        session = getattr(transport, _DTLS_TX_SRTP)
        if session is not self._session:  # set by the handshake: read its context once
            self._session, self._context = session, getattr(session, _SRTP_CONTEXT)[0]
        self._buffer[:size] = packet
        self._length[0] = size
        status = srtp_lib.srtp_protect(self._context, self._pointer, self._length)
        if status != 0:
            raise ConnectionError(f"SRTP protect failed (libsrtp status {status})")
        protected = self._length[0]
        view = self._view[:protected]
        datagrams.sendto(view if self._kind == "asyncio" else bytes(view), pair.remote_addr)
        setattr(transport, _DTLS_TX_BYTES, getattr(transport, _DTLS_TX_BYTES) + protected)
        setattr(transport, _DTLS_TX_PACKETS, getattr(transport, _DTLS_TX_PACKETS) + 1)
        self.packets += 1
        return True


# -- DTLS -----------------------------------------------------------------------------


def answer_as_dtls_server(pc: RTCPeerConnection) -> None:
    """Make the answer say ``a=setup:passive`` to each section offered ``actpass``.

    Call it between ``setRemoteDescription(offer)`` and ``createAnswer()``: the server
    is then the DTLS server (see the module docstring for why). A section offered
    ``active`` or ``passive`` keeps the role its caller asked for. Raises
    ``RuntimeError`` naming the method if this aiortc sets DTLS roles elsewhere.
    """
    offer = pc.remoteDescription
    if offer is None or offer.type != "offer":
        raise ValueError("set the remote offer first")
    actpass = {
        media.rtp.muxId
        for media in aiortc_sdp.SessionDescription.parse(offer.sdp).media
        if media.dtls is not None and media.dtls.role == "auto"
    }
    # Only audio and video: offer_check refuses data channels.
    for transceiver in pc.getTransceivers():
        if transceiver.mid in actpass:
            _require(transceiver.receiver.transport, _DTLS_SET_ROLE)("server")


class DtlsFailure:
    """Why a peer connection's DTLS handshake failed: ``cause`` is None until it has.

    aiortc reports only a "failed" state and puts the reason in its debug log, if at all:
    OpenSSL's error usually surfaces while aiortc reads a handshake record
    (``RTCDtlsTransport._recv_next``), which swallows it, and the next
    ``do_handshake()`` then fails with an empty error queue. So while a transport
    shakes hands its OpenSSL connection is wrapped to keep the first error raised.
    """

    def __init__(self) -> None:
        self.cause: str | None = None

    def watch(self, pc: RTCPeerConnection) -> None:
        """Watch ``pc``'s DTLS transports: call it after ``setLocalDescription`` (aiortc
        starts DTLS in a task of its own, once ICE connects).

        Raises ``RuntimeError`` naming the attribute if this aiortc shakes hands elsewhere.
        """
        transports = {id(t.receiver.transport): t.receiver.transport for t in pc.getTransceivers()}
        for transport in transports.values():
            errors = _HandshakeErrors()
            handshake = functools.partial(
                errors.run, transport, _require(transport, _DTLS_HANDSHAKE)
            )
            _replace(transport, _DTLS_HANDSHAKE, handshake)
            transport.on("statechange", functools.partial(self._state_changed, transport, errors))

    def _state_changed(self, transport: RTCDtlsTransport, errors: _HandshakeErrors) -> None:
        if transport.state != "failed" or self.cause is not None:
            return
        role = getattr(transport, _DTLS_ROLE, "?")
        if errors.first is not None:
            self.cause = f"{errors.first} (as DTLS {role})"
        elif not getattr(transport, "encrypted", False):
            self.cause = "the connection closed during the handshake"
        else:  # the handshake completed; aiortc's checks after it did not pass
            ssl = getattr(transport, _DTLS_SSL, None)
            if ssl is not None and not ssl.get_selected_srtp_profile():
                self.cause = "no SRTP protection profile in common"
            else:
                self.cause = "the caller's certificate does not match its offer's a=fingerprint"


class _HandshakeErrors:
    """The first OpenSSL error of one transport's handshake, as OpenSSL words it."""

    def __init__(self) -> None:
        self.first: str | None = None

    async def run(self, transport: object, handshake: Callable[[], Awaitable[None]]) -> None:
        """aiortc's handshake, its OpenSSL connection wrapped while it runs."""
        connection = getattr(transport, _DTLS_SSL)
        setattr(transport, _DTLS_SSL, _ErrorKeepingConnection(connection, self))
        try:
            await handshake()
        finally:
            setattr(transport, _DTLS_SSL, connection)

    def keep(self, error: SSL.Error) -> None:
        if self.first is None:
            queue = error.args[0] if error.args and isinstance(error.args[0], list) else []
            reasons = [str(e[-1]) for e in queue if isinstance(e, tuple) and e]
            self.first = "; ".join(reasons) or None  # empty: the error was read before


class _ErrorKeepingConnection:
    """A pyOpenSSL connection whose handshake errors are kept before aiortc handles them."""

    def __init__(self, connection: Any, errors: _HandshakeErrors) -> None:
        self._connection = connection
        self._errors = errors

    def do_handshake(self) -> None:
        self._call(self._connection.do_handshake)

    def recv(self, bufsiz: int) -> bytes:
        data: bytes = self._call(self._connection.recv, bufsiz)
        return data

    def DTLSv1_handle_timeout(self) -> bool:  # noqa: N802 (pyOpenSSL's name)
        done: bool = self._call(self._connection.DTLSv1_handle_timeout)
        return done

    def _call(self, method: Callable[..., Any], *args: object) -> Any:
        try:
            return method(*args)
        except (SSL.WantReadError, SSL.ZeroReturnError):
            raise
        except SSL.Error as exc:
            self._errors.keep(exc)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


# -- closing --------------------------------------------------------------------------


async def _no_consent_checks() -> None:
    """Stands in for ``Connection.query_consent`` once the connection is closing."""


def _ice_connections(pc: RTCPeerConnection) -> list[Any]:
    """The aioice connections under ``pc``'s transports (one per transport, BUNDLE or not)."""
    ice_transports = [t.receiver.transport.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        ice_transports.append(pc.sctp.transport.transport)
    connections: dict[int, Any] = {}
    for ice_transport in ice_transports:
        connection = getattr(ice_transport, _ICE_CONNECTION, None)
        if connection is not None:
            connections[id(connection)] = connection
    return list(connections.values())


async def close_peer_connection(pc: RTCPeerConnection) -> None:
    """``pc.close()``, plus: no ICE consent task may start on it afterwards."""
    for connection in _ice_connections(pc):
        connection.query_consent = _no_consent_checks
    await pc.close()


# -- ICE candidates -------------------------------------------------------------------


def _loopback_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    return ["127.0.0.1"]


@contextlib.contextmanager
def loopback_only_ice() -> Iterator[None]:
    """While open, every new ICE agent gathers only a 127.0.0.1 host candidate.

    aioice skips loopback addresses and has no per-connection setting for it: it asks the
    module function ``aioice.ice.get_host_addresses``, swapped here and put back on exit
    (``server.ice_loopback_only``, the tests, the benchmarks' load client).
    """
    original = aioice.ice.get_host_addresses
    aioice.ice.get_host_addresses = _loopback_addresses
    try:
        yield
    finally:
        aioice.ice.get_host_addresses = original
