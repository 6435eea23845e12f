"""Finding avatar packages by id: under the avatar root, or built in (the demo avatar).

Ids are ``[a-z0-9_-]{1,64}`` and resolve only inside the avatar root: no ``..``, no
absolute paths, no symlink that leads out (``docs/design/avatars.md`` §10). A *built-in*
avatar is one the server can generate itself on first use (the procedural demo, made by
:mod:`inference_core.assets`); a package of the same id under the root takes precedence.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from inference_core.avatars.exceptions import (
    AvatarError,
    AvatarNotFoundError,
    InvalidAvatarIdError,
)
from inference_core.avatars.manifest import MANIFEST_NAME
from inference_core.avatars.package import (
    AVATAR_ID_PATTERN,
    AvatarPackage,
    check_avatar_id,
    is_inside,
)


@dataclass(frozen=True)
class BuiltinAvatar:
    """An avatar generated on first use: ``build()`` makes it if needed, returns its directory."""

    name: str
    build: Callable[[], Path]


class AvatarLocator:
    """Resolves avatar ids to package directories under ``root``, else among ``builtin``."""

    def __init__(self, root: Path, *, builtin: Mapping[str, BuiltinAvatar] | None = None) -> None:
        self.root = root
        self.builtin = dict(builtin or {})

    def locate(self, avatar_id: str) -> Path:
        """Return the package directory for ``avatar_id`` (building a built-in one if needed).

        Raises :class:`InvalidAvatarIdError` for malformed or escaping ids and
        :class:`AvatarNotFoundError` when no package exists.
        """
        check_avatar_id(avatar_id)
        candidate = self.root / avatar_id
        if candidate.is_symlink() or candidate.exists():
            if not is_inside(candidate, self.root):
                raise InvalidAvatarIdError(
                    f"avatar {avatar_id!r} resolves outside the avatar root {self.root}"
                )
            if (candidate / MANIFEST_NAME).is_file():
                return candidate
        builtin = self.builtin.get(avatar_id)
        if builtin is not None:
            return builtin.build()
        known = self.list_ids()
        raise AvatarNotFoundError(
            f"no avatar {avatar_id!r}: expected {self.root / avatar_id / MANIFEST_NAME}"
            + (f" (available: {', '.join(known[:20])})" if known else "")
        )

    def load(self, avatar_id: str) -> AvatarPackage:
        """Locate and load ``avatar_id``."""
        return AvatarPackage.load(self.locate(avatar_id), avatar_id)

    def display_name(self, avatar_id: str) -> str:
        """The manifest's ``name`` (the id when the package has none or cannot be read).

        Reads only the manifest's JSON, and never builds a built-in avatar.
        """
        builtin = self.builtin.get(avatar_id)
        if builtin is not None and not (self.root / avatar_id).exists():
            return builtin.name
        try:
            raw = json.loads((self.locate(avatar_id) / MANIFEST_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError, AvatarError):
            return avatar_id
        name = raw.get("name") if isinstance(raw, dict) else None
        return name if isinstance(name, str) and name else avatar_id

    def clip_names(self, avatar_id: str) -> list[str]:
        """The idle clips the manifest names, ``idle`` always among them (sorted); just
        ``idle`` when the package has none or cannot be read. Reads only the manifest."""
        builtin = self.builtin.get(avatar_id)
        if builtin is not None and not (self.root / avatar_id).exists():
            return ["idle"]
        try:
            raw = json.loads((self.locate(avatar_id) / MANIFEST_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError, AvatarError):
            return ["idle"]
        clips = raw.get("clips") if isinstance(raw, dict) else None
        names = [name for name in clips if isinstance(name, str)] if isinstance(clips, dict) else []
        return sorted({"idle", *names})

    def list_ids(self) -> list[str]:
        """Ids of every package under the root (manifest present), plus the built-in ones."""
        ids = set(self.builtin)
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if (
                    AVATAR_ID_PATTERN.fullmatch(entry.name)
                    and (entry / MANIFEST_NAME).is_file()
                    and is_inside(entry, self.root)
                ):
                    ids.add(entry.name)
        return sorted(ids)
