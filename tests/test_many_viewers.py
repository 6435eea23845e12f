"""Twenty WHEP viewers of one speaking session no caller owns: every viewer gets the
session's frames, all see the same pictures from one encode, and a viewer that stops
reading costs the others nothing (``docs/design/broadcast.md`` §21).

The server runs in this process (``benchmarks.live_server``), the viewers in another
(``benchmarks.whep_load``): twenty aiortc peer connections, the first
:data:`DECODING` of them decoding the H.264 and keeping a digest of each picture's luma,
the others a digest of each frame aiortc assembled (twenty Python decoders and a
speaking session do not fit on the 2-core machine together, and a load client that
falls behind would fail the test for its own slowness). For the same reason the demo
avatar is drawn at 640×360 and sent at 300 kbps, and the viewers send no REMB: aiortc's
delay-based estimate, in a process receiving for twenty connections, reads its own
scheduling delays as congestion and the viewers' links would pace the session's stream
below its bitrate (the link's behaviour is §19's subject, not this test's). The quality
steps (``broadcast.rungs``) are on, as by default: with no REMB a viewer's link is
measured by the loss its receiver reports say (none on loopback), so each keeps the
session's own stream and all twenty watch the one encode.
The session speaks the bundled sample, pushed once and longer than the test.

The load client's window has two halves, each bounded by a ``GET /sessions/{id}`` (the
frames the session sent); at the middle its last viewer stops reading its tracks. The
client counts frames by media time, so the halves hold what the server sent in them even
when the client fell behind. Counts and ratios only, no rates: a busy machine makes the
session send fewer frames, never makes a viewer get fewer than the session sent.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import sys
from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from benchmarks.live_server import client_result, live_server, write_speech
from inference_core.assets.demo_avatar import write_demo_avatar
from tests.live_calls import session_state

VIEWERS = 20
DECODING = 4  # the first four decode; the others count and digest assembled frames
WINDOW_S = 30.0  # two halves: all read, then one stalled
SIZE = (640, 360)
#: What each reading viewer gets of the frames the session sent in a half (a viewer's own
#: track may skip a late slot on a loaded machine and then wait for the next IDR).
SHARE = 0.9
#: Audio samples a viewer decodes per video frame sent (48 kHz, 40 ms frames).
SAMPLES_PER_FRAME = 1920


async def test_twenty_viewers_see_the_sessions_one_stream(tmp_path: Path) -> None:
    write_demo_avatar(tmp_path / "avatars" / "demo", count=50, size=SIZE)
    speech = write_speech(tmp_path / "speech.wav", 110.0).read_bytes()
    settings = {
        "avatars": {
            "root": str(tmp_path / "avatars"),
            "data_dir": str(tmp_path / "data"),
            "demo": False,
        },
        "video": {"bitrate_kbps": 300},
    }
    async with live_server(tmp_path, settings) as (_, url), ClientSession(base_url=url) as http:
        created = await http.post("/sessions", json={"avatar": "demo"})
        assert created.status == 201, await created.text()
        sid = (await created.json())["session_id"]
        pushed = await http.post(
            f"/sessions/{sid}/audio", data=io.BytesIO(speech), headers={"Content-Type": "audio/wav"}
        )
        assert pushed.status == 202, await pushed.text()
        client = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.whep_load",
            *("--viewers", str(VIEWERS), "--seconds", str(WINDOW_S), "--stall", "1"),
            *("--decode", str(DECODING), "--no-remb"),
            "--",  # a session id may begin with "-" (token_urlsafe): not an option
            url,
            sid,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(WINDOW_S + 120):
                out, _ = await client.communicate()
        finally:
            if client.returncode is None:
                client.kill()
                await client.wait()
        result = client_result(out, client.returncode)
        state = await session_state(http, sid)

    sent = [b - a for a, b in itertools.pairwise(result["frames_sent"])]
    viewers: list[dict[str, Any]] = result["per_viewer"]
    stalled = [v for v in viewers if v["stalled"]]
    reading = [v for v in viewers if not v["stalled"]]
    summary = (
        f"sent per half {sent}, each viewer's frames per half "
        f"{[v['halves'] for v in viewers]}, the client behind by (s) "
        f"{[round(v['lag_s'], 1) for v in viewers]} using {result['client_cores']:.2f} "
        f"cores, the session {result['session']}"
    )
    assert len(stalled) == 1, summary
    assert len(reading) == VIEWERS - 1, summary
    # The session streamed throughout (at least a frame a second: one that stalls for good
    # fails here), and its one encode served everyone.
    for frames, seconds in zip(sent, result["halves_s"], strict=True):
        assert frames >= seconds, summary
    assert result["session"]["state"] == "streaming", summary
    assert state["state"] == "streaming", state
    assert state["frames_inferred"] >= sum(sent) / 2, state  # it spoke: lip-synced frames
    assert state["frames_encoded"] + state["frames_shared"] <= state["frames_sent"] + 2, state
    # First half: all twenty read, and each got what the session sent.
    for viewer in viewers:
        assert viewer["halves"][0] >= SHARE * sent[0], summary
    # Second half: one stopped reading (its frames wait in aiortc's queue); the others
    # still get what the session sent, and hear it.
    assert stalled[0]["halves"][1] <= 0.1 * sent[1], summary
    for viewer in reading:
        assert viewer["halves"][1] >= SHARE * sent[1], summary
        for samples, frames in zip(viewer["audio_samples"], sent, strict=True):
            assert samples >= SHARE * SAMPLES_PER_FRAME * frames, (viewer["audio_samples"], sent)
    # Every reader was sent the same payloads: the decoders decoded the same pictures in
    # the window's last 2 s, and the others assembled the same frames.
    for decoding in (True, False):
        last = [v["digests"] for v in reading if v["decoding"] is decoding]
        common = set.intersection(*(set(d) for d in last))
        assert len(common) >= SHARE * max(len(d) for d in last), [len(d) for d in last]
        assert len(common) >= 25, [len(d) for d in last]  # 2 s of frames, 50 at 25 fps
