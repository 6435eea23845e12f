"""A caller in a process of its own, for tests that kill it mid-call.

    python -m tests.vanishing_caller http://127.0.0.1:PORT

Offers ICE on 127.0.0.1 only (this sandbox is loopback-only), calls the demo avatar,
writes ``streaming <session_id>`` to stdout once video frames arrive, then waits to be
killed. A SIGKILL leaves the server with a peer that stops answering without a goodbye.
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import ClientSession

from streaming.webrtc.compat import loopback_only_ice
from tests.webrtc_client import Caller


async def call_and_wait(base_url: str) -> None:
    async with ClientSession(base_url=base_url) as http:
        caller = Caller(http)
        caller.keep_luma = False
        await caller.connect()
        await caller.wait_for_frames(10)
        sys.stdout.write(f"streaming {caller.session_id}\n")
        sys.stdout.flush()
        await asyncio.Event().wait()  # until killed


def main() -> None:
    with loopback_only_ice():
        asyncio.run(call_and_wait(sys.argv[1]))


if __name__ == "__main__":
    main()
