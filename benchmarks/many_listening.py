"""Server CPU per frame of K listening calls on one avatar, together.

    .venv/bin/python -m benchmarks.many_listening [--calls 4] [--seconds 10] [--caller browser]

A real server in this process, on the event loop ``lipstream serve`` uses
(:func:`~benchmarks.live_server.run_as_served`), the demo avatar at 1280×720, and K calls
from the load client in another process, each with a silent microphone. Once every call
sends and the avatar's shared idle loops are built, it reads the process's CPU over a
window and prints it per video frame sent, with the calls' mean frame rate. Where
``listening_profile`` looks inside one call, this shows what calls share: with several
calls, a wake-up of the loop can serve more than one (``docs/changelog.md``, issue 36). On a
noisy 2-core VM compare runs of two trees alternating, not figures an hour apart. Not a
test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path

from benchmarks.chromium import caller_pages
from benchmarks.common import Result
from benchmarks.listening_profile import (
    BROWSER_CALL,
    WARM_UP_S,
    background_settled,
    write_silence,
)
from benchmarks.live_server import (
    cpu_seconds,
    live_server,
    run_as_served,
    start_load,
    wait_for_calls,
)
from inference_core.assets.demo_avatar import write_demo_avatar


async def _measure(root: Path, calls: int, seconds: float, caller: str) -> Result:
    audio = root / "caller.wav"
    write_silence(audio, seconds + 120)
    async with contextlib.AsyncExitStack() as stack:
        app, url = await stack.enter_async_context(live_server(root))
        if caller == "browser":
            pages = await stack.enter_async_context(caller_pages(audio, calls))
            for page in pages:
                await page.goto(url + "/")
                await page.evaluate(BROWSER_CALL)
        else:
            client = await start_load(
                url, calls=calls, seconds=seconds + 100, speech=audio, microphone=True
            )
            stack.push_async_callback(client.wait)
            stack.callback(client.kill)
        sessions = await wait_for_calls(app, calls, lambda s: s.frames_sent > 0)
        await asyncio.sleep(WARM_UP_S)
        await background_settled(timeout_s=60)
        sent0, cpu0, t0 = sum(s.frames_sent for s in sessions), cpu_seconds(), time.monotonic()
        await asyncio.sleep(seconds)  # the window measured
        sent = sum(s.frames_sent for s in sessions) - sent0
        cpu, window = cpu_seconds() - cpu0, time.monotonic() - t0
    return {
        "calls": calls,
        "caller": caller,
        "ms_per_frame": cpu * 1000 / sent,
        "fps": sent / window / calls,
    }


def run(calls: int = 4, seconds: float = 10.0, caller: str = "mic") -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_demo_avatar(root / "avatars" / "demo", size=(1280, 720))
        return run_as_served(_measure(root, calls, seconds, caller))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--caller", choices=["mic", "browser"], default="mic")
    args = parser.parse_args()
    print(json.dumps(run(args.calls, args.seconds, args.caller)))


if __name__ == "__main__":
    main()
