"""One session, many viewers (``docs/design/broadcast.md`` §21): the feed's rules on their own,
then sessions no caller owns and WHEP viewers on a real server with aiortc viewers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import av
import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection, RTCRtpSender

from config.settings import Settings
from streaming.broadcast.feed import KEPT_FRAMES, STEPS_AFTER_S, VideoFeed, ViewerVideo
from streaming.live.send_buffers import SendBuffers
from streaming.webrtc.tracks import SILENCE, stamped
from streaming.webrtc.video_encoder import EncoderFactory, LipstreamH264Encoder, payload_packet
from tests.live_calls import assert_lip_synced, frames_due, session_state, until
from tests.media import require_espeak
from tests.webrtc_client import Caller
from tests.whep_viewer import Viewer, luma_digest
from web.app import build_app
from web.app_keys import SESSIONS

Client = TestClient[Any, Any]

IDR = [bytes([0x67, 1, 2]), bytes([0x65, 9, 9])]  # an SPS and an IDR slice (NAL types 7, 5)
P = [bytes([0x41, 7, 7])]  # a non-IDR slice (NAL type 1)


def _encoder() -> LipstreamH264Encoder:
    settings = Settings().video
    return EncoderFactory(settings.model_copy(update={"encoder": "libx264"})).create(64, 64)


def _packet(payloads: list[bytes], index: int) -> av.Packet[Any]:
    return payload_packet(list(payloads), index * 3600)


# -- the feed -----------------------------------------------------------------------------


async def test_a_viewer_starts_at_an_idr_and_follows_the_chain() -> None:
    feed, session_encoder, own = VideoFeed(), _encoder(), _encoder()
    for index, payloads in enumerate([IDR, P, P]):
        feed.publish(index, _packet(payloads, index), session_encoder)
    viewer = ViewerVideo(feed)
    # Joining at frame 2 (a P-frame): nothing is sent, and the session is asked for an IDR.
    assert (await viewer.packet_for(2, own)).opaque == []
    assert feed.keyframes_asked == 1
    assert session_encoder.keyframe_wanted
    feed.publish(3, _packet(P, 3), session_encoder)
    assert (await viewer.packet_for(3, own)).opaque == []  # still out of the chain
    feed.publish(4, _packet(IDR, 4), session_encoder)
    assert (await viewer.packet_for(4, own)).opaque == IDR
    feed.publish(5, _packet(P, 5), session_encoder)
    assert (await viewer.packet_for(5, own)).opaque == P
    # A slot the session skipped sends nothing and keeps the chain: 7 follows 5.
    feed.publish(7, _packet(P, 7), session_encoder)
    assert (await viewer.packet_for(6, own)).opaque == []
    assert (await viewer.packet_for(7, own)).opaque == P
    assert viewer.frames_relayed == 3
    # A frame the viewer missed breaks the chain until the next IDR.
    feed.publish(8, _packet(P, 8), session_encoder)
    feed.publish(9, _packet(P, 9), session_encoder)
    asked = feed.keyframes_asked
    assert (await viewer.packet_for(9, own)).opaque == []
    assert feed.keyframes_asked == asked + 1


async def test_viewers_wait_for_their_slot_and_the_feed_is_bounded() -> None:
    feed, encoder = VideoFeed(), _encoder()
    viewers = [ViewerVideo(feed) for _ in range(3)]
    waiting = [asyncio.create_task(v.packet_for(0, _encoder())) for v in viewers]
    skipped = asyncio.create_task(feed.frame(1))  # a slot the session will skip
    later = asyncio.create_task(feed.frame(50))  # still waiting when the session ends
    await asyncio.sleep(0)  # let them wait (nothing else to synchronise with)
    assert not any(task.done() for task in waiting)
    feed.publish(0, _packet(IDR, 0), encoder)
    packets = await asyncio.gather(*waiting)
    assert all(packet.opaque is packets[0].opaque for packet in packets)  # one payload list
    feed.publish(2, _packet(P, 2), encoder)
    assert await skipped is None
    for index in range(3, 40):
        feed.publish(index, _packet(P, index), encoder)
    assert await feed.frame(39 - KEPT_FRAMES) is None  # gone: the feed keeps KEPT_FRAMES
    assert (await feed.frame(39 - KEPT_FRAMES + 1)) is not None
    feed.close()
    assert await later is None
    assert await feed.frame(60) is None  # after the end, at once


async def test_a_viewers_pli_asks_the_session_and_frames_keep_coming() -> None:
    feed, session_encoder, own = VideoFeed(), _encoder(), _encoder()
    viewer = ViewerVideo(feed)
    feed.publish(0, _packet(IDR, 0), session_encoder)
    assert (await viewer.packet_for(0, own)).opaque == IDR
    session_encoder.take_keyframe_request()  # the IDR went out
    feed.publish(1, _packet(P, 1), session_encoder)
    own.peer_requests_keyframe()  # the viewer's PLI
    assert (await viewer.packet_for(1, own)).opaque == P
    assert not own.keyframe_wanted  # passed on, not left on the viewer's idle encoder
    assert feed.keyframes_asked == 1


class LowerSteps:
    """Two quality steps: the session's own (0) and one below it for budgets under
    ``ceiling_bps``, whose feed the test publishes to."""

    def __init__(self, ceiling_bps: int) -> None:
        self.ceiling_bps = ceiling_bps
        self.lower = VideoFeed()
        self.asked: list[int] = []

    def choose(self, current: int, budget_bps: int) -> int:
        self.asked.append(budget_bps)
        return 1 if budget_bps < self.ceiling_bps else 0

    def feed(self, step: int, viewer: int, budget_bps: int) -> VideoFeed:
        assert step == 1
        return self.lower


async def test_a_viewers_step_follows_only_a_measured_estimate() -> None:
    """A viewer whose client sends no bandwidth feedback keeps the session's own stream:
    its link's estimate is still the start value, not a measurement of its link."""
    top, encoder, own = VideoFeed(), _encoder(), _encoder()
    now = [0.0]
    steps = LowerSteps(ceiling_bps=own.target_bitrate + 1)  # the start budget is below it
    viewer = ViewerVideo(top, steps, clock=lambda: now[0])
    for index in range(3):
        now[0] = index * (STEPS_AFTER_S + 1)  # well past the first seconds
        top.publish(index, _packet(IDR, index), encoder)
        # Bounded: a viewer moved to the lower step would wait there for a frame.
        packet = await asyncio.wait_for(viewer.packet_for(index, own), 10)
        assert packet.opaque == IDR
    assert viewer.step == 0
    assert steps.asked == []  # never consulted on an unmeasured estimate
    own.estimate_measured = True  # feedback came: the estimate is the link's now
    steps.lower.publish(3, _packet(IDR, 3), encoder)
    assert (await viewer.packet_for(3, own)).opaque == IDR
    assert viewer.step == 1
    assert steps.asked == [own.target_bitrate]


def test_viewers_hear_the_sessions_audio_packets_left_in_place() -> None:
    buffers = SendBuffers(0.5, 25)
    packets = {i: stamped(bytes([0xF8, i]), i) for i in range(10)}
    for index, packet in packets.items():
        buffers.put_chunk(index, packet)
    assert buffers.chunk_for_viewer(4) is packets[4]  # before the session's track took it
    assert buffers.take_chunk(4) is packets[4]
    assert buffers.chunk_for_viewer(4) is packets[4]  # just after
    for index in range(5, 10):
        buffers.take_chunk(index)
    assert bytes(buffers.chunk_for_viewer(4)) == SILENCE  # long gone: silence
    assert bytes(buffers.chunk_for_viewer(99)) == SILENCE  # never made


# -- on a real server ---------------------------------------------------------------------


def _settings(tmp_path: Path, **sections: dict[str, Any]) -> Settings:
    session = sections.pop("session", {})
    return Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
            "session": session,
            **sections,
        }
    )


@pytest.fixture
async def client(tmp_path: Path, loopback: None) -> AsyncIterator[Client]:
    settings = _settings(tmp_path, broadcast={"viewers_per_session": 3})
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as c:
        yield c


async def _new_session(client: Client) -> str:
    created = await client.post("/sessions", json={"avatar": "demo"})
    assert created.status == 201, await created.text()
    body = await created.json()
    assert created.headers["Location"] == f"/sessions/{body['session_id']}"
    assert body["whep"] == f"/sessions/{body['session_id']}/whep"
    session_id: str = body["session_id"]
    return session_id


async def test_viewers_of_a_callerless_session_see_one_encode(client: Client) -> None:
    require_espeak()
    sid = await _new_session(client)
    viewers = [Viewer(client, sid) for _ in range(3)]
    try:
        for viewer in viewers:
            await viewer.watch()
        await until(lambda: all(len(v.watched.pictures) >= 40 for v in viewers), "40 pictures each")
        # Three seconds of speech or more: the share lip-synced is of 75 frames, not of
        # 30, where a late start-up frame on a loaded machine was 3 % alone.
        text = "Hello to all of you, and thank you for watching this broadcast with us."
        said = await client.post(f"/sessions/{sid}/say", json={"text": text})
        assert said.status == 202
        await until(lambda: all(v.watched.audio_peak > 0.05 for v in viewers), "the voice")
        state = await session_state(client, sid)
        assert state["caller"] is False
        assert state["viewers"] == 3
        assert state["state"] == "streaming"
        metrics = await (await client.get("/metrics")).text()
        assert "\nlipstream_viewers 3.0\n" in metrics
        assert "\nlipstream_sessions_callerless 1.0\n" in metrics
        (listed,) = (await (await client.get("/admin/sessions")).json())["sessions"]
        assert (listed["caller"], listed["viewers"], listed["outputs"]) == (False, 3, 0)

        async def spoken() -> dict[str, Any] | None:
            state = await session_state(client, sid)
            done = state["queued_audio_s"] == 0 and not state["app_audio"]["speaking"]
            return state if done and frames_due(state) >= 75 else None

        state = await until(spoken, "the sentence to be spoken")
        assert_lip_synced(state, due_at_least=75)  # at the default margin, as served
        # Encoded once for everyone: every frame sent is the session's encode or its
        # shared idle loop's, not one per viewer.
        made = state["frames_encoded"] + state["frames_shared"]
        assert made <= state["frames_sent"] + 2, state
        # Each viewer decoded the same pictures (they joined at different frames).
        first, *others = [v.watched.pictures for v in viewers]
        for pictures in others:
            common = set(first) & set(pictures)
            assert len(common) >= 30, (len(first), len(pictures), len(common))
        # One viewer leaves; the others go on.
        assert await viewers[0].leave() == 200
        assert (await viewers[0].leave()) == 404
        await until(_viewers_are(client, sid, 2), "2 viewers")
        seen = [len(v.watched.pictures) for v in viewers[1:]]
        await until(
            lambda: all(
                len(v.watched.pictures) > n + 10 for v, n in zip(viewers[1:], seen, strict=True)
            ),
            "the other viewers' pictures to go on",
        )
        ended = await client.delete(f"/sessions/{sid}")
        assert ended.status == 200
        refused = await client.post(
            f"/sessions/{sid}/whep", data="v=0", headers={"Content-Type": "application/sdp"}
        )
        assert refused.status == 404
        assert (await refused.json())["error"]["code"] == "session_not_found"
    finally:
        for viewer in viewers:
            await viewer.close()


def _viewers_are(client: Client, session_id: str, count: int) -> Any:
    return lambda: client.app[SESSIONS].get(session_id).audience.count == count


async def test_a_call_can_be_watched_and_the_viewer_sees_the_callers_pictures(
    client: Client,
) -> None:
    caller = Caller(client)
    viewer = Viewer(client, "")
    try:
        await caller.connect(microphone=None)
        await caller.wait_for_frames(5)
        viewer.session_id = caller.session_id
        await viewer.watch()
        await until(lambda: len(viewer.watched.pictures) >= 40, "40 pictures")
        await until(lambda: len(caller.received.luma) >= 80, "80 of the caller's pictures")
        callers = {luma_digest(luma) for luma in caller.received.luma.values()}
        common = callers & set(viewer.watched.pictures)
        assert len(common) >= 30, (len(callers), len(viewer.watched.pictures), len(common))
        state = await session_state(client, caller.session_id)
        assert state["caller"] is True
        assert state["viewers"] == 1
    finally:
        await viewer.close()
        await caller.hang_up()


async def test_refusals_leave_the_viewers_watching(client: Client) -> None:
    sid = await _new_session(client)
    watching = [Viewer(client, sid) for _ in range(3)]
    extra = Viewer(client, sid)
    try:
        for viewer in watching:
            await viewer.watch()
        sdp = await extra.offer()
        full = await client.post(
            f"/sessions/{sid}/whep", data=sdp, headers={"Content-Type": "application/sdp"}
        )
        assert full.status == 503, await full.text()
        assert (await full.json())["error"]["code"] == "too_many_viewers"
        assert full.headers["Retry-After"]
        for offer, why in (
            (await _offer(video_codec="video/VP8"), "H.264"),
            (await _offer(video=False), "video section"),
        ):
            refused = await client.post(
                f"/sessions/{sid}/whep", data=offer, headers={"Content-Type": "application/sdp"}
            )
            body = await refused.json()
            assert refused.status in (400, 503), body  # 503 too: the limit may come first
            if refused.status == 400:
                assert body["error"]["code"] == "bad_offer"
                assert why in body["error"]["message"]
        await watching[0].leave()
        for offer, why in (
            (await _offer(video_codec="video/VP8"), "H.264"),
            (await _offer(video=False), "video section"),
        ):
            refused = await client.post(
                f"/sessions/{sid}/whep", data=offer, headers={"Content-Type": "application/sdp"}
            )
            body = await refused.json()
            assert refused.status == 400, body
            assert body["error"]["code"] == "bad_offer"
            assert why in body["error"]["message"]
        seen = [len(v.watched.pictures) for v in watching[1:]]
        await until(
            lambda: all(
                len(v.watched.pictures) > n + 25 for v, n in zip(watching[1:], seen, strict=True)
            ),
            "the viewers to keep watching",
        )
        assert client.app[SESSIONS].get(sid).audience.count == 2
        # A call whose caller could not take H.264 (VP8, encoded by aiortc) has no
        # stream a viewer could be sent.
        call = await client.post(
            "/offer", json={"sdp": await _offer(video_codec="video/VP8"), "type": "offer"}
        )
        assert call.status == 200, await call.text()
        vp8 = (await call.json())["session_id"]
        refused = await client.post(
            f"/sessions/{vp8}/whep",
            data=await _offer(),
            headers={"Content-Type": "application/sdp"},
        )
        body = await refused.json()
        assert refused.status == 400, body
        assert "H.264" in body["error"]["message"]
        assert (await client.delete(f"/sessions/{vp8}")).status == 200
    finally:
        for viewer in (*watching, extra):
            await viewer.close()


async def _offer(*, video: bool = True, video_codec: str | None = None) -> str:
    pc = RTCPeerConnection()
    try:
        if video:
            transceiver = pc.addTransceiver("video", direction="recvonly")
            if video_codec is not None:
                codecs = RTCRtpSender.getCapabilities("video").codecs
                transceiver.setCodecPreferences([c for c in codecs if c.mimeType == video_codec])
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp: str = pc.localDescription.sdp
        return sdp
    finally:
        await pc.close()


async def test_a_viewer_on_a_slow_link_watches_a_lower_step_encoded_once(
    client: Client,
) -> None:
    sid = await _new_session(client)
    fast, slow = Viewer(client, sid, own_remb=False), Viewer(client, sid, own_remb=False)
    try:
        for viewer in (fast, slow):
            await viewer.watch()
        await until(lambda: len(slow.watched.sizes) >= 10, "the slow viewer's first pictures")
        audience = client.app[SESSIONS].get(sid).audience
        rungs = audience.rungs
        assert rungs is not None
        top = rungs.steps[0]
        # The test says what each viewer's link carries (REMB; aiortc's own estimate,
        # which a loaded machine can drag down, is off from the start): one carries twice the
        # session's stream, the other 0.3 of it. The slow one first says what the fast
        # one does and then drops, as a browser's REMB does when its queue grows. A REMB
        # that starts low is followed only once it has stayed under what the viewer is
        # sent for a second (``RembRate``): the idle avatar's stream falls under 0.3 of
        # the top step a few seconds into the session, so a test that began telling
        # later (a slower machine) waited for ever.
        links = {fast: 2 * top.ceiling_bps, slow: round(0.3 * top.ceiling_bps)}
        for _ in range(3):
            for viewer in (fast, slow):
                await viewer.send_remb(links[fast])

        async def tell() -> None:
            for viewer, bitrate in links.items():
                await viewer.send_remb(bitrate)

        async def stepped_down() -> bool:
            await tell()
            return bool(slow.watched.sizes) and slow.watched.sizes[-1][0] < top.width

        await until(stepped_down, "the slow viewer to get a smaller picture", poll_s=0.2)
        seen = len(fast.watched.sizes)

        async def fast_goes_on() -> bool:
            await tell()
            return len(fast.watched.sizes) >= seen + 25

        await until(fast_goes_on, "the fast viewer's pictures", poll_s=0.2)
        assert fast.watched.sizes[-1] == (top.width, top.height)  # the other one is unmoved
        (name,) = rungs.encoded  # one lower step, encoded once for its viewer
        assert rungs.encoded[name] > 0
        width, height = slow.watched.sizes[-1]
        step = next(s for s in rungs.steps if s.name == name)
        assert (width, height) == (step.width, step.height)
        assert step.ceiling_bps <= 0.3 * top.ceiling_bps  # the highest step the link carries
    finally:
        for viewer in (fast, slow):
            await viewer.close()


async def test_a_viewer_that_vanishes_is_dropped_alone(tmp_path: Path, loopback: None) -> None:
    settings = _settings(tmp_path)
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        sid = await _new_session(client)
        viewers = [Viewer(client, sid) for _ in range(2)]
        try:
            for viewer in viewers:
                await viewer.watch()
            await until(lambda: all(len(v.watched.pictures) >= 10 for v in viewers), "pictures")
            await viewers[0].pc.close()  # gone without a DELETE
            await until(_viewers_are(client, sid, 1), "the vanished viewer to be dropped")
            seen = len(viewers[1].watched.pictures)
            await until(lambda: len(viewers[1].watched.pictures) > seen + 25, "the other to go on")
            assert client.app[SESSIONS].get(sid).closed is False
        finally:
            for viewer in viewers:
                await viewer.close()


async def test_a_callerless_session_ends_unwatched_and_silent(
    tmp_path: Path, loopback: None
) -> None:
    settings = _settings(tmp_path, session={"idle_timeout_s": 2.0})
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        alone, watched = await _new_session(client), await _new_session(client)
        viewer = Viewer(client, watched)
        try:
            await viewer.watch()
            sessions = client.app[SESSIONS]
            await until(lambda: alone not in {s.session_id for s in sessions.sessions}, "end")
            assert sessions.counters.ended_by_reason.get("idle") == 1
            assert not sessions.get(watched).closed  # watched for as long: still on
            assert await viewer.leave() == 200
            await until(lambda: watched not in {s.session_id for s in sessions.sessions}, "end")
            assert sessions.counters.ended_by_reason.get("idle") == 2
        finally:
            await viewer.close()
