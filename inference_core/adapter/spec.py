"""What an avatar's lip-sync model expects: the adapter parameters, as data.

SyncTalk_2D ``unet_328`` (the default), Ultralight-160 or Wav2Lip-96 style models are
described by these fields, without code changes (``docs/design/model.md`` §3). The
manifest (:mod:`inference_core.avatars.manifest`) carries one under ``adapter``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AdapterSpec(BaseModel):
    """How crops and audio become model inputs and how outputs are pasted back.

    Defaults describe SyncTalk_2D ``unet_328``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "unet_328"
    # Model input side; the rect is resized to crop_size and the model sees the inner part.
    input_size: Annotated[int, Field(ge=16, le=1024)] = 320
    crop_size: Annotated[int, Field(ge=16, le=1024)] = 328
    crop_border: Annotated[int, Field(ge=0, le=64)] = 4
    # (x, y, w, h) in model-input pixels, zeroed in the masked copy (cv2.rectangle form).
    mask_rect: tuple[int, int, int, int] = (5, 5, 310, 305)
    color_order: Literal["bgr", "rgb"] = "bgr"
    channel_order: Literal["reference_first", "masked_first"] = "reference_first"
    pixel_scale: Literal["zero_one", "minus_one_one"] = "zero_one"
    output_scale: Literal["zero_one", "minus_one_one"] = "zero_one"
    audio_feature: Literal["ave", "mel"] = "ave"
    audio_shape: Annotated[tuple[int, ...], Field(min_length=1, max_length=4)] = (32, 16, 16)
    audio_window: Annotated[int, Field(ge=1, le=64)] = 16
    paste_mode: Literal["feather", "hard"] = "feather"
    feather_px: Annotated[int, Field(ge=0, le=64)] = 6

    @model_validator(mode="after")
    def _geometry_fits(self) -> AdapterSpec:
        if self.crop_size != self.input_size + 2 * self.crop_border:
            raise ValueError(
                f"crop_size ({self.crop_size}) must equal input_size ({self.input_size}) "
                f"+ 2 * crop_border ({self.crop_border})"
            )
        x, y, w, h = self.mask_rect
        if x < 0 or y < 0 or w <= 0 or h <= 0 or x + w > self.input_size or y + h > self.input_size:
            raise ValueError(
                f"mask_rect {list(self.mask_rect)} must be (x, y, w, h) with positive size "
                f"inside the {self.input_size}x{self.input_size} model input"
            )
        if any(d <= 0 for d in self.audio_shape):
            raise ValueError(f"audio_shape {list(self.audio_shape)} must have positive sizes")
        return self

    @property
    def visual_shape(self) -> tuple[int, int, int]:
        """Per-frame visual input shape (channels, height, width)."""
        return (6, self.input_size, self.input_size)

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """Per-frame model output shape (channels, height, width)."""
        return (3, self.input_size, self.input_size)
