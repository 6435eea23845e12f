"""How lipstream runs a real browser as a caller: Debian's Chromium, headless.

Used by ``benchmarks/browser_delay.py`` and ``tests/test_demo_page.py`` (through Playwright,
never a downloaded browser). The flags (``docs/design/webrtc.md`` §6): fake devices
without a permission prompt, autoplay with sound, and WebRTC over loopback.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from playwright.async_api import Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--headless",
    "--disable-gpu",
    "--no-sandbox",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@asynccontextmanager
async def caller_page(
    profile: Path, fake_mic: Path, extra_args: Sequence[str] = ()
) -> AsyncIterator[Page]:
    """A page in a fresh Chromium profile whose microphone plays ``fake_mic`` (a WAV,
    looped), Chromium started with ``extra_args`` too (e.g. a host mapping). Needs the
    ``playwright`` package (the test extra)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={fake_mic}", *extra_args],
        )
        try:
            yield context.pages[0] if context.pages else await context.new_page()
        finally:
            await context.close()


@asynccontextmanager
async def caller_pages(fake_mic: Path, count: int) -> AsyncIterator[list[Page]]:
    """``count`` pages of one Chromium whose microphone plays ``fake_mic`` (looped).

    Each page is in its own browser context, so each is a separate tab with its own
    renderer, ``getUserMedia`` capture and ``AudioContext``: several callers on one
    machine without paying for several browsers. The microphone file is a browser-wide
    flag, so every page hears the same file, each from when its own capture opened.
    """
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={fake_mic}"],
        )
        try:
            yield [await (await browser.new_context()).new_page() for _ in range(count)]
        finally:
            await browser.close()
