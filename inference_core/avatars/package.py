"""An avatar package on disk: its manifest, crop rects and frame files, read and checked.

A package is a directory::

    avatar.json          manifest (inference_core.avatars.manifest)
    frames/00000.jpg …   the avatar's full video frames (JPEG or PNG)
    rects.json           one crop rect [x1, y1, x2, y2] per frame
                         (avatar.json may name clips: ranges of these frames)
    lipsync.onnx         the lip-sync model
    audio_encoder.onnx   the audio encoder (for "ave" features)

Ids are ``[a-z0-9_-]{1,64}`` (:func:`check_avatar_id`); :mod:`inference_core.avatars.locator`
finds a package by id. Loading lists every problem at once (:class:`AvatarInvalidError`).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inference_core.avatars.exceptions import (
    AvatarInvalidError,
    InvalidAvatarIdError,
)
from inference_core.avatars.manifest import MANIFEST_NAME, AvatarManifest, read_manifest

logger = logging.getLogger(__name__)

AVATAR_ID_PATTERN = re.compile(r"[a-z0-9_-]{1,64}")


def check_avatar_id(avatar_id: str) -> str:
    """Return ``avatar_id`` if it is well formed, else raise :class:`InvalidAvatarIdError`."""
    if not isinstance(avatar_id, str) or not AVATAR_ID_PATTERN.fullmatch(avatar_id):
        shown = repr(avatar_id)[:80]
        raise InvalidAvatarIdError(
            f"invalid avatar id {shown}: use 1-64 characters from a-z, 0-9, '_' and '-'"
        )
    return avatar_id


def is_inside(path: Path, root: Path) -> bool:
    """True when ``path``, with symlinks resolved, lies inside ``root`` (also resolved)."""
    try:
        return path.resolve(strict=False).is_relative_to(root.resolve(strict=False))
    except (OSError, RuntimeError):  # symlink loops
        return False


def package_fingerprint(directory: Path) -> str | None:
    """What tells one written package from any other: its manifest file's inode, size and
    modification time. Two processes that read the same directory (one machine's, or a
    shared file system's) read the same; a package written elsewhere, even from the same
    source, does not. None when there is no package there."""
    try:
        stat = (directory / MANIFEST_NAME).stat()
    except OSError:
        return None
    return f"{stat.st_ino}-{stat.st_size}-{stat.st_mtime_ns}"


@dataclass(frozen=True)
class AvatarPackage:
    """A loaded (parsed, not yet opened) avatar package."""

    avatar_id: str
    directory: Path
    manifest: AvatarManifest
    rects: np.ndarray  # int32 [N, 4]: x1, y1, x2, y2 (exclusive), even-aligned
    frame_paths: tuple[Path, ...]

    @property
    def lipsync_path(self) -> Path:
        return self.directory / self.manifest.models.lipsync

    @property
    def encoder_path(self) -> Path | None:
        name = self.manifest.models.audio_encoder
        return None if name is None else self.directory / name

    @property
    def frame_count(self) -> int:
        return len(self.frame_paths)

    @property
    def clips(self) -> dict[str, tuple[int, int]]:
        """The avatar's clips, name → half-open ``(start, stop)`` frame range, ``idle``
        always among them (every frame when the manifest declares none); ``speaking`` only
        when declared. ``compositor.clips.ClipPlan(frame_count, package.clips)`` plays them."""
        return {"idle": (0, self.frame_count), **self.manifest.clips}

    @classmethod
    def load(cls, directory: Path, avatar_id: str | None = None) -> AvatarPackage:
        """Parse the manifest and rects and list the frames.

        Cheap checks only (no image decoding, no ONNX parsing); :func:`validate_package`
        does the full check. Raises :class:`AvatarInvalidError` listing every problem.
        """
        avatar_id = avatar_id or directory.name
        manifest, problems = read_manifest(directory)
        if manifest is None:
            raise AvatarInvalidError(_summary(avatar_id, directory, problems), problems)
        frame_paths = tuple(
            directory / manifest.frames.dir / manifest.frames.pattern.format(index=i)
            for i in range(manifest.frames.count)
        )
        problems += _path_problems(directory, manifest, frame_paths)
        rects, rect_problems = _read_rects(directory, manifest)
        problems += rect_problems
        if problems:
            raise AvatarInvalidError(_summary(avatar_id, directory, problems), problems)
        return cls(avatar_id, directory, manifest, rects, frame_paths)


def _summary(avatar_id: str, directory: Path, problems: list[str]) -> str:
    listed = "\n".join(f"  - {p}" for p in problems)
    return f"avatar {avatar_id!r} at {directory} has {len(problems)} problem(s):\n{listed}"


def _path_problems(
    directory: Path, manifest: AvatarManifest, frame_paths: tuple[Path, ...]
) -> list[str]:
    problems = []
    named = {"frames.dir": directory / manifest.frames.dir, "rects": directory / manifest.rects}
    named["models.lipsync"] = directory / manifest.models.lipsync
    if manifest.models.audio_encoder is not None:
        named["models.audio_encoder"] = directory / manifest.models.audio_encoder
    for key, path in named.items():
        if not is_inside(path, directory):
            problems.append(f"{key}: {path} points outside the package")
        elif key.startswith("models.") and not path.is_file():
            problems.append(f"{key}: file {path.name} is missing")
    missing = [p for p in frame_paths if not p.is_file()]
    if missing:
        shown = ", ".join(p.name for p in missing[:5]) + (" …" if len(missing) > 5 else "")
        problems.append(
            f"frames: {len(missing)} of {len(frame_paths)} frame files missing ({shown})"
        )
    escaping = [p for p in frame_paths[:1] if not is_inside(p, directory)]
    if escaping:
        problems.append(f"frames: {escaping[0]} points outside the package")
    return problems


def _read_rects(directory: Path, manifest: AvatarManifest) -> tuple[np.ndarray, list[str]]:
    """Read rects.json; snap rects to even coordinates (yuv420p chroma) inside the frame."""
    empty = np.zeros((0, 4), dtype=np.int32)
    path = directory / manifest.rects
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return empty, [f"rects: file {manifest.rects} is missing"]
    except (OSError, UnicodeDecodeError) as exc:
        return empty, [f"rects: {manifest.rects} cannot be read: {exc}"]
    except json.JSONDecodeError as exc:
        return empty, [f"rects: {manifest.rects} is not valid JSON (line {exc.lineno}: {exc.msg})"]
    if not isinstance(raw, list) or not all(
        isinstance(r, list) and len(r) == 4 and all(isinstance(v, int | float) for v in r)
        for r in raw
    ):
        return empty, [f"rects: {manifest.rects} must be a list of [x1, y1, x2, y2] numbers"]
    count = manifest.frames.count
    problems = []
    if len(raw) != count:
        problems.append(f"rects: {len(raw)} rects for {count} frames (need one per frame)")
    rects = np.asarray(raw, dtype=np.float64).reshape(-1, 4).round().astype(np.int64)
    w, h = manifest.frame_size
    bad = [
        i
        for i, (x1, y1, x2, y2) in enumerate(rects)
        if x1 < 0 or y1 < 0 or x2 > w or y2 > h or x2 - x1 < 8 or y2 - y1 < 8
    ]
    if bad:
        x1, y1, x2, y2 = (int(v) for v in rects[bad[0]])
        problems.append(
            f"rects: {len(bad)} rect(s) out of bounds or smaller than 8 px, first at frame "
            f"{bad[0]}: [{x1}, {y1}, {x2}, {y2}] in a {w}x{h} frame"
        )
    even = rects.copy()
    even[:, :2] -= even[:, :2] % 2
    even[:, 2:] += even[:, 2:] % 2
    even[:, 2] = np.minimum(even[:, 2], w)
    even[:, 3] = np.minimum(even[:, 3], h)
    return even.astype(np.int32), problems
