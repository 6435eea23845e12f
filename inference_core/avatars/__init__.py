"""Avatar packages: the on-disk format (manifest, frames, crop rects, models), finding one
by id, and checking one (``docs/design/avatars.md`` §10).

Imports :mod:`inference_core.adapter` (the manifest's adapter spec, model I/O checks);
never the serving core or the asset generators (built-in avatars are handed to the
:class:`AvatarLocator` by whoever builds it).
"""

from __future__ import annotations

from inference_core.avatars.exceptions import (
    AvatarError,
    AvatarInvalidError,
    AvatarNotFoundError,
    InvalidAvatarIdError,
)
from inference_core.avatars.locator import AvatarLocator, BuiltinAvatar
from inference_core.avatars.manifest import MANIFEST_NAME, AvatarManifest, read_manifest
from inference_core.avatars.package import AVATAR_ID_PATTERN, AvatarPackage, check_avatar_id
from inference_core.avatars.validation import validate_package

__all__ = [
    "AVATAR_ID_PATTERN",
    "MANIFEST_NAME",
    "AvatarError",
    "AvatarInvalidError",
    "AvatarLocator",
    "AvatarManifest",
    "AvatarNotFoundError",
    "AvatarPackage",
    "BuiltinAvatar",
    "InvalidAvatarIdError",
    "check_avatar_id",
    "read_manifest",
    "validate_package",
]
