"""A caller for relay tests: run inside a network namespace, it reports one call as JSON.

    ip netns exec <ns> .venv/bin/python -m tests.relay_caller \\
        --server http://10.99.7.1:8080 --avatar alice --microphone speech.wav

It does what a browser does: GET /webrtc-config, a peer connection with those ICE
servers (the TURN entry with its fresh credentials) and the default transport policy,
POST /offer, speech into the microphone. It decodes the server's video
(:class:`tests.webrtc_client.Caller`), then prints what the test asserts: the TURN
username it was given, the connection state, the codec, the ICE candidate pair in use,
the frames decoded and the frame rate received over a window after a warm-up.

The frame rate is the wall-clock count :meth:`Caller.fps_since` takes, asserted here
because issue 16 makes it the relay's acceptance criterion; the window starts after the
warm-up frames and ends when a frame arrives after it, so it is whole however slow the
machine. aiortc has no public way to read the selected candidate pair, so
:func:`selected_pair` reads aioice's private state: a test helper, never product code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aiohttp import ClientSession
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection

from tests.live_calls import until
from tests.webrtc_client import Caller


def ice_configuration(webrtc_config: dict[str, Any]) -> RTCConfiguration:
    """What a page builds from ``GET /webrtc-config``'s ``iceServers``."""
    return RTCConfiguration(
        iceServers=[
            RTCIceServer(
                urls=server["urls"],
                username=server.get("username"),
                credential=server.get("credential"),
            )
            for server in webrtc_config["iceServers"]
        ]
    )


def selected_pair(pc: RTCPeerConnection) -> dict[str, str]:
    """The type and address of each end of the candidate pair ICE nominated (component 1).

    Reads ``RTCIceTransport._connection`` (the aioice ``Connection``) and its
    ``_nominated`` pairs: aiortc 1.16 exposes neither.
    """
    ice_transport = pc.getTransceivers()[0].receiver.transport.transport
    pair = ice_transport._connection._nominated[1]
    local, remote = pair.local_candidate, pair.remote_candidate
    return {
        "local_type": local.type,
        "local_address": f"{local.host}:{local.port}",
        "remote_type": remote.type,
        "remote_address": f"{remote.host}:{remote.port}",
    }


def candidate_types(sdp: str) -> list[str]:
    """The type of each ICE candidate an SDP carries."""
    return [line.split(" typ ")[1].split()[0] for line in sdp.splitlines() if " typ " in line]


async def call(
    server: str, avatar: str, microphone: Path, warmup_frames: int, window_s: float
) -> dict[str, Any]:
    """One relayed call; what the test asserts about it."""
    async with ClientSession(base_url=server) as http:
        async with http.get("/webrtc-config") as response:
            assert response.status == 200, await response.text()
            webrtc_config = await response.json()
        turn = [s for s in webrtc_config["iceServers"] if s.get("username")]
        caller = Caller(http, avatar, configuration=ice_configuration(webrtc_config))
        caller.keep_luma = False
        try:
            await caller.connect(microphone)
            await until(lambda: caller.pc.connectionState == "connected", "ICE and DTLS")
            await caller.wait_for_frames(warmup_frames)
            times = caller.received.video_times
            start = times[warmup_frames - 1]
            await until(lambda: times[-1] > start + window_s, f"a frame after the {window_s} s")
            in_window = sum(1 for t in times if start < t <= start + window_s)
            return {
                "turn_username": turn[0]["username"] if turn else None,
                "connection_state": caller.pc.connectionState,
                "codec": caller.received.video_codec,
                "size": caller.received.size,
                "local_candidates": candidate_types(caller.pc.localDescription.sdp),
                "selected_pair": selected_pair(caller.pc),
                "frames_decoded": len(times),
                "window_frames": in_window,
                "fps": in_window / window_s,
                "audio_samples": caller.received.audio_samples,
                "session_id": caller.session_id,
            }
        finally:
            await caller.hang_up()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--server", required=True, help="the lipstream server's base URL")
    parser.add_argument("--avatar", required=True)
    parser.add_argument("--microphone", type=Path, required=True, help="a WAV file to speak")
    parser.add_argument("--warmup-frames", type=int, default=25)
    parser.add_argument("--window-s", type=float, default=4.0)
    args = parser.parse_args()
    report = asyncio.run(
        call(args.server, args.avatar, args.microphone, args.warmup_frames, args.window_s)
    )
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
