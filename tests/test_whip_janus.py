"""WHIP out to a real media server (``docs/design/broadcast.md`` §21): a session published to
Janus's VideoRoom through ``simple-whip-server``, and watched there by a subscriber on
Janus's own HTTP API (aiortc), as any Janus application would."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import aioice.ice
import av
import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from config.settings import Settings
from tests.janus_whip import ROOM, JanusWhip, run_janus_whip
from tests.live_calls import until
from web.app import build_app
from web.app_keys import SESSIONS


@pytest.fixture
def host_addresses() -> None:
    """Janus (libnice) and the server meet on the machine's non-loopback addresses."""
    if not aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True):
        pytest.fail("no non-loopback network address: libnice (Janus) gathers none on lo")


class Subscriber:
    """A VideoRoom subscriber over Janus's HTTP API; counts what it decodes."""

    def __init__(self, http: aiohttp.ClientSession, base: str) -> None:
        self.http = http
        self.base = base
        self.pc = RTCPeerConnection()
        self.sizes: list[tuple[int, int]] = []
        self.audio_samples = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._handle = ""
        self._session = ""

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.http.post(url, json={**body, "transaction": secrets.token_hex(6)}) as r:
            reply: dict[str, Any] = await r.json(content_type=None)
        assert reply.get("janus") in ("success", "ack", "event"), reply
        return reply

    async def attach(self) -> None:
        self._session = (
            f"{self.base}/{(await self._post(self.base, {'janus': 'create'}))['data']['id']}"
        )
        attached = await self._post(
            self._session, {"janus": "attach", "plugin": "janus.plugin.videoroom"}
        )
        self._handle = f"{self._session}/{attached['data']['id']}"

    async def publishers(self) -> list[dict[str, Any]]:
        reply = await self._post(
            self._handle,
            {"janus": "message", "body": {"request": "listparticipants", "room": ROOM}},
        )
        participants: list[dict[str, Any]] = reply["plugindata"]["data"]["participants"]
        return [p for p in participants if p.get("publisher")]

    async def watch(self, feed: int) -> None:
        await self._post(
            self._handle,
            {
                "janus": "message",
                "body": {"request": "join", "ptype": "subscriber", "room": ROOM, "feed": feed},
            },
        )

        async def offer() -> dict[str, Any] | None:
            async with self.http.get(f"{self._session}?maxev=1") as r:
                event: dict[str, Any] = await r.json(content_type=None)
            return event.get("jsep")

        jsep = await until(offer, "Janus's offer to the subscriber", poll_s=0.05)
        self.pc.on(
            "track", lambda track: self._tasks.append(asyncio.create_task(self._record(track)))
        )
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=jsep["sdp"], type="offer"))
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        await self._post(
            self._handle,
            {
                "janus": "message",
                "body": {"request": "start", "room": ROOM},
                "jsep": {"type": "answer", "sdp": self.pc.localDescription.sdp},
            },
        )

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._tasks.append(asyncio.create_task(self._record(track)))

    async def _record(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if isinstance(frame, av.VideoFrame):
                self.sizes.append((frame.width, frame.height))
            elif isinstance(frame, av.AudioFrame):
                self.audio_samples += frame.samples

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def _lipstream(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
            "outputs": {"allow_private": True, "retry_max_s": 2},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        yield client


async def test_a_session_published_to_janus_is_watched_there(
    tmp_path: Path, host_addresses: None
) -> None:
    async with (
        run_janus_whip(tmp_path / "janus") as janus,
        _lipstream(tmp_path) as client,
        aiohttp.ClientSession() as http,
    ):
        await _publish_and_watch(client, janus, http)


async def _publish_and_watch(
    client: TestClient[Any, Any], janus: JanusWhip, http: aiohttp.ClientSession
) -> None:
    token = secrets.token_hex(8)
    endpoint = await janus.endpoint(http, "lipstream", token)
    created = await client.post(
        "/sessions",
        json={"avatar": "demo", "outputs": [{"whip": endpoint, "token": token}]},
    )
    assert created.status == 201, await created.text()
    sid = (await created.json())["session_id"]

    async def live() -> bool:
        (status,) = (await (await client.get(f"/sessions/{sid}/outputs")).json())["outputs"]
        return bool(status["state"] == "live")

    await until(live, f"the publication to go live\n{janus.log()}")
    subscriber = Subscriber(http, janus.janus_http)
    try:
        await subscriber.attach()
        (publisher,) = await until(subscriber.publishers, "lipstream in Janus's room")
        await subscriber.watch(publisher["id"])
        await until(
            lambda: len(subscriber.sizes) >= 50, f"50 pictures through Janus\n{janus.log()}"
        )
        assert subscriber.sizes[-1] == (1280, 720)
        await until(lambda: subscriber.audio_samples > 48_000, "a second of sound through Janus")
        (status,) = (await (await client.get(f"/sessions/{sid}/outputs")).json())["outputs"]
        assert status["frames_sent"] > 50
        removed = await client.delete(f"/sessions/{sid}/outputs/{status['output_id']}")
        assert removed.status == 200
        await until(
            lambda: _no_publisher(subscriber), "the publisher to leave Janus's room", poll_s=0.2
        )
        assert client.app[SESSIONS].get(sid).outputs.count == 0
    finally:
        await subscriber.close()


async def _no_publisher(subscriber: Subscriber) -> bool:
    return not await subscriber.publishers()
