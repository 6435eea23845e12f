"""One avatar's per-frame work around the model: prepare the input, compose the output.

The same steps serve the offline render and live sessions; only where the model runs
differs (directly here, through the inference core's batcher in a live session)::

    FrameStep ──prepare──▶ PreparedFrame (rect, crop, the model's uint8 region of it)
                                 │ model: region + audio window ──▶ uint8 face
                                 ▼
                          compose ──▶ yuv420p output frame
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compositor.background_cache import AvatarFrames
from compositor.paste import Paster, compose_crop
from compositor.sequencer import FrameStep
from compositor.yuv import Frame, Rect
from inference_core.adapter.lipsync import FaceInputBuilder
from inference_core.avatars.package import AvatarPackage


@dataclass(frozen=True)
class PreparedFrame:
    """A frame ready for the model (``visual`` is ``None`` when no inference is needed)."""

    step: FrameStep
    rect: Rect
    crop: np.ndarray | None  # crop-size BGR reference (also the paste-back canvas)
    visual: np.ndarray | None  # uint8 [S, S, 3]: the crop's model region (a view of crop)


class FramePipeline:
    """Prepares model inputs from, and pastes model outputs into, one avatar's frames."""

    def __init__(self, package: AvatarPackage, frames: AvatarFrames) -> None:
        spec = package.manifest.adapter
        self.package = package
        self.frames = frames
        self.builder = FaceInputBuilder(spec)
        self.paster = Paster(spec.feather_px if spec.paste_mode == "feather" else 0)
        self._border = spec.crop_border

    def prepare(self, step: FrameStep) -> PreparedFrame:
        """Crop the avatar frame for ``step``; pick the model's region if it needs inference.

        The region is a view: the serving graph builds the six-channel input on the device.
        """
        x1, y1, x2, y2 = (int(v) for v in self.package.rects[step.avatar_index])
        rect = (x1, y1, x2, y2)
        if not step.infer:
            return PreparedFrame(step, rect, None, None)
        region = self.frames.crop_bgr(step.avatar_index, rect)
        crop = self.builder.crop_for_model(region)
        return PreparedFrame(step, rect, crop, self.builder.model_region(crop))

    def compose(self, prepared: PreparedFrame, face: np.ndarray | None) -> Frame:
        """Return the output frame: the raw background, or it with ``face`` blended in.

        The raw background is returned as the cached read-only array (no copy); a frame
        with a face is a fresh array.
        """
        background = self.frames.get(prepared.step.avatar_index)
        if face is None or prepared.crop is None or not prepared.step.infer:
            return background
        canvas = compose_crop(prepared.crop, face, self._border)
        out = background.copy()
        self.paster.paste(out, prepared.rect, canvas, prepared.step.alpha)
        return out
