"""The error every import raises: a message naming the file and what to do."""

from __future__ import annotations

from inference_core.exceptions import InferenceError


class ImportFailedError(InferenceError):
    """An avatar could not be imported; nothing was left in the avatar root."""
