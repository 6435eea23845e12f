"""The avatar manifest (``avatar.json``): what an avatar package holds and how its model is fed.

The adapter parameters are data, not code, so SyncTalk_2D ``unet_328`` (the default),
Ultralight-160 or Wav2Lip-96 style models are described without code changes::

    {"format": "lipstream-avatar", "version": 1, "name": "...", "fps": 25,
     "frame_size": [1280, 720],
     "frames": {"dir": "frames", "pattern": "{index:05d}.jpg", "count": 125},
     "rects": "rects.json",
     "models": {"lipsync": "lipsync.onnx", "audio_encoder": "audio_encoder.onnx"},
     "adapter": {... AdapterSpec fields, all optional ...},
     "clips": {"idle": [0, 60], "thinking": [120, 180], "speaking": [0, 100]}}

``clips`` (optional) names half-open ``[start, stop)`` ranges of frames: ``idle`` is what
a call plays while silent (absent: every frame), ``speaking`` the range speech plays over
(absent: every frame), any other name an idle clip an app may choose
(``docs/design/compositing.md`` §5, ``docs/design/avatars.md`` §10).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from inference_core.adapter.spec import AdapterSpec

MANIFEST_NAME = "avatar.json"
CLIP_NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


class FramesSpec(BaseModel):
    """Where the avatar's full video frames are: ``dir/pattern.format(index=i)`` for i < count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dir: str = "frames"
    pattern: str = "{index:05d}.jpg"
    count: int = Field(ge=1, le=100_000)

    @model_validator(mode="after")
    def _pattern_has_index(self) -> FramesSpec:
        try:
            first = self.pattern.format(index=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"pattern {self.pattern!r} must use only {{index}}: {exc}") from exc
        if first == self.pattern.format(index=1):
            raise ValueError(f"pattern {self.pattern!r} must contain {{index}}")
        if not first.lower().endswith((".jpg", ".jpeg", ".png")):
            raise ValueError(f"pattern {self.pattern!r} must name .jpg, .jpeg or .png files")
        return self


class ModelsSpec(BaseModel):
    """The package's ONNX files, relative to the package directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lipsync: str = "lipsync.onnx"
    audio_encoder: str | None = "audio_encoder.onnx"


class AvatarManifest(BaseModel):
    """Parsed ``avatar.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["lipstream-avatar"]
    version: Literal[1]
    name: str = ""
    description: str = ""
    fps: Annotated[int, Field(ge=1, le=60)] = 25
    frame_size: tuple[int, int]
    frames: FramesSpec
    rects: str = "rects.json"
    models: ModelsSpec = ModelsSpec()
    adapter: AdapterSpec = AdapterSpec()
    clips: dict[str, tuple[int, int]] = Field(default_factory=dict)

    @field_validator("frame_size")
    @classmethod
    def _even_size(cls, size: tuple[int, int]) -> tuple[int, int]:
        w, h = size
        if w <= 0 or h <= 0 or w % 2 or h % 2:
            raise ValueError(f"frame_size {[w, h]} must be positive even numbers (yuv420p)")
        return size

    @model_validator(mode="after")
    def _consistent(self) -> AvatarManifest:
        if self.adapter.audio_feature == "ave" and self.models.audio_encoder is None:
            raise ValueError("models.audio_encoder is required when adapter.audio_feature is 'ave'")
        problems = [p for name, span in self.clips.items() if (p := self._clip_problem(name, span))]
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _clip_problem(self, name: str, span: tuple[int, int]) -> str | None:
        count = self.frames.count
        start, stop = span
        shortest = 1 if count == 1 else 2
        if not CLIP_NAME_PATTERN.fullmatch(name):
            return (
                f"clips.{name}: the name must be 1-32 characters of a-z, 0-9, '_' and '-', "
                "starting with a letter or digit"
            )
        if not 0 <= start < stop <= count:
            return (
                f"clips.{name}: [{start}, {stop}] must be a [start, stop) range of frames "
                f"with 0 <= start < stop <= {count} (frames.count)"
            )
        if stop - start < shortest:
            return f"clips.{name}: [{start}, {stop}] holds 1 frame, a clip needs at least 2"
        return None


def format_validation_error(exc: ValidationError) -> list[str]:
    """One readable line per pydantic error: ``key.path: message (got VALUE)``."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(manifest)"
        said = err["msg"].removeprefix("Value error, ")
        if not err["loc"] and said.startswith("clips."):  # already named by key
            lines += said.split("\n")
            continue
        got = err.get("input")
        shown = json.dumps(got) if isinstance(got, str | int | float | bool | None) else None
        suffix = f" (got {shown})" if shown is not None and err["type"] != "missing" else ""
        lines.append(f"{key}: {err['msg']}{suffix}")
    return lines


def read_manifest(directory: Path) -> tuple[AvatarManifest | None, list[str]]:
    """Parse ``directory/avatar.json``; return the manifest or ``None`` and every problem found."""
    path = directory / MANIFEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, [f"{MANIFEST_NAME}: missing (expected at {path})"]
    except OSError as exc:
        return None, [f"{MANIFEST_NAME}: cannot be read: {exc.strerror or exc}"]
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, [f"{MANIFEST_NAME}: invalid JSON at line {exc.lineno}: {exc.msg}"]
    if not isinstance(raw, dict):
        return None, [f"{MANIFEST_NAME}: top level must be a JSON object"]
    try:
        return AvatarManifest.model_validate(raw), []
    except ValidationError as exc:
        return None, [f"{MANIFEST_NAME}: {line}" for line in format_validation_error(exc)]
