"""aiortc/aioice internals: all of them exist in the installed versions, and only
``streaming.webrtc.compat`` reaches for them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import aioice
import pytest
from aiortc import RTCPeerConnection

from streaming.webrtc import compat
from streaming.webrtc.compat import (
    INTERNALS,
    TESTED_VERSIONS,
    forward_keyframe_requests,
    install_sender_encoder,
    installed_versions,
    missing_internals,
)

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
    private = [i.name for i in INTERNALS if i.name.startswith("_") or i.owner.startswith("aioice")]
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
