"""Live CPU per 720p frame against the same stages run offline, and what the gap is made of.

    .venv/bin/python -m benchmarks.run --only live_cpu [--quick]

Three figures, each in ms of CPU per video frame, for the demo avatar at 1280×720 with
every frame speaking (lip-synced):

* **offline**: the stages one frame needs, chained on one thread in a child process
  pinned to one core, measured in this run: two 20 ms chunks resampled to 16 kHz, turned
  into features and Opus-encoded, and two of the caller's Opus packets decoded; crop +
  model input; the lip-sync model at batch 1 with
  the server's CPU session options; paste-back; H.264 encode + RTP packetising with the
  sender's encoder (the configured preset, one x264 thread);
* **live**: the server process's CPU (user + system time of all its threads) over a
  window of K calls placed by a separate load client, each sending speech as its
  microphone (Opus, as a browser does), divided by the frames the server sent;
* **live stages**: the CPU the same stage functions used inside the live server over
  that window (``time.thread_time`` around each call, installed for the window only; a
  stage run inside another, the crop inside the chunk job, counts once).

The last column is what the server's own CPU meter (``streaming/live/cpu_meter.py``, what
admission prices a frame at) read at the end of the window: it should be close to
**live**, a little above it (its window starts earlier and holds the call's set-up).

``live / offline`` is the cost of a call against the work it must do. ``live - live
stages`` is the live path around the stages (the event loop's pacing, RTP sending,
SRTP and RTCP, thread hand-offs, batching); ``live stages / offline`` is the stages
themselves running slower beside the load client, which shares the machine (on the
2-vCPU development VM the same feature code runs 1.4–1.7× slower with a numpy job on the
other vCPU). K = 1 and 4. Target: live / offline ≤ 1.5 at K = 1 (issue 12). Not a test.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import Result, Target, print_table, print_targets
from benchmarks.live_server import (
    client_result,
    cpu_seconds,
    live_server,
    start_load,
    wait_for_calls,
    write_speech,
)
from inference_core.assets.demo_avatar import write_demo_avatar
from web.app_keys import SESSIONS

SIZE = (1280, 720)
CALLS = (1, 4)
TARGET_RATIO = 1.5
SAMPLE = Path(__file__).resolve().parent.parent / "web" / "static" / "sample.wav"


# -- offline: the stages chained on one core ---------------------------------------------


def _offline(frames: int, root: Path) -> dict[str, float]:
    """CPU ms per frame of each stage, chained as a live frame needs them (in the child)."""
    import av
    import numpy as np

    from compositor.background_cache import AvatarFrames, BackgroundCache
    from compositor.sequencer import FrameStep
    from config.settings import Settings
    from inference_core.adapter.lipsync import LipSyncAdapter
    from inference_core.avatars.locator import AvatarLocator
    from inference_core.features.encoder import AudioEncoder
    from inference_core.features.stream import AudioFeatureStream
    from inference_core.serving.devices import Device, session_config
    from streaming.audio_in.decode import decode_audio
    from streaming.audio_in.resample import MonoResampler, resample_mono
    from streaming.audio_rates import CHUNK_SAMPLES, FEATURE_RATE, OUT_RATE
    from streaming.frame_pipeline import FramePipeline
    from streaming.webrtc.tracks import OpusChunkEncoder, video_frame
    from streaming.webrtc.video_encoder import EncoderFactory

    settings = Settings.model_validate({"devices": {"kind": "cpu"}})
    write_demo_avatar(root / "demo", size=SIZE, count=25)
    package = AvatarLocator(root).load("demo")
    spec = package.manifest.adapter
    avatar = AvatarFrames("demo", package.frame_paths, BackgroundCache(512 << 20))
    for i in range(len(avatar)):
        avatar.get(i)  # a warm cache, as in a running server
    pipeline = FramePipeline(package, avatar)
    providers, options = session_config(Device(0, "cpu"), settings.devices)
    adapter = LipSyncAdapter.from_path(
        package.lipsync_path, spec, providers=providers, options=options
    )
    encoder = AudioEncoder.from_path(package.encoder_path or Path())
    speech = resample_mono(decode_audio(SAMPLE).pcm_16k, FEATURE_RATE, OUT_RATE)
    video = EncoderFactory(settings.video).create(*SIZE)
    cost: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def timed(stage: str) -> Iterator[None]:
        start = time.thread_time()
        yield
        cost[stage] += time.thread_time() - start

    resampler, opus = MonoResampler(OUT_RATE, FEATURE_RATE), OpusChunkEncoder()
    received = av.CodecContext.create("libopus", "r")  # the caller's microphone
    received.sample_rate, received.layout = 48_000, "mono"
    stream = AudioFeatureStream(encoder)
    ready: list[Any] = []
    chunks = len(speech) // CHUNK_SAMPLES
    for n in range(frames + 20):  # 20 frames to warm up, not counted
        if n == 20:
            cost.clear()
        for c in (2 * n % chunks, (2 * n + 1) % chunks):
            chunk = speech[c * CHUNK_SAMPLES : (c + 1) * CHUNK_SAMPLES]
            with timed("audio: resample + features"):
                ready.extend(stream.push(resampler.push(chunk)))
            with timed("audio: Opus encode"):
                packet = opus.encode(chunk, c)
            with timed("caller's Opus decode"):
                received.decode(av.Packet(bytes(packet)))
        item = ready.pop(0) if ready else None
        features = (
            item.features if item is not None else np.zeros(spec.audio_shape, dtype=np.float32)
        )
        with timed("crop + model input"):
            prepared = pipeline.prepare(FrameStep(n, n % len(avatar), 1.0))
        assert prepared.visual is not None
        with timed("lip-sync model (batch 1)"):
            face = adapter.run(prepared.visual[None], features[None])[0]
        with timed("paste-back"):
            composed = pipeline.compose(prepared, face)
        with timed("H.264 encode + packetise"):
            video.encode_packet(video_frame(composed, n, 25))
    return {stage: seconds * 1000 / frames for stage, seconds in cost.items()}


def child(frames: int, out: Path) -> None:
    import cv2

    cv2.setNumThreads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out.write_text(json.dumps(_offline(frames, Path(tmp))))


def _offline_in_child(frames: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "offline.json"
        subprocess.run(
            [sys.executable, "-m", "benchmarks.live_cpu", "--child", str(frames), str(out)],
            check=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
        )
        result: dict[str, float] = json.loads(out.read_text())
        return result


# -- live: the server's CPU and its stages' -----------------------------------------------


#: A method to time: its class, its name, the stage it is counted as.
Patch = tuple[type, str, str]


def live_stages() -> list[Patch]:
    """The stage functions of a live frame, as :func:`stage_cpu` times them by default."""
    from inference_core.serving.loaded_model import LoadedModel
    from streaming.frame_pipeline import FramePipeline
    from streaming.live.timeline import AudioTimeline
    from streaming.webrtc.audio_receive import ArrivalOrderAudioBuffer
    from streaming.webrtc.video_encoder import LipstreamH264Encoder

    return [
        (ArrivalOrderAudioBuffer, "_decode", "caller's Opus decode"),
        (AudioTimeline, "_process_chunks", "audio: resample + features + Opus"),
        (FramePipeline, "prepare", "crop + model input"),
        (LoadedModel, "run_batch", "lip-sync model (batched)"),
        (FramePipeline, "compose", "paste-back"),
        (LipstreamH264Encoder, "encode_packet", "H.264 encode + packetise"),
    ]


@contextmanager
def stage_cpu(
    patched: list[Patch] | None = None, calls: defaultdict[str, int] | None = None
) -> Iterator[defaultdict[str, float]]:
    """CPU seconds per stage function while the block runs (all threads), by patching the
    classes' methods with ``thread_time`` wrappers; restored after. ``patched`` defaults
    to :func:`live_stages`; ``calls``, when given, counts each stage's calls."""
    cost: defaultdict[str, float] = defaultdict(float)
    patched = live_stages() if patched is None else patched
    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in patched]
    # A stage called inside another (the crop runs in the chunk job that completes the
    # frame's features) is counted once, as itself: the outer stage's time excludes it.
    nested = threading.local()

    def wrap(fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            outer_inner = getattr(nested, "inner", 0.0)
            nested.inner = 0.0
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                cost[stage] += spent - nested.inner
                nested.inner = outer_inner + spent
                if calls is not None:
                    calls[stage] += 1

        return timed

    for owner, name, stage in patched:
        setattr(owner, name, wrap(owner.__dict__[name], stage))
    try:
        yield cost
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


async def _live(root: Path, calls: int, seconds: float) -> dict[str, Any]:
    speech = write_speech(root / "speech.wav", seconds + 15)
    async with live_server(root) as (app, url):
        load = start_load(url, calls=calls, seconds=seconds, speech=speech, microphone=True)
        client = await load
        sessions = await wait_for_calls(app, calls, lambda s: s.frames_sent > 0)
        await asyncio.sleep(2.0)  # every call speaking, caches warm
        sent0 = sum(s.frames_sent for s in sessions)
        inferred0 = sum(s.stats.frames_inferred for s in sessions)
        with stage_cpu() as cost:
            cpu0, t0 = cpu_seconds(), time.monotonic()
            await asyncio.sleep(seconds * 0.7)
            cpu, window = cpu_seconds() - cpu0, time.monotonic() - t0
            stages = dict(cost)
            meter = app[SESSIONS].cpu_meter.ms_per_frame()
        sent = sum(s.frames_sent for s in sessions) - sent0
        inferred = sum(s.stats.frames_inferred for s in sessions) - inferred0
        out, _ = await client.communicate()
        client_result(out, client.returncode)
    return {
        "calls": calls,
        "window_s": window,
        "frames_sent": sent,
        "inferred_share": inferred / sent if sent else 0.0,
        "server_cores": cpu / window,
        "live_ms": cpu * 1000 / sent,
        "stages_ms": {k: v * 1000 / sent for k, v in stages.items()},
        "meter_ms": meter,
    }


def run(quick: bool = False) -> Result:
    seconds = 8.0 if quick else 14.0
    offline = _offline_in_child(100 if quick else 250)
    offline_ms = sum(offline.values())
    live = []
    with tempfile.TemporaryDirectory() as tmp:
        for calls in CALLS:
            root = Path(tmp) / f"k{calls}"
            write_demo_avatar(root / "avatars" / "demo", size=SIZE)
            live.append(asyncio.run(_live(root, calls, seconds)))
    print_table(
        "Offline: the stages of one 720p frame, chained on one core (CPU ms per frame)",
        ["stage", "ms / frame"],
        [[k, v] for k, v in offline.items()] + [["**total**", offline_ms]],
    )
    rows = []
    for r in live:
        staged = sum(r["stages_ms"].values())
        rows.append(
            [
                r["calls"],
                r["frames_sent"],
                f"{100 * r['inferred_share']:.0f}%",
                r["server_cores"],
                r["live_ms"],
                staged,
                r["live_ms"] - staged,
                r["live_ms"] / offline_ms,
                r["live_ms"] / staged,
                r["meter_ms"],
            ]
        )
    print_table(
        f"Live 720p calls ({seconds * 0.7:.0f} s window): server CPU per frame sent (ms)",
        [
            "calls",
            "frames",
            "inferred / sent",
            "server cores",
            "live",
            "live stages",
            "live path",
            "live / offline",
            "live / live stages",
            "admission's meter",
        ],
        rows,
    )
    ratio = live[0]["live_ms"] / offline_ms
    targets = [Target("live / offline at 1 call", ratio, TARGET_RATIO, False)]
    print_targets(targets)
    return {
        "offline_ms": offline,
        "live": live,
        "targets": [t.as_json() for t in targets],
    }


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        run(quick="--quick" in sys.argv)
