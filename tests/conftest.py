"""Shared fixtures."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from streaming.webrtc.compat import loopback_only_ice
from tests.media import speech_with_pauses


def pytest_configure(config: pytest.Config) -> None:
    # Two suites at once (this checkout and a copy, or another engineer's) both prune old
    # /tmp/pytest-of-<user>/pytest-N directories as they end, and the one that loses the
    # race warns; ``filterwarnings = error`` made that a failed run after every test passed.
    config.addinivalue_line(
        "filterwarnings", r"ignore:\(rm_rf\) error removing:pytest.PytestWarning"
    )


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """Undo what a test's in-process CLI run did to the root logger.

    ``web.log_format.configure_logging`` adds a handler on the ``sys.stderr`` of the moment,
    which pytest closes after that test; every later log line then printed a
    "Logging error" traceback (slow, and noise in every later failure report).
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def speech_16k(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """About 4 s of espeak-ng speech at 16 kHz with 1 s pauses, and the spoken spans."""
    tmp: Path = tmp_path_factory.mktemp("speech")
    return speech_with_pauses(tmp)


@pytest.fixture
def loopback() -> Iterator[None]:
    """ICE on 127.0.0.1 only: aioice skips loopback candidates, and this sandbox has no other.

    And the test process's heap so far is frozen for the test, as ``lipstream serve``
    freezes its start-up heap (``web.serve.freeze_startup_heap``): the calls a live test
    serves in this process would otherwise wait for full collections of everything the
    earlier tests left (110-240 ms each, several during one test's set-up), which a
    serving process does not make. Unfrozen after the test, so nothing stays uncollected.
    """
    gc.collect()
    gc.freeze()
    try:
        with loopback_only_ice():
            yield
    finally:
        gc.unfreeze()
