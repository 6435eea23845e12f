"""RTMP outputs (``docs/design/broadcast.md`` §21) against Debian's nginx with its RTMP module:
what the ingest gets is read back with FFmpeg (PyAV), as a platform would take it."""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import statistics
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from compositor.yuv import bgr_to_i420
from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.package import AvatarPackage
from streaming.broadcast.h264_units import access_unit, nal_units
from streaming.webrtc.video_encoder import EncoderFactory
from tests.live_calls import session_state, until
from tests.media import require_espeak
from tests.nginx_proxy import free_port
from tests.rtmp_server import RtmpServer, run_rtmp_server
from web.app import build_app
from web.app_keys import SESSIONS

Client = TestClient[Any, Any]
SIZE = (640, 360)
COUNT = 12
FPS = 25


def test_access_units_come_back_from_the_payloads_of_our_encoder() -> None:
    encoder = EncoderFactory(Settings().video.model_copy(update={"encoder": "libx264"})).create(
        320, 240
    )
    encoder.target_bitrate = 2_000_000
    raw = av.CodecContext.create("h264", "r")
    rebuilt = av.CodecContext.create("h264", "r")
    rng = np.random.default_rng(1)
    for index in range(12):  # noise: large frames, so FU-A fragments are in there too
        image = rng.integers(0, 255, (240 * 3 // 2, 320), dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(image, format="yuv420p")
        frame.pts, frame.time_base = index * 3600, fractions.Fraction(1, 90_000)
        payloads, _ = encoder.encode(frame, index == 0)
        units = nal_units(payloads)
        assert units
        assert all(unit[0] & 0x80 == 0 for unit in units)
        decoded = rebuilt.decode(av.Packet(access_unit(payloads)))
        expected = raw.decode(av.Packet(b"".join(b"\x00\x00\x00\x01" + u for u in units)))
        assert len(decoded) == len(expected)
    assert any(p[0] & 0x1F == 28 for p in payloads)  # the last frame was fragmented
    assert nal_units([bytes([0x7C, 0x85, 1, 2])]) == []  # a fragment never ended: left out


@dataclass
class ReadBack:
    """What a player of the ingest's stream got: video pts (ms) with each frame's mouth
    difference, audio (pts ms, RMS) per AAC frame, the codecs."""

    codecs: list[str] = field(default_factory=list)
    video: list[tuple[int, float]] = field(default_factory=list)
    audio: list[tuple[int, float]] = field(default_factory=list)
    error: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)


class Mouth:
    """How far a picture's mouth is from the nearest of the avatar's own (closed) mouths."""

    def __init__(self, package: AvatarPackage) -> None:
        height = package.manifest.frame_size[1]
        self.raw = [bgr_to_i420(cv2.imread(str(p)))[:height] for p in package.frame_paths]
        self.boxes = [self._box(rect) for rect in package.rects]

    @staticmethod
    def _box(rect: Any) -> tuple[slice, slice]:
        x1, y1, x2, _ = (int(v) for v in rect)
        side = x2 - x1
        cx, cy = x1 + side // 2, y1 + int(0.42 * side)
        return slice(cy - side // 8, cy + side // 8), slice(cx - side // 5, cx + side // 5)

    def diff(self, luma: np.ndarray) -> float:
        return min(
            float(np.abs(luma[rows, cols].astype(np.int16) - raw[rows, cols]).mean())
            for raw, (rows, cols) in zip(self.raw, self.boxes, strict=True)
        )


def _play(url: str, mouth: Mouth, out: ReadBack) -> None:
    """Read the live stream from the ingest until told to stop (a thread)."""
    try:
        with av.open(url, options={"rtmp_live": "live"}, timeout=(20.0, 20.0)) as player:
            out.codecs = sorted(s.codec_context.name for s in player.streams)
            for packet in player.demux():
                if out.stop.is_set():
                    return
                for frame in packet.decode():
                    ms = round(float(frame.time * 1000)) if frame.time is not None else 0
                    if isinstance(frame, av.VideoFrame):
                        luma = frame.to_ndarray(format="yuv420p")[: frame.height]
                        out.video.append((ms, mouth.diff(luma)))
                    elif isinstance(frame, av.AudioFrame):
                        pcm = frame.to_ndarray().astype(np.float32)
                        out.audio.append((ms, float(np.sqrt(np.mean(pcm**2)))))
    except (av.FFmpegError, OSError) as exc:
        out.error = repr(exc)


@pytest.fixture
async def rtmp(tmp_path: Path) -> AsyncIterator[RtmpServer]:
    async with run_rtmp_server(tmp_path / "nginx") as server:
        yield server


def _settings(tmp_path: Path, **outputs: Any) -> Settings:
    root = tmp_path / "avatars"
    write_demo_avatar(root / "demo", count=COUNT, size=SIZE)
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(tmp_path / "data"), "demo": False},
            "video": {"preset": "ultrafast"},
            "outputs": {"allow_private": True, "retry_max_s": 2.0, **outputs},
        }
    )


@contextlib.asynccontextmanager
async def _app(settings: Settings) -> AsyncIterator[Client]:
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        yield client


async def _outputs(client: Client, session_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/sessions/{session_id}/outputs")
    assert response.status == 200, await response.text()
    outputs: list[dict[str, Any]] = (await response.json())["outputs"]
    return outputs


def _live(client: Client, session_id: str, frames: int = 25) -> Any:
    async def live() -> bool:
        outputs = await _outputs(client, session_id)
        return (
            bool(outputs) and outputs[0]["state"] == "live" and outputs[0]["frames_sent"] >= frames
        )

    return live


async def test_a_session_reaches_the_ingest_as_h264_and_aac_lip_synced(
    tmp_path: Path, rtmp: RtmpServer
) -> None:
    require_espeak()
    async with _app(_settings(tmp_path)) as client:
        url = rtmp.url("avatar")
        created = await client.post(
            "/sessions", json={"avatar": "demo", "outputs": [{"rtmp": url}]}
        )
        assert created.status == 201, await created.text()
        sid = (await created.json())["session_id"]
        await until(_live(client, sid), "the output to go live")
        (listed,) = await _outputs(client, sid)
        assert listed["target"] == f"rtmp://127.0.0.1:{rtmp.port}/live/…"  # no stream key
        package = client.app[SESSIONS].get(sid).pipeline.avatar.package
        back = ReadBack()
        player = threading.Thread(target=_play, args=(url, Mouth(package), back))
        player.start()
        try:
            await until(lambda: len(back.video) >= 25 or back.error, "the player's frames")
            assert back.error is None, back.error + rtmp.log()
            said = await client.post(
                f"/sessions/{sid}/say", json={"text": "Hello everyone, welcome to the show."}
            )
            assert said.status == 202
            spoken_s = (await said.json())["duration_ms"] / 1000
            seen = len(back.video)
            await until(
                lambda: len(back.video) >= seen + (spoken_s + 2.5) * FPS or back.error,
                "the sentence and a pause after it",
            )
        finally:
            back.stop.set()
            await asyncio.to_thread(player.join, 30)
        assert back.error is None, back.error
        assert back.codecs == ["aac", "h264"]
        steps = [b[0] - a[0] for a, b in zip(back.video, back.video[1:], strict=False)]
        assert statistics.median(steps) == 1000 // FPS  # 25 fps on the stream's clock
        assert sum(step == 40 for step in steps) >= 0.9 * len(steps), steps
        # The mouth moves with the sound, on the stream's one clock.
        audio_onset = min(ms for ms, rms in back.audio if rms > 0.02)
        video_onset = min(ms for ms, diff in back.video if diff > 8 and ms >= audio_onset - 500)
        assert abs(video_onset - audio_onset) <= 80, (audio_onset, video_onset)
        moving = [d for ms, d in back.video if audio_onset + 300 < ms < audio_onset + 1500]
        assert np.mean(np.array(moving) > 8) > 0.5, moving
        resting = [d for ms, d in back.video if ms < audio_onset - 300]
        assert resting
        assert max(resting) < 4, resting
        state = await session_state(client, sid)
        assert state["outputs"] == 1
        (status,) = await _outputs(client, sid)
        assert status["connects"] == 1
        assert status["bytes_sent"] > 0
        removed = await client.delete(f"/sessions/{sid}/outputs/{status['output_id']}")
        assert removed.status == 200
        assert (await removed.json())["state"] == "ended"
        assert await _outputs(client, sid) == []


async def test_an_ingest_that_drops_is_tried_again_and_the_session_goes_on(
    tmp_path: Path,
) -> None:
    port = free_port()
    async with _app(_settings(tmp_path)) as client:
        created = await client.post("/sessions", json={"avatar": "demo"})
        sid = (await created.json())["session_id"]
        url = f"rtmp://127.0.0.1:{port}/live/avatar"
        added = await client.post(f"/sessions/{sid}/outputs", json={"rtmp": url})
        assert added.status == 201, await added.text()
        output_id = (await added.json())["output_id"]

        async def refused() -> bool:  # nothing listens yet: it fails and waits
            (status,) = await _outputs(client, sid)
            return status["state"] == "retrying" and status["last_error"] is not None

        await until(refused, "the refused output to retry")
        async with run_rtmp_server(tmp_path / "nginx", port=port) as server:
            await until(_live(client, sid), "the output to reach the ingest once it is up")
            await server.stop()  # the ingest vanishes mid-stream
            await until(refused, "the output to notice")
        async with run_rtmp_server(tmp_path / "nginx2", port=port):
            await until(_live(client, sid, frames=0), "the output to come back")
            (status,) = await _outputs(client, sid)
            assert status["connects"] == 2
        sent = client.app[SESSIONS].get(sid).frames_sent
        await until(lambda: client.app[SESSIONS].get(sid).frames_sent > sent + 10, "the session")
        assert (await client.delete(f"/sessions/{sid}/outputs/{output_id}")).status == 200


async def test_an_ingest_that_never_answers_is_given_up_on_and_tried_again(
    tmp_path: Path,
) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # takes the connection, never says a word of RTMP

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with _app(_settings(tmp_path, connect_timeout_s=1.0)) as client:
            outputs = [{"rtmp": f"rtmp://127.0.0.1:{port}/live/key"}]
            created = await client.post("/sessions", json={"avatar": "demo", "outputs": outputs})
            sid = (await created.json())["session_id"]

            async def given_up_twice() -> bool:
                (status,) = await _outputs(client, sid)
                return status["retries"] >= 2 and "not live" in (status["last_error"] or "")

            await until(given_up_twice, "the silent ingest to be given up on, twice")
            assert len(accepted) >= 2  # it came back to try again
            sent = client.app[SESSIONS].get(sid).frames_sent
            await until(
                lambda: client.app[SESSIONS].get(sid).frames_sent > sent + 10, "the session"
            )
            (status,) = await _outputs(client, sid)
            removed = await client.delete(f"/sessions/{sid}/outputs/{status['output_id']}")
            assert removed.status == 200
            assert (await removed.json())["state"] == "ended"
    finally:
        for writer in accepted:
            writer.close()
        server.close()


async def test_targets_the_server_may_not_push_to_are_refused(tmp_path: Path) -> None:
    settings = _settings(tmp_path, allow_private=False, max_per_session=1)
    async with _app(settings) as client:
        for target, words in (
            ("rtmp://127.0.0.1/live/key", "not a public address"),
            ("rtmp://10.1.2.3:1935/live/key", "not a public address"),
            ("rtmp://[::1]/live/key", "not a public address"),
            ("http://example.com/live/key", "rtmp://"),
            ("rtmp://example.com", "app/stream-key"),
            ("rtmp://example.com:99999/live/key", "port"),
            ("rtmp://no-such-host.invalid/live/key", "does not resolve"),
        ):
            refused = await client.post(
                "/sessions", json={"avatar": "demo", "outputs": [{"rtmp": target}]}
            )
            body = await refused.json()
            assert refused.status == 400, (target, body)
            assert body["error"]["code"] == "bad_output"
            assert words in body["error"]["message"], (target, body)
        assert client.app[SESSIONS].live_count == 0  # refused before any session was made
        two = [{"rtmp": "rtmp://192.0.2.1/live/a"}, {"rtmp": "rtmp://192.0.2.1/live/b"}]
        too_many = await client.post("/sessions", json={"avatar": "demo", "outputs": two})
        assert too_many.status == 409
        assert (await too_many.json())["error"]["code"] == "too_many_outputs"
        sid = (await (await client.post("/sessions", json={"avatar": "demo"})).json())["session_id"]
        bad = await client.post(f"/sessions/{sid}/outputs", json={"rtmp": 5})
        assert bad.status == 400
        unknown = await client.delete(f"/sessions/{sid}/outputs/nope")
        assert unknown.status == 404
        assert (await session_state(client, sid))["state"] == "streaming"
