"""The avatars lipstream brings itself, and the locator that offers them beside the root.

One today: ``demo``, drawn procedurally with stand-in models on first use into the data
directory (:mod:`inference_core.assets.demo_avatar`), so a fresh install has something
to serve without any download.
"""

from __future__ import annotations

import functools

from config.settings import AvatarsSettings
from inference_core.assets.demo_avatar import ensure_demo_avatar
from inference_core.avatars.locator import AvatarLocator, BuiltinAvatar

DEMO_AVATAR_ID = "demo"
DEMO_AVATAR_NAME = "Demo avatar (procedural stand-in)"


def avatar_locator(settings: AvatarsSettings) -> AvatarLocator:
    """The avatar root of ``settings``, plus the demo avatar when ``avatars.demo`` is on."""
    builtin = {}
    if settings.demo:
        build = functools.partial(ensure_demo_avatar, settings.data_dir)
        builtin[DEMO_AVATAR_ID] = BuiltinAvatar(DEMO_AVATAR_NAME, build)
    return AvatarLocator(settings.root, builtin=builtin)
