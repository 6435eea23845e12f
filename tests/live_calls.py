"""What live-call tests wait for and what they count, so they hold on a loaded machine.

These tests run real calls on a 2-core machine that may run another test suite or a
benchmark at the same time (docs/operations/testing.md). So they never sleep a fixed time and
then assert a rate: they wait for a condition with a generous timeout (:func:`until`) and
assert counts, states and ratios, e.g. the frames that carried lip-sync against the
frames the caller spoke (:func:`speech_frames`, :func:`frames_due`).

A live frame is lip-synced only if it is ready by its send slot, ``session.delay_s`` after
its audio: the model's lookahead, one audio tick and ``session.pipeline_margin_ms`` (40 ms
by default) for inference and compositing. The live tests run at that default, as a user
does, and ask what a user would see (:func:`assert_lip_synced`): the speech gate followed
the caller's speech, at least :data:`LIP_SYNCED_SHARE` of the frames it sent to be
lip-synced went out with their face (counted by the session itself, ``GET
/sessions/{id}``), and every frame that did not was dropped for lateness, never for a
fault. A test whose subject needs more time than the default gives (several calls at once
on two cores, a relay in another process, a page driven by a browser doing the same
work) sets :data:`SLACK_MARGIN_MS` and says why where it does.

``LIP_SYNC_REPORT=FILE`` (not ``LIPSTREAM_*``: those are settings overrides) makes
:func:`assert_lip_synced` append each call's frames due and lip-synced to ``FILE`` (a
JSON line per call, with the test's name), so a run of the suite reports them per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer

from config.settings import Settings
from web.app import build_app

T = TypeVar("T")

#: How long a test waits for something a live call should do in well under a second.
#: Generous: another suite may be running on the same two cores.
TIMEOUT_S = 60.0
#: The share of the frames due to be lip-synced that must go out with their face.
LIP_SYNCED_SHARE = 0.95
#: ``session.pipeline_margin_ms`` for a test whose subject needs slack (module doc).
SLACK_MARGIN_MS = 1000.0
FPS = 25
#: Why a frame may miss lip-sync on a machine too busy for real time: the call drops it
#: rather than fall behind (``streaming/live/renderer.py``). Any other reason is a fault.
LATENESS = frozenset({"late", "not_ready", "overload", "DeadlineExceededError", "QueueFullError"})


async def until(
    condition: Callable[[], T | Awaitable[T]],
    what: str,
    *,
    timeout_s: float = TIMEOUT_S,
    poll_s: float = 0.05,
) -> T:
    """Poll ``condition`` (plain or async) until it returns something true; return that.

    Fails the test, saying ``what`` it waited for, after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:g} s for {what}")
        await asyncio.sleep(poll_s)


def speech_frames(spans: Iterable[tuple[float, float]], fps: int = FPS) -> int:
    """Video frames that fall inside the spoken spans (start_s, end_s) of some audio."""
    return sum(round((end - start) * fps) for start, end in spans)


def frames_due(state: Mapping[str, Any]) -> int:
    """Frames a session's speech gate sent to be lip-synced, from ``GET /sessions/{id}``.

    Each one was either sent with its face (``frames_inferred``) or dropped for exactly
    one reason (a frame counted ``not_ready`` is not counted again when it ends).
    """
    return int(state["frames_inferred"]) + sum(state["frames_dropped"].values())


def assert_lip_synced(
    state: Mapping[str, Any], *, due_at_least: float, share: float = LIP_SYNCED_SHARE
) -> None:
    """Assert a call lip-synced what it was due to.

    ``state`` is ``GET /sessions/{id}``. The speech gate sent at least ``due_at_least``
    frames to be lip-synced (so the caller's audio reached it), at least ``share`` of
    them went out with their face, and the rest were dropped only for lateness
    (:data:`LATENESS`).
    """
    due = frames_due(state)
    inferred = int(state["frames_inferred"])
    _report(due, inferred, dict(state["frames_dropped"]))
    assert due >= due_at_least, f"the speech gate sent {due} frames, expected >= {due_at_least}"
    faults = {r: n for r, n in state["frames_dropped"].items() if r not in LATENESS}
    assert not faults, f"frames dropped for something other than lateness: {faults}"
    assert inferred >= share * due, (
        f"{inferred} of the {due} frames due went out lip-synced (< {share:.0%}); dropped: "
        f"{dict(state['frames_dropped'])}"
    )


def _report(due: int, inferred: int, dropped: dict[str, int]) -> None:
    path = os.environ.get("LIP_SYNC_REPORT")
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
    line = {"test": test, "due": due, "lip_synced": inferred, "dropped": dropped}
    with open(path, "a", encoding="utf-8") as report:
        report.write(json.dumps(line) + "\n")


def since(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What a call's counters did between two ``GET /sessions/{id}``: ``frames_inferred``,
    ``frames_dropped`` and ``inbound_concealed_ms`` as differences, for
    :func:`assert_lip_synced` over a window."""
    dropped = {
        reason: count - before["frames_dropped"].get(reason, 0)
        for reason, count in after["frames_dropped"].items()
    }
    return {
        "frames_inferred": after["frames_inferred"] - before["frames_inferred"],
        "frames_dropped": {reason: n for reason, n in dropped.items() if n},
        "inbound_concealed_ms": after["inbound_concealed_ms"] - before["inbound_concealed_ms"],
    }


async def session_state(
    client: TestClient[Any, Any] | ClientSession, session_id: str
) -> dict[str, Any]:
    """``GET /sessions/{id}``'s JSON (the test fails if it is not 200)."""
    response = await client.get(f"/sessions/{session_id}")
    assert response.status == 200, await response.text()
    state: dict[str, Any] = await response.json()
    return state


@contextlib.asynccontextmanager
async def demo_app(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    """The real application in-process on 127.0.0.1, serving the demo avatar (generated
    under ``tmp_path``) with the fastest x264 preset."""
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as test_client:
        yield test_client
