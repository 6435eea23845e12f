"""The Python client's side of issue 28: switching the avatar of a running call, idle
clips, and playback positions (``played_ms``, ``interrupted``) on speech events.

First the client against a small aiohttp app that answers as docs/apps.md says the
server does (what is sent, how answers and refusals are typed), then against a real
``lipstream serve`` with a second, smaller demo avatar (640x360, another seed) and an
incompatible one (30 fps): a switch during speech changes the frames' size at the frame
the server named, the speech goes on and is reported whole, refusals leave the call as
it was, and an interrupted utterance says how much of it was played. Everything waits
on what was received; nothing is timed.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

import lipstream_client as lc
from inference_core.assets.demo_avatar import write_demo_avatar
from tests.live_calls import until
from tests.server_process import lipstream_serve

REPO = Path(__file__).resolve().parent.parent
SMALL = (640, 360)
LARGE = (1280, 720)
RATE = 24_000
FPS = 25

# -- the client against the documented answers -----------------------------------------


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@asynccontextmanager
async def contract_server(sent: list[Any]) -> AsyncIterator[str]:
    """An app answering the switch, idle and stream routes as docs/apps.md does;
    ``sent`` collects every request body and stream text message."""

    async def avatars(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "avatars": [
                    {"id": "demo", "name": "Demo", "clips": ["idle", "thinking"]},
                    {"id": "small", "name": "Small"},
                ]
            }
        )

    async def switch(request: web.Request) -> web.Response:
        body = await request.json()
        sent.append(body)
        avatar = body["avatar"]
        if avatar == "nobody":
            return _error(404, "model_not_found", "no avatar 'nobody'")
        if avatar == "fast":
            return _error(409, "avatar_incompatible", "'fast' runs at 30 fps, this call at 25")
        if avatar == "busy":
            return _error(409, "avatar_switch_busy", "another switch is loading")
        return web.json_response(
            {
                "session_id": request.match_info["id"],
                "avatar": avatar,
                "previous": "demo",
                "changed": avatar != "demo",
                "frame": 250,
                "media_ms": 10_000.0,
            }
        )

    async def idle(request: web.Request) -> web.Response:
        body = await request.json()
        sent.append(body)
        if body["clip"] != "thinking":
            return _error(404, "clip_not_found", "no clip 'x': this avatar has idle, thinking")
        answer = {"session_id": "s", "clip": "thinking", "previous": "idle"}
        return web.json_response({**answer, "clips": ["idle", "thinking"]})

    async def stream(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"type": "ready", "session_id": "s", "max_buffer_ms": 4000})
        async for message in ws:
            if message.type != WSMsgType.TEXT:
                continue
            command = json.loads(message.data)
            sent.append(command)
            if command == {"type": "switch_avatar", "avatar": "small"}:
                changed = {"avatar": "small", "previous": "demo", "frame": 9, "media_ms": 360.0}
                await ws.send_json({"type": "avatar_changed", **changed, "frame_size": [640, 360]})
            elif command["type"] == "set_idle_clip":
                await ws.send_json({"type": "error", "code": "clip_not_found", "message": "m"})
        return ws

    app = web.Application()
    app.router.add_get("/avatars", avatars)
    app.router.add_post("/sessions/{id}/avatar", switch)
    app.router.add_post("/sessions/{id}/idle", idle)
    app.router.add_get("/sessions/{id}/audio/stream", stream)
    async with TestServer(app) as server:
        yield str(server.make_url("")).rstrip("/")


async def test_switch_and_idle_requests_answers_and_refusals() -> None:
    sent: list[Any] = []
    async with contract_server(sent) as url, lc.Client(url) as client:
        avatars = await client.avatars()
        assert avatars == [
            lc.Avatar("demo", "Demo", ("idle", "thinking")),
            lc.Avatar("small", "Small", ()),
        ]
        switched = await client.switch_avatar("s 1", "small")
        assert switched == lc.AvatarSwitched("s 1", "small", "demo", True, 250, 10_000.0)
        assert not (await client.switch_avatar("s", "demo")).changed
        refusals = {"nobody": lc.NotFound, "fast": lc.Conflict, "busy": lc.Conflict}
        for avatar, kind in refusals.items():
            with pytest.raises(kind) as refused:
                await client.switch_avatar("s", avatar)
            assert refused.value.status in (404, 409)
        with pytest.raises(lc.Conflict, match="30 fps") as incompatible:
            await client.switch_avatar("s", "fast")
        assert incompatible.value.code == "avatar_incompatible"

        clip = await client.set_idle_clip("s", "thinking")
        assert clip == lc.IdleClipSet("s", "thinking", "idle", ("idle", "thinking"))
        with pytest.raises(lc.NotFound, match="idle, thinking") as unknown:
            await client.set_idle_clip("s", "x")
        assert unknown.value.code == "clip_not_found"

        async with client.stream_audio("s") as stream:
            await stream.switch_avatar("small")
            changed = await anext(e async for e in stream.events() if e["type"] != "ready")
            assert changed["type"] == "avatar_changed"
            assert changed["frame_size"] == [640, 360]
            await stream.set_idle_clip("nope")
            error = await anext(e async for e in stream.events() if e["type"] == "error")
            assert error["code"] == "clip_not_found"
            with pytest.raises(lc.NotFound):  # the refusal is raised once, as any other
                await stream.end()
            await stream.end()
    assert sent[:2] == [{"avatar": "small"}, {"avatar": "demo"}]
    assert {"type": "switch_avatar", "avatar": "small"} in sent
    assert {"type": "set_idle_clip", "clip": "nope"} in sent


def test_the_new_error_codes_are_typed() -> None:
    assert lc.ERRORS_BY_CODE["avatar_incompatible"] is lc.Conflict
    assert lc.ERRORS_BY_CODE["avatar_switch_busy"] is lc.Conflict
    assert lc.ERRORS_BY_CODE["clip_not_found"] is lc.NotFound


# -- against ``lipstream serve`` ---------------------------------------------------------


def write_avatars(root: Path) -> None:
    """``small``: a demo-style avatar at 640x360 with another face and two idle clips;
    ``fast``: the same at 30 fps, which a 25 fps call cannot switch to."""
    edit_manifest(
        write_demo_avatar(root / "small", count=30, size=SMALL, seed=5),
        clips={"idle": [0, 15], "thinking": [15, 30]},
    )
    edit_manifest(write_demo_avatar(root / "fast", count=30, size=SMALL, seed=6), fps=30)


def edit_manifest(package: Path, **fields: Any) -> None:
    manifest = json.loads((package / "avatar.json").read_text())
    (package / "avatar.json").write_text(json.dumps({**manifest, **fields}))


def speech(seconds: float) -> np.ndarray:
    """A loud, voice-like tone (a 220 Hz carrier, 3 Hz syllables) as int16."""
    t = np.arange(int(RATE * seconds)) / RATE
    wave = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))
    return (wave * 32767).astype(np.int16)


class Received:
    """Everything a call receives, kept as numbers: each frame's index and size, and
    every event, in order."""

    def __init__(self, call: lc.Call) -> None:
        self.frames: list[tuple[int, int, int]] = []
        self.events: list[lc.Event] = []
        self._tasks = [
            asyncio.create_task(self._video(call), name="test-video"),
            asyncio.create_task(self._events(call), name="test-events"),
        ]

    async def _video(self, call: lc.Call) -> None:
        async for frame in call.video_frames():
            self.frames.append((frame.index, frame.frame.width, frame.frame.height))

    async def _events(self, call: lc.Call) -> None:
        async for event in call.events():
            self.events.append(event)

    def event(self, kind: str, **fields: Any) -> lc.Event | None:
        for event in self.events:
            if event["type"] == kind and all(event.get(k) == v for k, v in fields.items()):
                return event
        return None

    def last_index(self) -> int:
        return self.frames[-1][0] if self.frames else -1

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.mark.slow
async def test_a_switch_during_speech_changes_the_picture_and_keeps_the_speech(
    tmp_path: Path, loopback: None
) -> None:
    write_avatars(tmp_path / "avatars")
    async with lipstream_serve(tmp_path, server={"ice_loopback_only": "true"}) as server:
        url = f"http://127.0.0.1:{server.port}"
        async with await lc.connect(url, "demo") as call:
            got = Received(call)
            try:
                listed = {a.id: a for a in await call.client.avatars()}
                assert {"demo", "small", "fast"} <= set(listed)
                assert "idle" in listed["demo"].clips, listed["demo"]
                assert set(listed["small"].clips) == {"idle", "thinking"}, listed["small"]
                await until(lambda: got.last_index() >= FPS, "the first second of video")

                pcm = speech(4.0)
                queued = await call.push_pcm(pcm, RATE)
                started = await until(
                    lambda: got.event("speech_started", utterance=queued.utterance),
                    "the speech to start",
                )
                switched = await call.switch_avatar("small")
                assert (switched.avatar, switched.previous, switched.changed) == (
                    "small",
                    "demo",
                    True,
                )
                assert switched.session_id == call.session_id
                assert call.avatar == "small"
                frame = switched.frame
                assert frame is not None
                assert frame > round(started["media_ms"] / 40)
                assert switched.media_ms == pytest.approx(frame * 40, abs=1)
                changed = await until(lambda: got.event("avatar_changed"), "avatar_changed")
                assert (changed["avatar"], changed["previous"]) == ("small", "demo")
                assert (changed["frame"], changed["frame_size"]) == (frame, list(SMALL))
                await until(lambda: got.last_index() >= frame + FPS, "a second of the new avatar")
                before = {(w, h) for i, w, h in got.frames if i < frame}
                after = {(w, h) for i, w, h in got.frames if i >= frame}
                assert (before, after) == ({LARGE}, {SMALL})

                # The speech went on across the switch and was played whole.
                ended = await until(
                    lambda: got.event("speech_ended", utterance=queued.utterance),
                    "the speech to end",
                )
                assert ended["interrupted"] is False
                assert ended["played_ms"] == pytest.approx(len(pcm) / RATE * 1000, abs=40)
                assert ended["played_ms"] == pytest.approx(ended["duration_ms"], abs=20)
                assert started["media_ms"] < changed["media_ms"] < ended["media_ms"]

                # The same avatar again changes nothing; refusals leave the call as it was.
                again = await call.switch_avatar("small")
                assert (again.changed, again.previous, again.frame) == (False, "small", None)
                with pytest.raises(lc.NotFound) as unknown:
                    await call.switch_avatar("nobody")
                assert unknown.value.code == "model_not_found"
                with pytest.raises(lc.Conflict) as incompatible:
                    await call.switch_avatar("fast")
                assert incompatible.value.code == "avatar_incompatible"
                assert "fps" in incompatible.value.message
                state = await call.state()
                assert state["avatar"] == "small"
                assert state["clips"] == list(listed["small"].clips)
                assert state["idle_clip"] in state["clips"]
                shown = got.last_index()
                await until(lambda: got.last_index() >= shown + FPS, "video after the refusals")
                assert {(w, h) for i, w, h in got.frames if i >= frame} == {SMALL}
                assert [e["type"] for e in got.events].count("avatar_changed") == 1
            finally:
                await got.stop()


@pytest.mark.slow
async def test_idle_clips_and_what_an_interrupted_utterance_played(
    tmp_path: Path, loopback: None
) -> None:
    write_avatars(tmp_path / "avatars")
    async with lipstream_serve(tmp_path, server={"ice_loopback_only": "true"}) as server:
        url = f"http://127.0.0.1:{server.port}"
        async with await lc.connect(url, "small") as call:
            got = Received(call)
            try:
                state = await call.state()
                clips = state["clips"]
                assert (set(clips), state["idle_clip"]) == ({"idle", "thinking"}, "idle")
                chosen = await call.set_idle_clip("thinking")
                assert chosen == lc.IdleClipSet(call.session_id, "thinking", "idle", tuple(clips))
                clip_event = await until(
                    lambda: got.event("idle_clip_changed", clip="thinking"), "idle_clip_changed"
                )
                assert clip_event["previous"] == "idle"
                assert isinstance(clip_event["media_ms"], float | int)
                assert (await call.state())["idle_clip"] == "thinking"
                with pytest.raises(lc.NotFound) as unknown:
                    await call.set_idle_clip("no-such-clip")
                assert unknown.value.code == "clip_not_found"
                assert all(clip in unknown.value.message for clip in clips)

                # Cut a long utterance a second in; queue one more that never starts.
                pcm = speech(5.0)
                first = await call.push_pcm(pcm, RATE)
                second = await call.push_pcm(speech(1.0), RATE)
                started = await until(
                    lambda: got.event("speech_started", utterance=first.utterance),
                    "the long utterance to start",
                )
                into = round(started["media_ms"] / 40) + FPS
                await until(lambda: got.last_index() >= into, "a second of the long utterance")
                dropped_ms = await call.interrupt()
                assert dropped_ms > 1000
                cut = await until(lambda: got.event("interrupted"), "the interrupted event")
                kinds = [(e["type"], e.get("utterance")) for e in got.events]
                ended = [e for e in got.events if e["type"] == "speech_ended"]
                assert [e["utterance"] for e in ended] == [first.utterance, second.utterance]
                assert kinds.index(("speech_ended", second.utterance)) < kinds.index(
                    ("interrupted", None)
                )
                long, never = ended
                assert (long["interrupted"], never["interrupted"]) == (True, True)
                assert 900 <= long["played_ms"] < len(pcm) / RATE * 1000 - 1000
                assert never["played_ms"] == 0
                assert cut["played"] == [
                    {"utterance": first.utterance, "played_ms": long["played_ms"]},
                    {"utterance": second.utterance, "played_ms": 0},
                ]
                # The call goes on, idle.
                shown = got.last_index()
                await until(lambda: got.last_index() >= shown + FPS, "video after the cut")
                assert [e["type"] for e in got.events].count("speech_ended") == 2
            finally:
                await got.stop()


@pytest.mark.slow
async def test_switches_and_clips_over_the_audio_stream_and_server_sent_events(
    tmp_path: Path, loopback: None
) -> None:
    write_avatars(tmp_path / "avatars")
    async with lipstream_serve(tmp_path, server={"ice_loopback_only": "true"}) as server:
        url = f"http://127.0.0.1:{server.port}"
        call = await lc.connect(url, "demo", receive_audio=False, data_channel=False)
        async with call, call.client.events(call.session_id) as sse:
            async with call.stream_audio(rate=RATE) as stream:
                await stream.switch_avatar("nobody")
                refused = await anext(e async for e in stream.events() if e["type"] == "error")
                assert refused["code"] == "model_not_found"
                with pytest.raises(lc.NotFound):
                    await stream.end()  # raised once, then the stream goes on
                await stream.set_idle_clip("no-such-clip")
                refused = await anext(e async for e in stream.events() if e["type"] == "error")
                assert refused["code"] == "clip_not_found"
                with pytest.raises(lc.NotFound):
                    await stream.end()
                await stream.set_idle_clip("idle")  # the demo avatar's one clip

                await stream.switch_avatar("small")
                changed = await anext(
                    e async for e in stream.events() if e["type"] == "avatar_changed"
                )
                assert (changed["avatar"], changed["frame_size"]) == ("small", list(SMALL))
                await stream.send(speech(1.0))
                await stream.end()
                ended = await anext(e async for e in stream.events() if e["type"] == "speech_ended")
                assert (ended["interrupted"], ended["played_ms"]) == (
                    False,
                    pytest.approx(1000, abs=40),
                )
            # Every listener got the same events; the refusals went to the stream alone.
            seen: list[lc.Event] = []
            async with asyncio.timeout(60):
                async for event in sse:
                    seen.append(event)
                    if event["type"] == "speech_ended":
                        break
            kinds = [e["type"] for e in seen]
            assert "error" not in kinds
            assert kinds.index("avatar_changed") < kinds.index("speech_ended")
            assert seen[kinds.index("avatar_changed")]["seq"] == changed["seq"]
            assert (await call.state())["avatar"] == "small"


async def test_the_guides_switching_example(tmp_path: Path, loopback: None) -> None:
    """docs/guides/calling.md's "Switch the avatar or the idle clip", run as written."""
    # Imported here: the client's own tests above need none of the server's packages.
    from config.settings import Settings
    from web.app import build_app

    guide = (REPO / "docs/guides/calling.md").read_text()
    (example,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", guide, flags=re.DOTALL)
        if "switch_avatar" in b
    ]
    write_demo_avatar(tmp_path / "avatars" / "other", count=30, size=SMALL, seed=5)
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
        }
    )
    async with TestServer(build_app(settings), host="127.0.0.1") as server:
        base = str(server.make_url("")).rstrip("/")
        code = example.replace('"http://127.0.0.1:8080"', repr(base))
        code = code.replace('asyncio.run(main("other"))', "")
        namespace: dict[str, Any] = {}
        exec(code, namespace)
        changed, clip = await namespace["main"]("other")
    assert (changed["avatar"], changed["previous"], changed["frame_size"]) == (
        "other",
        "demo",
        list(SMALL),
    )
    assert clip.clip in clip.clips
