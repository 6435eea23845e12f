"""Writing an imported avatar package: all or nothing.

Everything is written to a hidden directory beside the final one, validated there (the
same check as ``lipstream avatar validate``), then renamed into place; any failure
removes it, so the avatar root never holds half an import. Frames are copied, or hard
linked when asked (same file system; a copy otherwise), never re-encoded.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from inference_core.adapter.onnx_io import bind_inputs
from inference_core.adapter.spec import AdapterSpec
from inference_core.avatars.manifest import MANIFEST_NAME
from inference_core.avatars.package import check_avatar_id
from inference_core.avatars.validation import read_onnx_io, validate_package
from inference_core.exceptions import ModelLoadError
from inference_core.importers.errors import ImportFailedError

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class AvatarSource:
    """What an importer found: frames in order, one rect per frame, models, adapter."""

    kind: str  # "synctalk2d", "livetalking-wav2lip", ...
    frames: Sequence[Path]
    rects: np.ndarray  # int [N, 4], already inside the frame and even
    frame_size: tuple[int, int]
    lipsync: Path
    audio_encoder: Path | None
    adapter: AdapterSpec
    fps: int = 25
    notes: list[str] = field(default_factory=list)  # what the user should know
    clips: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # avatar.json "clips"


@dataclass(frozen=True)
class ImportReport:
    """What an import wrote."""

    avatar_id: str
    path: Path
    frames: int
    frame_size: tuple[int, int]
    model_io: str  # the lip-sync model's inputs and outputs as bound
    dynamic_batch: bool
    notes: list[str]


def frame_size_of(path: Path) -> tuple[int, int]:
    """``(width, height)`` of an image file, or an error naming it."""
    try:
        with Image.open(path) as image:
            return int(image.size[0]), int(image.size[1])
    except (OSError, UnidentifiedImageError) as exc:
        raise ImportFailedError(f"{path}: not a readable image: {exc}") from exc


def write_package(
    source: AvatarSource,
    avatars_root: Path,
    avatar_id: str,
    *,
    link: bool = False,
    replace: bool = False,
    progress: Progress | None = None,
) -> ImportReport:
    """Write ``source`` as the package ``avatars_root/avatar_id``; see the module docstring."""
    avatar_id = check_avatar_id(avatar_id)
    final = avatars_root / avatar_id
    if final.exists() and not replace:
        raise ImportFailedError(
            f"avatar {avatar_id!r} already exists at {final}; pass --replace to overwrite it "
            "or --id to import under another id"
        )
    model_io, dynamic = _check_model(source)
    suffixes = {p.suffix.lower() for p in source.frames}
    if len(suffixes) != 1 or not suffixes <= {".jpg", ".jpeg", ".png"}:
        raise ImportFailedError(
            f"frames must all be .jpg or all be .png, found {', '.join(sorted(suffixes))}"
        )
    avatars_root.mkdir(parents=True, exist_ok=True)
    staging = avatars_root / f".import-{avatar_id}-{secrets.token_hex(4)}"
    try:
        _write(staging, source, suffixes.pop(), link=link, progress=progress)
        problems = validate_package(staging)
        if problems:
            listed = "\n".join(f"  - {p}" for p in problems)
            raise ImportFailedError(
                f"the imported avatar does not validate ({len(problems)} problem(s)):\n{listed}"
            )
        _move_into_place(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    notes = list(source.notes)
    if not dynamic:
        notes.append(
            "the lip-sync model has a fixed batch of 1: it works, but frames of different "
            "sessions cannot share a run; export it with a dynamic batch axis "
            "(docs/guides/avatars.md) for cross-session batching"
        )
    report = ImportReport(
        avatar_id, final, len(source.frames), source.frame_size, model_io, dynamic, notes
    )
    logger.info(
        "imported avatar %s from %s: frames=%d size=%dx%d",
        avatar_id,
        source.kind,
        report.frames,
        *report.frame_size,
    )
    return report


def _check_model(source: AvatarSource) -> tuple[str, bool]:
    """The lip-sync model's I/O as bound to the adapter, refused early when it does not fit."""
    try:
        inputs, outputs = read_onnx_io(source.lipsync, source.lipsync.parent)
        binding = bind_inputs(inputs, outputs, source.adapter)
    except ModelLoadError as exc:
        raise ImportFailedError(
            f"{source.lipsync}: {exc} (adapter {source.adapter.name}); pass the model "
            "exported for this avatar"
        ) from exc
    shown = ", ".join(f"{n}{list(d)}" for n, d in inputs) + " -> " + binding.output_name
    return shown, binding.dynamic_batch


def _write(
    staging: Path, source: AvatarSource, suffix: str, *, link: bool, progress: Progress | None
) -> None:
    frames_dir = staging / "frames"
    frames_dir.mkdir(parents=True)
    total = len(source.frames)
    for i, frame in enumerate(source.frames):
        _place(frame, frames_dir / f"{i:05d}{suffix}", link=link)
        if progress is not None and (i % 25 == 0 or i == total - 1):
            progress(i + 1, total)
    _place(source.lipsync, staging / "lipsync.onnx", link=link)
    models: dict[str, str | None] = {"lipsync": "lipsync.onnx", "audio_encoder": None}
    if source.audio_encoder is not None:
        _place(source.audio_encoder, staging / "audio_encoder.onnx", link=link)
        models["audio_encoder"] = "audio_encoder.onnx"
    (staging / "rects.json").write_text(json.dumps(source.rects.tolist()))
    manifest = {
        "format": "lipstream-avatar",
        "version": 1,
        "name": staging.name,
        "description": f"imported from {source.kind}",
        "fps": source.fps,
        "frame_size": list(source.frame_size),
        "frames": {"dir": "frames", "pattern": "{index:05d}" + suffix, "count": total},
        "rects": "rects.json",
        "models": models,
        "adapter": source.adapter.model_dump(mode="json"),
    }
    if source.clips:
        manifest["clips"] = {name: list(span) for name, span in source.clips.items()}
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))


def _place(source: Path, target: Path, *, link: bool) -> None:
    try:
        if link:
            try:
                os.link(source, target)
                return
            except OSError:  # another file system, or links not allowed: copy instead
                pass
        shutil.copyfile(source, target)
    except OSError as exc:
        raise ImportFailedError(f"{source}: cannot be copied: {exc.strerror or exc}") from exc


def _move_into_place(staging: Path, final: Path) -> None:
    name = final.name
    manifest = staging / MANIFEST_NAME
    data = json.loads(manifest.read_text())
    data["name"] = name
    manifest.write_text(json.dumps(data, indent=2))
    if not final.exists():
        staging.rename(final)
        return
    retired = final.with_name(f".replaced-{name}-{secrets.token_hex(4)}")
    final.rename(retired)
    staging.rename(final)
    shutil.rmtree(retired, ignore_errors=True)
