"""Offline render: an audio file in, an H.264 mp4 of the avatar lip-syncing it out.

The same per-frame steps as a live session (features → sequencer → prepare → model →
compose), run as fast as the machine allows instead of paced, then encoded with libx264
and muxed with the input audio (AAC). The output has ``ceil(duration · fps)`` frames, so
it is as long as the audio to within one frame.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from compositor.background_cache import AvatarFrames, BackgroundCache
from compositor.sequencer import FrameSequencer
from inference_core.adapter.lipsync import LipSyncAdapter
from inference_core.avatars.package import AvatarPackage
from inference_core.features.encoder import AudioEncoder
from inference_core.features.stream import FrameAudio, offline_features
from inference_core.features.timing import lookahead_ms
from streaming.audio_in.decode import DecodedAudio, decode_audio
from streaming.audio_rates import FEATURE_RATE
from streaming.frame_pipeline import FramePipeline

logger = logging.getLogger(__name__)

AUDIO_CHUNK = 1024  # AAC frame size


@dataclass(frozen=True)
class RenderOptions:
    """Knobs of the offline render (built from the validated settings by the CLI)."""

    right_context: int = 7
    vad_threshold_db: float = -45.0
    hangover_frames: int = 4
    blend_frames: int = 3
    max_batch_size: int = 8
    preset: str = "veryfast"
    crf: int = 20
    cache_bytes: int = 256 * 1024 * 1024
    providers: Sequence[str] = ("CPUExecutionProvider",)
    max_seconds: float | None = None  # render only the audio's first seconds
    draw_rects: bool = False  # outline each frame's crop rect (a preview of the crops)


@dataclass(frozen=True)
class RenderResult:
    """What was written."""

    path: Path
    frames: int
    inferred_frames: int
    duration_s: float
    fps: int
    seconds: float
    lookahead_ms: float  # audio a frame needs past its own time (what a live stream waits)


def render_file(
    package: AvatarPackage,
    audio_path: Path,
    out_path: Path,
    options: RenderOptions,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> RenderResult:
    """Render ``audio_path`` with ``package`` into ``out_path`` (mp4, H.264 + AAC).

    ``progress(done, total)`` is called after each batch of frames. The file appears only
    when complete (written to a temporary name first). Raises ``AudioInputError`` for unusable
    audio and ``ModelLoadError`` for models that cannot be used.
    """
    started = time.perf_counter()
    spec = package.manifest.adapter
    fps = package.manifest.fps
    audio = decode_audio(audio_path)
    if options.max_seconds is not None:
        audio = _first_seconds(audio, options.max_seconds)
    adapter = LipSyncAdapter.from_path(
        package.lipsync_path,
        spec,
        max_batch_size=options.max_batch_size,
        providers=list(options.providers),
    )
    encoder = None
    if spec.audio_feature == "ave" and package.encoder_path is not None:
        encoder = AudioEncoder.from_path(package.encoder_path, providers=list(options.providers))
    features = offline_features(
        audio.pcm_16k,
        encoder,
        kind=spec.audio_feature,
        fps=fps,
        right_context=options.right_context,
    )
    frames = AvatarFrames(
        package.avatar_id, package.frame_paths, BackgroundCache(options.cache_bytes)
    )
    pipeline = FramePipeline(package, frames)
    sequencer = FrameSequencer(
        package.frame_count,
        threshold_db=options.vad_threshold_db,
        hangover_frames=options.hangover_frames,
        blend_frames=options.blend_frames,
    )
    lookahead = lookahead_ms(options.right_context, fps, kind=spec.audio_feature)
    logger.info(
        "rendering avatar=%s audio=%s duration_s=%.2f frames=%d right_context=%d lookahead_ms=%.1f",
        package.avatar_id,
        audio_path,
        audio.duration_s,
        len(features),
        options.right_context,
        lookahead,
    )
    tmp_path = out_path.with_name(f".{out_path.name}.partial.mp4")
    inferred = 0
    try:
        with av.open(str(tmp_path), mode="w", format="mp4") as container:
            w, h = package.manifest.frame_size
            video = container.add_stream("libx264", rate=fps)
            video.width, video.height, video.pix_fmt = w, h, "yuv420p"
            video.options = {"preset": options.preset, "crf": str(options.crf)}
            sound = container.add_stream("aac", rate=audio.out_rate, layout=audio.layout)
            for start in range(0, len(features), options.max_batch_size):
                chunk = features[start : start + options.max_batch_size]
                inferred += _render_chunk(
                    chunk, sequencer, pipeline, adapter, container, video, options.draw_rects
                )
                if progress is not None:
                    progress(start + len(chunk), len(features))
            container.mux(video.encode(None))
            _write_audio(container, sound, audio)
        os.replace(tmp_path, out_path)
    finally:
        tmp_path.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    logger.info(
        "rendered out=%s frames=%d inferred=%d seconds=%.2f fps=%.1f",
        out_path,
        len(features),
        inferred,
        seconds,
        len(features) / max(seconds, 1e-9),
    )
    return RenderResult(
        out_path, len(features), inferred, audio.duration_s, fps, seconds, lookahead
    )


def _render_chunk(
    chunk: list[FrameAudio],
    sequencer: FrameSequencer,
    pipeline: FramePipeline,
    adapter: LipSyncAdapter,
    container: av.container.OutputContainer,
    video: av.VideoStream,
    draw_rects: bool = False,
) -> int:
    """Sequence, infer (one batch), compose and encode a run of frames; return # inferred."""
    prepared = [pipeline.prepare(sequencer.step(f.level_db)) for f in chunk]
    todo = [i for i, p in enumerate(prepared) if p.visual is not None]
    faces: dict[int, np.ndarray] = {}
    if todo:
        visual = np.stack([prepared[i].visual for i in todo])  # type: ignore[misc]
        audio = np.stack([chunk[i].features for i in todo])
        faces = dict(zip(todo, adapter.run(visual, audio), strict=True))
    for i, (item, feat) in enumerate(zip(prepared, chunk, strict=True)):
        composed = pipeline.compose(item, faces.get(i))
        if draw_rects:
            composed = outline(composed, item.rect)
        frame = av.VideoFrame.from_ndarray(composed, format="yuv420p")
        frame.pts = feat.index
        frame.time_base = Fraction(1, pipeline.package.manifest.fps)
        container.mux(video.encode(frame))
    return len(todo)


def outline(frame: np.ndarray, rect: tuple[int, int, int, int], width: int = 2) -> np.ndarray:
    """A copy of a yuv420p frame with ``rect`` outlined in white on its luma plane."""
    out = frame.copy()
    x1, y1, x2, y2 = rect
    luma = out[: out.shape[0] * 2 // 3]
    luma[y1 : y1 + width, x1:x2] = 255
    luma[max(y2 - width, y1) : y2, x1:x2] = 255
    luma[y1:y2, x1 : x1 + width] = 255
    luma[y1:y2, max(x2 - width, x1) : x2] = 255
    return out


def _first_seconds(audio: DecodedAudio, seconds: float) -> DecodedAudio:
    keep_16k = max(1, int(seconds * FEATURE_RATE))
    keep_out = max(1, int(seconds * audio.out_rate))
    return dataclasses.replace(
        audio, pcm_16k=audio.pcm_16k[:keep_16k], pcm_out=audio.pcm_out[:, :keep_out]
    )


def _write_audio(
    container: av.container.OutputContainer, stream: av.AudioStream, audio: DecodedAudio
) -> None:
    pcm = audio.pcm_out
    for start in range(0, pcm.shape[1], AUDIO_CHUNK):
        block = np.ascontiguousarray(pcm[:, start : start + AUDIO_CHUNK])
        frame = av.AudioFrame.from_ndarray(block, format="fltp", layout=audio.layout)
        frame.sample_rate = audio.out_rate
        frame.pts = start
        frame.time_base = Fraction(1, audio.out_rate)
        container.mux(stream.encode(frame))
    container.mux(stream.encode(None))
