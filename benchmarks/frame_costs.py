"""Per-output-frame cost of each pipeline stage on the demo avatar (CPU, one thread each).

    .venv/bin/python benchmarks/frame_costs.py [--frames 200] [--json out.json]

Prints a table in ms per frame: audio features (20 ms pushes), crop + model input,
the demo model (batch 1 and 8), paste-back, frame wrap and H.264 encode (libx264
veryfast / zerolatency), plus a whole offline render. Not a test: figures vary by machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from compositor.background_cache import AvatarFrames, BackgroundCache
from compositor.sequencer import FrameStep
from inference_core.adapter import LipSyncAdapter
from inference_core.audio_encoder import AudioEncoder
from inference_core.audio_features import AudioFeatureStream
from inference_core.avatar import AvatarLocator
from streaming.audio_decode import decode_audio
from streaming.frame_pipeline import FramePipeline
from streaming.offline_render import RenderOptions, render_file

SAMPLE = Path(__file__).resolve().parent.parent / "web" / "static" / "sample.wav"


def per_call_ms(fn: Callable[[], object], repeat: int) -> float:
    """Best-of-3 mean time of ``fn`` over ``repeat`` calls, in ms."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    n = args.frames

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        package = AvatarLocator(data / "none", data, demo=True).load("demo")
        spec = package.manifest.adapter
        audio = decode_audio(SAMPLE)
        encoder = AudioEncoder.from_path(package.encoder_path or Path())
        adapter = LipSyncAdapter.from_path(package.lipsync_path, spec, max_batch_size=8)
        frames = AvatarFrames("demo", package.frame_paths, BackgroundCache(512 << 20))
        pipeline = FramePipeline(package, frames)
        for i in range(package.frame_count):
            frames.get(i)  # warm the cache: we measure compositing, not JPEG decoding

        results: dict[str, float] = {}

        def features() -> None:
            stream = AudioFeatureStream(encoder)
            pcm = audio.pcm_16k[: 640 * n]
            for start in range(0, len(pcm), 320):
                stream.push(pcm[start : start + 320])

        results["audio features (20 ms pushes)"] = per_call_ms(features, 1) / n
        steps = [FrameStep(i, i % package.frame_count, 1.0) for i in range(n)]
        results["crop + model input"] = per_call_ms(
            lambda: [pipeline.prepare(s) for s in steps], 1
        ) / n
        prepared = [pipeline.prepare(s) for s in steps[:8]]
        visual = np.stack([p.visual for p in prepared])  # type: ignore[misc]
        windows = np.zeros((8, *spec.audio_shape), dtype=np.float32)
        results["demo model, batch 1"] = per_call_ms(
            lambda: adapter.run(visual[:1], windows[:1]), 20
        )
        results["demo model, batch 8"] = per_call_ms(lambda: adapter.run(visual, windows), 5) / 8
        faces = adapter.run(visual, windows)
        results["paste-back (compose + blend)"] = per_call_ms(
            lambda: pipeline.compose(prepared[0], faces[0]), 50
        )
        out = pipeline.compose(prepared[0], faces[0])
        results["VideoFrame.from_ndarray (yuv420p)"] = per_call_ms(
            lambda: av.VideoFrame.from_ndarray(out, format="yuv420p"), 100
        )
        codec = av.CodecContext.create("libx264", "w")
        codec.width, codec.height = package.manifest.frame_size
        codec.pix_fmt, codec.time_base = "yuv420p", Fraction(1, 25)
        codec.options = {"preset": "veryfast", "tune": "zerolatency"}
        composed = [pipeline.compose(p, f) for p, f in zip(prepared, faces, strict=True)]
        counter = iter(range(10**9))

        def encode() -> None:
            k = next(counter)
            frame = av.VideoFrame.from_ndarray(composed[k % 8], format="yuv420p")
            frame.pts = k
            codec.encode(frame)

        results["H.264 encode (libx264 veryfast zerolatency)"] = per_call_ms(encode, 50)
        render = render_file(package, SAMPLE, data / "out.mp4", RenderOptions())
        results["whole offline render, per frame"] = render.seconds * 1000.0 / render.frames

    w, h = package.manifest.frame_size
    print(f"demo avatar {w}x{h}, {n} frames; ms per output frame")
    for name, ms in results.items():
        print(f"  {name:<45} {ms:8.3f}")
    print(f"  offline render speed: {1000.0 / results['whole offline render, per frame']:.1f} fps")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
