"""Reading other projects' avatar folders into an :class:`AvatarSource`.

* SyncTalk_2D: ``full_body_img/<i>.jpg`` (no zero padding) and ``landmarks/<i>.lms``
  (110 ``x y`` lines); the crop is SyncTalk_2D's own landmark rule (:mod:`.rects`).
* LiveTalking: ``full_imgs/`` and ``coords.pkl`` (wav2lip stores ``y1, y2, x1, x2``,
  ultralight ``x1, y1, x2, y2``), read without running the pickle (:mod:`.safe_pickle`).
* Ultralight-Digital-Human: its audio features (HuBERT or WeNet) are not computed by
  lipstream yet, so its avatars are refused with what is missing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np

from inference_core.adapter.spec import AdapterSpec
from inference_core.importers.errors import ImportFailedError
from inference_core.importers.rects import fit_rects, read_landmarks, synctalk_rect
from inference_core.importers.safe_pickle import load_numbers
from inference_core.importers.writer import AvatarSource, frame_size_of

Progress = Callable[[int, int], None]

#: What Wav2Lip 96 models take (LiveTalking's wav2lip avatars).
WAV2LIP_SPEC = AdapterSpec(
    name="wav2lip_96",
    input_size=96,
    crop_size=96,
    crop_border=0,
    mask_rect=(0, 48, 96, 48),
    color_order="bgr",
    channel_order="masked_first",
    pixel_scale="zero_one",
    output_scale="zero_one",
    audio_feature="mel",
    audio_shape=(1, 80, 16),
    paste_mode="feather",
)

ULTRALIGHT_MISSING = (
    "Ultralight-Digital-Human models take HuBERT (16x32x32 per frame) or WeNet (128x16x32) "
    "audio features, which lipstream does not compute yet (it computes SyncTalk_2D's 'ave' "
    "and Wav2Lip's mel features); import a SyncTalk_2D or Wav2Lip avatar, or follow the "
    "issue tracker for Ultralight audio support"
)
WATERMARK_NOTE = (
    "LiveTalking's avatar generators stamp 'LiveTalking' text on the full frames; look at "
    "a frame (lipstream avatar preview) and regenerate them without it if it shows"
)


def numbered_files(directory: Path, suffixes: tuple[str, ...], what: str) -> list[Path]:
    """Files named ``<number><suffix>`` in ``directory``, in order; gaps are refused."""
    if not directory.is_dir():
        raise ImportFailedError(f"{directory}: missing; {what} should be there")
    found: dict[int, Path] = {}
    for path in directory.iterdir():
        match = re.fullmatch(r"(\d+)", path.stem)
        if match and path.suffix.lower() in suffixes:
            found[int(match.group(1))] = path
    if not found:
        raise ImportFailedError(
            f"{directory}: no numbered {'/'.join(suffixes)} files; {what} should be there"
        )
    first = min(found)
    missing = [i for i in range(first, first + len(found)) if i not in found]
    if missing or first not in (0, 1):
        gap = missing[0] if missing else 0
        raise ImportFailedError(
            f"{directory}: frame {gap} is missing ({len(found)} files from {first} to "
            f"{max(found)}); frames must be numbered without gaps"
        )
    return [found[i] for i in sorted(found)]


def synctalk2d(
    directory: Path,
    lipsync: Path,
    audio_encoder: Path,
    *,
    progress: Progress | None = None,
) -> AvatarSource:
    """A SyncTalk_2D dataset folder (``dataset/<name>``) and its exported models."""
    frames = numbered_files(directory / "full_body_img", (".jpg", ".jpeg", ".png"), "frames")
    landmarks_dir = directory / "landmarks"
    size = frame_size_of(frames[0])
    raw = []
    for i, frame in enumerate(frames):
        lms = landmarks_dir / f"{frame.stem}.lms"
        if not lms.is_file():
            raise ImportFailedError(
                f"{lms}: missing; SyncTalk_2D writes one landmark file per frame "
                "(its data_utils/process.py)"
            )
        raw.append(synctalk_rect(read_landmarks(lms)))
        if progress is not None and i % 100 == 0:
            progress(i + 1, len(frames))
    fitted = fit_rects(np.array(raw), size, source=str(landmarks_dir))
    return AvatarSource(
        kind="synctalk2d",
        frames=frames,
        rects=fitted.rects,
        frame_size=size,
        lipsync=lipsync,
        audio_encoder=audio_encoder,
        adapter=AdapterSpec(),
        notes=_fit_notes(fitted.max_shift_px, fitted.max_snap_px),
    )


def livetalking(
    directory: Path,
    kind: Literal["wav2lip", "ultralight"],
    lipsync: Path,
    audio_encoder: Path | None = None,
) -> AvatarSource:
    """A LiveTalking avatar folder (``data/avatars/<id>``) and its lip-sync model."""
    if kind == "ultralight":
        raise ImportFailedError(f"{directory}: {ULTRALIGHT_MISSING}")
    frames = numbered_files(directory / "full_imgs", (".png", ".jpg", ".jpeg"), "frames")
    coords_path = directory / "coords.pkl"
    if not coords_path.is_file():
        raise ImportFailedError(f"{coords_path}: missing; LiveTalking writes it with the frames")
    coords = load_numbers(coords_path)
    if len(coords) != len(frames) or any(len(c) != 4 for c in coords):
        raise ImportFailedError(
            f"{coords_path}: {len(coords)} entries for {len(frames)} frames; need one "
            "(y1, y2, x1, x2) box per frame"
        )
    boxes = np.array(coords, dtype=np.float64)
    rects = np.rint(boxes[:, [2, 0, 3, 1]]).astype(np.int64)  # y1,y2,x1,x2 -> x1,y1,x2,y2
    size = frame_size_of(frames[0])
    fitted = fit_rects(rects, size, source=str(coords_path))
    return AvatarSource(
        kind="livetalking-wav2lip",
        frames=frames,
        rects=fitted.rects,
        frame_size=size,
        lipsync=lipsync,
        audio_encoder=audio_encoder,
        adapter=WAV2LIP_SPEC,
        notes=[WATERMARK_NOTE, *_fit_notes(fitted.max_shift_px, fitted.max_snap_px)],
    )


def ultralight(directory: Path) -> AvatarSource:
    """Ultralight-Digital-Human avatars are refused until their audio features exist."""
    raise ImportFailedError(f"{directory}: {ULTRALIGHT_MISSING}")


def _fit_notes(shift: int, snap: int) -> list[str]:
    notes = []
    if shift:
        notes.append(f"rects past the frame edge were moved inside it by up to {shift} px")
    if snap:
        notes.append(f"rects were aligned to even pixels for 4:2:0 video (edges moved <= {snap})")
    return notes
