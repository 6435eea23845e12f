"""Errors about avatar packages: ids, locations and contents.

Hierarchy::

    AvatarError                root: an avatar package cannot be used
    ├── InvalidAvatarIdError   the id is not [a-z0-9_-]{1,64} or escapes the avatar root
    ├── AvatarNotFoundError    no avatar with that id under the avatar root
    └── AvatarInvalidError     the package exists but is malformed (lists every problem)
"""

from __future__ import annotations


class AvatarError(Exception):
    """Root of all avatar-package errors."""


class InvalidAvatarIdError(AvatarError):
    """An avatar id is malformed or would resolve outside the avatar root."""


class AvatarNotFoundError(AvatarError):
    """No avatar with the requested id exists under the avatar root."""


class AvatarInvalidError(AvatarError):
    """An avatar package exists but has problems; ``problems`` lists each one."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems: list[str] = list(problems or [])
