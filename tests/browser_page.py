"""A fresh headless Chromium page for the browser tests.

:func:`browser_page` fails the test naming the install command when Playwright or
Debian's Chromium is missing (a broken setup, never a skip), opens the page with a
silent fake microphone, and fails the test on any uncaught error in the page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from benchmarks.chromium import CHROMIUM, caller_page
from tests.live_calls import TIMEOUT_S
from tests.media import write_wav

if TYPE_CHECKING:
    from playwright.async_api import Error, Page

try:
    import playwright.async_api  # noqa: F401 - only whether it is installed
except ImportError as exc:
    PLAYWRIGHT_MISSING: ImportError | None = exc
else:
    PLAYWRIGHT_MISSING = None

TIMEOUT_MS = round(TIMEOUT_S * 1000)


def require_chromium() -> Path:
    """Debian's Chromium, once it and the playwright package are both there."""
    if PLAYWRIGHT_MISSING is not None:
        pytest.fail(
            f"playwright is not installed ({PLAYWRIGHT_MISSING}): "
            "run `bash scripts/test.sh` (installs .[test])"
        )
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `apt-get install -y chromium` (.ci/run does)")
    return CHROMIUM


@asynccontextmanager
async def browser_page(tmp_path: Path, url: str) -> AsyncIterator[Page]:
    """``url`` in a fresh headless Chromium (profile under ``tmp_path``)."""
    require_chromium()
    silence = write_wav(tmp_path / "silence.wav", np.zeros(48_000, np.float32), 48_000)
    page_errors: list[Error] = []
    async with caller_page(tmp_path / "chromium-profile", silence) as page:
        page.set_default_timeout(TIMEOUT_MS)
        page.on("pageerror", lambda error: page_errors.append(error))
        await page.goto(url)
        yield page
    assert not page_errors, f"uncaught errors in the page: {page_errors}"
