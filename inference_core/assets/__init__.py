"""Assets lipstream generates itself, so nothing is downloaded: the procedural demo avatar
with its stand-in models, and the UNet benchmark model with ``unet_328``'s I/O
(``docs/design/avatars.md`` §11).

Writes avatar packages and ONNX files; the serving core never imports it. The entry
points hand :func:`avatar_locator` (the avatar root plus the built-in demo) to the core.
"""

from __future__ import annotations

from inference_core.assets.benchmark_model import build_benchmark_unet, estimate_macs
from inference_core.assets.builtin import DEMO_AVATAR_ID, avatar_locator
from inference_core.assets.demo_avatar import ensure_demo_avatar, write_demo_avatar
from inference_core.assets.demo_models import build_audio_encoder, build_lipsync_model

__all__ = [
    "DEMO_AVATAR_ID",
    "avatar_locator",
    "build_audio_encoder",
    "build_benchmark_unet",
    "build_lipsync_model",
    "ensure_demo_avatar",
    "estimate_macs",
    "write_demo_avatar",
]
