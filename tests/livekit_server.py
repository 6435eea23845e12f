"""A real ``livekit-server`` for a test (``benchmarks/livekit_room.py`` starts it: dev
mode, loopback, free ports, the test key). Without the binary, or when it does not come
up, the test fails saying why and how to build it: LiveKit tests never skip.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import livekit_room
from benchmarks.livekit_room import API_KEY, API_SECRET, LiveKit, LiveKitServerError

__all__ = ["API_KEY", "API_SECRET", "LiveKit", "run_livekit"]


@contextlib.contextmanager
def run_livekit(directory: Path) -> Iterator[LiveKit]:
    """livekit-server for the test; stopped on exit."""
    with contextlib.ExitStack() as stack:
        try:
            livekit = stack.enter_context(livekit_room.run_livekit(directory))
        except LiveKitServerError as error:
            pytest.fail(str(error))
        yield livekit
