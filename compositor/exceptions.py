"""Errors raised by the compositor.

Hierarchy::

    CompositorError          root: a frame cannot be loaded or composed
    └── FrameLoadError       a background frame file is missing or unreadable
"""

from __future__ import annotations


class CompositorError(Exception):
    """Root of all compositor errors."""


class FrameLoadError(CompositorError):
    """A background frame could not be read from disk."""
