"""The Python client's viewers (``lipstream_client.watch``, WHEP) against the real server.

The application runs in-process on 127.0.0.1 with ICE on loopback; the client alone
makes a session no caller owns, watches it with two viewers, makes it speak, lets one
viewer leave and hangs up. Every step waits for what the viewers have received
(:func:`tests.live_calls.until`), with a generous timeout; nothing is timed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

import lipstream_client as lc
from config.settings import Settings
from lipstream_client.http import ice_servers_from_links
from tests.live_calls import TIMEOUT_S, until
from tests.media import require_espeak
from web.app import build_app
from web.app_keys import SETTINGS
from web.session_tokens import mint_token

pytestmark = pytest.mark.slow

JWT_SECRET = "client-watch-test-secret-0123456789"
#: Louder than any decoded silence, quieter than espeak-ng's speech.
VOICE_PEAK = 0.05


@dataclass
class Watched:
    """What one viewer has received so far, read as it arrives (the queues are bounded)."""

    video: int = 0
    sizes: set[tuple[int, int]] = field(default_factory=set)
    audio_peak: float = 0.0
    events: list[lc.Event] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def of(cls, viewer: lc.Viewer) -> Watched:
        watched = cls()
        watched.tasks = [
            asyncio.create_task(watched._video(viewer)),
            asyncio.create_task(watched._audio(viewer)),
            asyncio.create_task(watched._events(viewer)),
        ]
        return watched

    async def _video(self, viewer: lc.Viewer) -> None:
        async for frame in viewer.video_frames():
            self.video += 1
            self.sizes.add((frame.frame.width, frame.frame.height))

    async def _audio(self, viewer: lc.Viewer) -> None:
        async for frame in viewer.audio_frames():
            pcm = frame.frame.to_ndarray()
            self.audio_peak = max(self.audio_peak, float(np.abs(pcm).max()) / 32768)

    async def _events(self, viewer: lc.Viewer) -> None:
        async for event in viewer.events():
            self.events.append(event)

    def saw(self, kind: str, **fields: Any) -> bool:
        return any(
            e["type"] == kind and all(e.get(k) == v for k, v in fields.items()) for e in self.events
        )

    async def stopped(self) -> None:
        """Wait for the readers, which end with the viewer's queues."""
        async with asyncio.timeout(TIMEOUT_S):
            await asyncio.gather(*self.tasks)


@contextlib.asynccontextmanager
async def lipstream_app(tmp_path: Path, **sections: Any) -> AsyncIterator[TestServer]:
    """The real application on 127.0.0.1 serving the demo avatar, with ``sections`` of
    settings besides (``auth``, ``broadcast``, …)."""
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
            **sections,
        }
    )
    server = TestServer(build_app(settings), host="127.0.0.1")
    async with server:
        yield server


def _base(server: TestServer) -> str:
    return str(server.make_url("/")).rstrip("/")


def test_ice_servers_come_from_the_links_of_the_ice_server_relation() -> None:
    links = [
        '<stun:stun.example.net>; rel="ice-server"',
        '<turn:turn.example.net?transport=udp>; rel="ice-server"; username="1700000000:ann";'
        ' credential="a+b/c=="; credential-type="password", </other>; rel="help"',
        '<turns:turn.example.net:5349>; rel=ice-server; username=u; credential="q\\"uoted"',
    ]
    assert ice_servers_from_links(links) == (
        lc.IceServer(("stun:stun.example.net",)),
        lc.IceServer(("turn:turn.example.net?transport=udp",), "1700000000:ann", "a+b/c=="),
        lc.IceServer(("turns:turn.example.net:5349",), "u", 'q"uoted'),
    )
    assert ice_servers_from_links([]) == ()


async def test_two_viewers_watch_a_session_the_client_made(tmp_path: Path, loopback: None) -> None:
    require_espeak()  # the server's text-to-speech engine
    async with (
        lipstream_app(tmp_path) as server,
        lc.Client(_base(server)) as client,
        contextlib.AsyncExitStack() as viewers_open,
    ):
        with pytest.raises(lc.NotFound) as unknown_avatar:
            await client.create_session("no-such-avatar")
        assert unknown_avatar.value.code == "model_not_found"
        created = await client.create_session("demo")
        session_id = created.session_id
        assert created.avatar == "demo"
        assert created.whep == f"/sessions/{session_id}/whep"
        assert created.delay.server_ms > 0

        viewers = [
            await viewers_open.enter_async_context(await lc.watch(client, session_id))
            for _ in range(2)
        ]
        watched = [Watched.of(viewer) for viewer in viewers]
        for viewer in viewers:
            await viewer.wait_connected(TIMEOUT_S)
            assert viewer.connection_state == "connected"
            assert (
                viewer.location == f"{_base(server)}/sessions/{session_id}/whep/{viewer.viewer_id}"
            )
            assert viewer.ice_servers == ()  # the server lists none
        assert viewers[0].viewer_id != viewers[1].viewer_id
        state = await client.state(session_id)
        assert (state["caller"], state["viewers"]) == (False, 2)

        await until(lambda: all(w.video >= 25 for w in watched), "25 frames at each viewer")
        assert all(w.sizes == {(1280, 720)} for w in watched), [w.sizes for w in watched]
        silent = [w.audio_peak for w in watched]  # nothing said yet: the avatar is silent

        queued = await client.say(session_id, "Hello, I am the demo avatar.")
        assert queued.utterance is not None
        await until(
            lambda: all(w.saw("speech_started", utterance=queued.utterance) for w in watched),
            "speech_started on each viewer's data channel",
        )
        await until(
            lambda: all(w.audio_peak > VOICE_PEAK for w in watched), "the voice at each viewer"
        )
        assert max(silent) < VOICE_PEAK / 5, silent
        for w in watched:
            assert all(e["session_id"] == session_id for e in w.events)
            seqs = [e["seq"] for e in w.events]
            assert seqs == sorted(set(seqs)), w.events  # in order, none twice

        # One viewer leaves: the session goes on, and so does the other viewer.
        await viewers[0].leave()
        await watched[0].stopped()
        assert viewers[0].connection_state == "closed"
        await until(_viewers(client, session_id, 1), "the session to count one viewer", poll_s=0.1)
        with pytest.raises(lc.NotFound) as gone:
            await client.end_viewer(viewers[0].location)  # it is gone already
        assert gone.value.code == "not_found_in_session"
        await viewers[0].leave()  # leaving twice is fine
        seen = watched[1].video
        await until(lambda: watched[1].video >= seen + 25, "25 more frames at the other viewer")

        # The session ends: its last event reaches the viewer, whose queues then end.
        await client.hang_up(session_id)
        await until(lambda: watched[1].saw("session_ended"), "session_ended at the viewer")
        with pytest.raises(lc.SessionNotFound):
            await client.state(session_id)
    await watched[1].stopped()
    assert all(viewer.connection_state == "closed" for viewer in viewers)


def _viewers(
    client: lc.Client, session_id: str, count: int
) -> Callable[[], bool | Awaitable[bool]]:
    """Whether the session counts ``count`` viewers (``GET /sessions/{id}``), for until()."""

    async def counted() -> bool:
        return bool((await client.state(session_id))["viewers"] == count)

    return counted


async def test_refused_viewers_raise_typed_errors_and_leave_nothing_open(
    tmp_path: Path, loopback: None
) -> None:
    sections = {"auth": {"jwt_secret": JWT_SECRET}, "broadcast": {"viewers_per_session": 1}}
    async with lipstream_app(tmp_path, **sections) as server:
        assert server.app is not None
        token = mint_token(server.app[SETTINGS].auth, "demo", ttl_s=600)
        async with (
            lc.Client(_base(server)) as stranger,
            lc.Client(_base(server), token=token) as client,
            contextlib.AsyncExitStack() as viewers_open,
        ):
            with pytest.raises(lc.Unauthorized):
                await stranger.create_session("demo")
            with pytest.raises(lc.Unauthorized):  # the token is for the demo avatar alone
                await client.create_session("no-such-avatar")
            with pytest.raises(lc.SessionNotFound) as unknown:
                await lc.watch(client, "no-such-session")
            assert (unknown.value.status, unknown.value.code) == (404, "session_not_found")

            session_id = (await client.create_session("demo")).session_id
            with pytest.raises(lc.Unauthorized):
                await lc.watch(stranger, session_id, ice_servers=())  # the offer, refused
            with pytest.raises(lc.BadRequest) as bad_offer:
                await client.whep_offer(session_id, "v=0\r\n")
            assert (bad_offer.value.status, bad_offer.value.code) == (400, "bad_offer")

            viewer = await viewers_open.enter_async_context(await lc.watch(client, session_id))
            with pytest.raises(lc.TooManyViewers) as too_many:
                await lc.watch(client, session_id)
            assert (too_many.value.status, too_many.value.code) == (503, "too_many_viewers")
            assert too_many.value.retry_after is not None
            await viewer.wait_connected(TIMEOUT_S)
            assert (await viewer.state())["viewers"] == 1  # the refused offers left nothing
            await viewer.leave()
            assert viewer.connection_state == "closed"
            await until(_viewers(client, session_id, 0), "the viewer to be gone", poll_s=0.1)
            await client.hang_up(session_id)
