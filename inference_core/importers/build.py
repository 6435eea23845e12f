"""``lipstream avatar build --video``: an avatar source from a video of a person.

Decodes the video at the avatar's fps, finds the face per frame (a detector or a rects
file), smooths the crop track, keeps the segment whose ends move least and writes the
frames as JPEGs into a work directory for :func:`~.writer.write_package`
(``docs/design/avatars.md`` §10). ``prepare_synctalk`` writes what SyncTalk_2D's training
wants instead, since its models are trained per person.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np

from inference_core.adapter.spec import AdapterSpec
from inference_core.importers.clips import ClipOption, clip_ranges, clips_span, describe
from inference_core.importers.errors import ImportFailedError
from inference_core.importers.rects import fit_rects
from inference_core.importers.video import (
    DETECTOR_HELP,
    FaceDetector,
    Progress,
    crop_rect,
    decode_frames,
    fill_gaps,
    quietest_segment,
    smooth,
    thumbnail,
)
from inference_core.importers.writer import AvatarSource

logger = logging.getLogger(__name__)


def build_from_video(
    video: Path,
    lipsync: Path,
    audio_encoder: Path | None,
    work_dir: Path,
    *,
    detector: Path | None = None,
    rects_file: Path | None = None,
    fps: int = 25,
    jpeg_quality: int = 95,
    min_seconds: float = 4.0,
    max_gap: int = 12,
    clips: Sequence[ClipOption] = (),
    progress: Progress | None = None,
) -> AvatarSource:
    """Frames and rects from ``video``; the frames are written under ``work_dir``.

    ``clips`` count in the video's frames (or seconds); the kept segment holds them all."""
    if (detector is None) == (rects_file is None):
        raise ImportFailedError(f"give exactly one of --face-detector and --rects; {DETECTOR_HELP}")
    boxes = _read_rects_file(rects_file) if rects_file is not None else None
    finder = FaceDetector(detector) if detector is not None else None
    frames_dir = work_dir / "frames"
    frames_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    thumbs: list[np.ndarray] = []
    centres: list[tuple[float, float, float] | None] = []
    size: tuple[int, int] | None = None
    for i, image in enumerate(decode_frames(video, fps)):
        h, w = image.shape[:2]
        image = image[: h - h % 2, : w - w % 2]  # 4:2:0 wants even sizes
        size = size or (image.shape[1], image.shape[0])
        if boxes is not None:
            box = boxes[i] if i < len(boxes) else None
        else:
            assert finder is not None
            found = finder.detect(image)
            box = None if found is None else found[:4]
        centres.append(None if box is None else crop_rect(box))
        path = frames_dir / f"{i:05d}.jpg"
        if not cv2.imwrite(str(path), image, [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality]):
            raise ImportFailedError(f"{path}: could not be written (disk full?)")
        paths.append(path)
        thumbs.append(thumbnail(image))
        if progress is not None and i % 25 == 0:
            progress(i + 1, i + 1)
    if size is None:
        raise ImportFailedError(f"{video}: no video frames decoded")
    if boxes is not None and len(boxes) < len(paths):
        raise ImportFailedError(
            f"{rects_file}: {len(boxes)} rects for {len(paths)} frames at {fps} fps"
        )
    filled = sum(c is None for c in centres)
    track = smooth(fill_gaps(centres, max_gap))
    span = clips_span(clips, fps)
    if span is not None and span[1] > len(paths):
        clip_ranges(clips, fps, len(paths))  # refuses the clip past the end, naming it
    segment = quietest_segment(np.stack(thumbs), max(2, round(min_seconds * fps)), span)
    ranges = clip_ranges(clips, fps, segment.stop - segment.start, shift=segment.start)
    cx, cy, side = (track[segment.start : segment.stop].T).astype(np.float64)
    raw = np.rint(np.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], 1))
    fitted = fit_rects(raw.astype(np.int64), size, source=f"face track of {video}")
    notes = [
        f"kept frames {segment.start}-{segment.stop - 1} of {len(paths)}: the segment whose "
        f"two ends move least (mean change {segment.end_motion:.1f}/255 at the turns)",
    ]
    if ranges:
        notes.append(f"clips, in the kept frames: {describe(ranges)}")
    if filled:
        notes.append(f"{filled} frame(s) without a face were interpolated from their neighbours")
    if fitted.max_shift_px:
        notes.append(
            f"crops past the frame edge were moved inside by up to {fitted.max_shift_px} px"
        )
    return AvatarSource(
        kind="video",
        frames=paths[segment.start : segment.stop],
        rects=fitted.rects,
        frame_size=size,
        lipsync=lipsync,
        audio_encoder=audio_encoder,
        adapter=AdapterSpec(),
        fps=fps,
        notes=notes,
        clips=ranges,
    )


def _read_rects_file(path: Path) -> list[tuple[float, float, float, float] | None]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImportFailedError(f"{path}: not readable JSON: {exc}") from exc
    if not isinstance(raw, list) or not all(
        r is None or (isinstance(r, list) and len(r) == 4) for r in raw
    ):
        raise ImportFailedError(
            f"{path}: must be a list with one [x1, y1, x2, y2] face box (or null) per frame"
        )
    return [None if r is None else (r[0], r[1], r[2], r[3]) for r in raw]


def prepare_synctalk(video: Path, out_dir: Path, name: str, *, fps: int = 25) -> list[Path]:
    """Write ``out_dir/<name>.mp4`` at ``fps`` and ``out_dir/aud.wav`` (16 kHz mono).

    That is what SyncTalk_2D's ``data_utils/process.py`` starts from to train a model of
    this person.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    clip, wav = out_dir / f"{name}.mp4", out_dir / "aud.wav"
    with av.open(str(clip), mode="w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18"}
        for i, image in enumerate(decode_frames(video, fps)):
            h, w = image.shape[:2]
            image = image[: h - h % 2, : w - w % 2]
            if i == 0:
                stream.width, stream.height = image.shape[1], image.shape[0]
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    _write_audio_16k(video, wav)
    return [clip, wav]


def _write_audio_16k(video: Path, wav: Path) -> None:
    with av.open(str(video)) as source:
        if not source.streams.audio:
            raise ImportFailedError(
                f"{video}: has no audio track; SyncTalk_2D trains on the person's speech"
            )
        resampler = av.AudioResampler(format="s16", layout="mono", rate=16000)
        with av.open(str(wav), mode="w", format="wav") as out:
            stream = out.add_stream("pcm_s16le", rate=16000, layout="mono")
            for frame in source.decode(audio=0):
                for chunk in resampler.resample(frame):
                    out.mux(stream.encode(chunk))
            for chunk in resampler.resample(None):
                out.mux(stream.encode(chunk))
            out.mux(stream.encode(None))
