"""aiortc/aioice internals: all of them exist in the installed versions, and only
``streaming.webrtc.compat`` reaches for them."""

from __future__ import annotations

import asyncio
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import aioice
import pytest
from aiortc import RTCCertificate, RTCPeerConnection, RTCSessionDescription
from aiortc.rtcdtlstransport import generate_certificate
from cryptography.hazmat.primitives.asymmetric import rsa

from streaming.webrtc import compat
from streaming.webrtc.compat import (
    INTERNALS,
    TESTED_VERSIONS,
    DtlsFailure,
    answer_as_dtls_server,
    forward_keyframe_requests,
    install_sender_encoder,
    installed_versions,
    missing_internals,
)
from tests.live_calls import until

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "inference_core", "compositor", "streaming", "web")


async def test_every_internal_we_rely_on_exists_in_the_installed_aiortc() -> None:
    missing = await missing_internals()
    assert not missing, "aiortc/aioice internals lipstream relies on are gone: " + "; ".join(
        f"{m.owner}.{m.name} (used to {m.used_for})" for m in missing
    )


async def test_the_check_names_an_attribute_that_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(aioice.Connection, "query_consent")
    missing = await missing_internals()
    assert [(m.owner, m.name) for m in missing] == [("aioice.Connection", "query_consent")]


def test_installed_versions_are_the_tested_and_pinned_ones() -> None:
    assert installed_versions() == TESTED_VERSIONS
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    dependencies = pyproject["project"]["dependencies"]
    for name, version in TESTED_VERSIONS.items():
        assert f"{name}=={version}" in dependencies, f"pin {name}=={version} in pyproject.toml"


async def test_installing_an_encoder_where_aiortc_no_longer_keeps_it_fails_loudly() -> None:
    pc = RTCPeerConnection()
    try:
        sender = pc.addTransceiver("video").sender
        delattr(sender, "_RTCRtpSender__encoder")
        with pytest.raises(RuntimeError, match=r"_RTCRtpSender__encoder.*compat"):
            install_sender_encoder(sender, object())
    finally:
        await pc.close()


def test_no_other_module_touches_aiortc_or_aioice_internals() -> None:
    # LipstreamH264Encoder subclasses aiortc's encoder; its hooks are in INTERNALS too.
    allowed = {Path(compat.__file__).resolve(), REPO / "streaming/webrtc/video_encoder.py"}
    # (aioice's ``data_received`` is also every asyncio protocol's: not aioice's alone.)
    private = [
        i.name
        for i in INTERNALS
        if (i.name.startswith("_") or i.owner.startswith("aioice"))
        and not hasattr(asyncio.Protocol, i.name)
    ]
    names = "|".join(re.escape(name) for name in private)
    # An attribute of something other than ``self``, the name as a string, or aioice itself.
    pattern = re.compile(
        rf"(?<!self)\.({names})\b|[\"']({names})[\"']|\b(import|from) aioice\b|\baioice\.\w"
    )
    offenders = []
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.resolve() in allowed:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line) and not line.lstrip().startswith("#"):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "use streaming.webrtc.compat instead:\n" + "\n".join(offenders)


async def test_a_keyframe_request_reaches_aiortc_and_our_encoder() -> None:
    pc = RTCPeerConnection()
    try:
        sender = pc.addTransceiver("video").sender
        heard: list[str] = []
        forward_keyframe_requests(sender, lambda: heard.append("ours"))
        sender._send_keyframe()  # what aiortc runs on a PLI or FIR
        assert heard == ["ours"]
        assert sender._RTCRtpSender__force_keyframe  # aiortc's own flag, still set
    finally:
        await pc.close()


# -- DTLS: the answer's role, and why a handshake failed -----------------------------------


def _setup(sdp: str) -> set[str]:
    return set(re.findall(r"^a=setup:(\w+)", sdp, re.M))


def _rsa_certificate() -> RTCCertificate:
    """A certificate like webrtcbin's: RSA, where aiortc makes ECDSA ones."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return RTCCertificate(key, generate_certificate(key))  # type: ignore[arg-type]


async def _call(
    caller: RTCPeerConnection, server: RTCPeerConnection, offer_sdp: Callable[[str], str]
) -> DtlsFailure:
    """Offer from ``caller`` (its SDP edited by ``offer_sdp``), answered by ``server`` as
    the server answers; the server's DTLS transports watched."""
    caller.addTransceiver("audio")
    await caller.setLocalDescription(await caller.createOffer())
    offer = RTCSessionDescription(offer_sdp(caller.localDescription.sdp), "offer")
    await server.setRemoteDescription(offer)
    answer_as_dtls_server(server)
    await server.setLocalDescription(await server.createAnswer())
    failure = DtlsFailure()
    failure.watch(server)
    await caller.setRemoteDescription(server.localDescription)
    return failure


async def test_an_actpass_offer_is_answered_passive_and_connects(loopback: None) -> None:
    caller, server = RTCPeerConnection(), RTCPeerConnection()
    try:
        failure = await _call(caller, server, lambda sdp: sdp)
        assert _setup(caller.localDescription.sdp) == {"actpass"}
        assert _setup(server.localDescription.sdp) == {"passive"}  # aiortc alone: active
        await until(lambda: server.connectionState == "connected", "the call to connect")
        assert failure.cause is None
    finally:
        await caller.close()
        await server.close()


@pytest.mark.parametrize(("offered", "answered"), [("active", "passive"), ("passive", "active")])
async def test_an_offer_that_picks_its_role_keeps_it(offered: str, answered: str) -> None:
    caller, server = RTCPeerConnection(), RTCPeerConnection()
    try:
        await _call(
            caller, server, lambda sdp: sdp.replace("a=setup:actpass", f"a=setup:{offered}")
        )
        assert _setup(server.localDescription.sdp) == {answered}
    finally:
        await caller.close()
        await server.close()


async def test_a_failed_handshake_is_named_with_openssls_reason_on_both_sides(
    loopback: None,
) -> None:
    """The failure of issue 16 in-process: the server as DTLS client (the caller offered
    passive) against a DTLS server whose certificate is RSA."""
    caller, server = RTCPeerConnection(), RTCPeerConnection()
    caller._RTCPeerConnection__certificates[0] = _rsa_certificate()  # type: ignore[attr-defined]
    try:
        failure = await _call(
            caller, server, lambda sdp: sdp.replace("a=setup:actpass", "a=setup:passive")
        )
        caller_failure = DtlsFailure()
        caller_failure.watch(caller)
        await until(lambda: failure.cause and caller_failure.cause, "both handshakes to fail")
        assert server.connectionState == "failed"
        # OpenSSL 3.0 says "sslv3 alert", later releases "tls alert".
        assert re.fullmatch(r".*alert handshake failure \(as DTLS client\)", str(failure.cause))
        assert caller_failure.cause == "no shared cipher (as DTLS server)"
    finally:
        await caller.close()
        await server.close()


async def test_a_certificate_that_is_not_the_offered_one_is_named(loopback: None) -> None:
    caller, server = RTCPeerConnection(), RTCPeerConnection()
    other = RTCCertificate.generateCertificate().getFingerprints()
    fingerprint = next(f for f in other if f.algorithm == "sha-256")
    try:
        failure = await _call(
            caller,
            server,
            lambda sdp: re.sub(
                r"^a=fingerprint:sha-256 \S+",
                f"a=fingerprint:sha-256 {fingerprint.value}",
                sdp,
                flags=re.M,
            ),
        )
        await until(lambda: failure.cause, "the handshake to fail")
        assert failure.cause == "the caller's certificate does not match its offer's a=fingerprint"
    finally:
        await caller.close()
        await server.close()
