"""What a LiveKit session checks before it connects (``streaming/livekit/join.py``), what a
segment's attributes must say (``streaming/livekit/segments.py``), and the access units
the room is handed (``streaming/webrtc/video_encoder.py``): pure functions, no server."""

from __future__ import annotations

import fractions
import time
from datetime import timedelta

import av
import jwt
import numpy as np
import pytest
from livekit import api

from config.settings import VideoSettings
from streaming.exceptions import LiveKitTokenError, LiveKitUrlError
from streaming.livekit.join import checked_join, read_claims, redacted
from streaming.livekit.media import MAX_FILL_SLOTS, KeyframeRequests, skipped_slots
from streaming.livekit.segments import SegmentError, segment_format
from streaming.webrtc.encoder_config import EncoderConfig
from streaming.webrtc.video_encoder import EncoderFactory, LipstreamH264Encoder, access_unit

SECRET = "a-secret-long-enough-for-pyjwt-0123456789"


def token(
    *,
    attributes: dict[str, str] | None = None,
    grants: api.VideoGrants | None = None,
    ttl_s: float = 600,
) -> str:
    minted = (
        api.AccessToken("key", SECRET)
        .with_identity("avatar-1")
        .with_name("Avatar")
        .with_kind("agent")
        .with_grants(grants or api.VideoGrants(room_join=True, room="room-1"))
        .with_ttl(timedelta(seconds=ttl_s))
    )
    if attributes is None:
        attributes = {"lk.publish_on_behalf": "agent-1"}
    return minted.with_attributes(attributes).to_jwt()


def raw_token(video: dict[str, object]) -> str:
    """A token no LiveKit SDK would mint (it refuses some grants outright)."""
    claims = {
        "sub": "avatar-1",
        "exp": int(time.time()) + 600,
        "video": video,
        "attributes": {"lk.publish_on_behalf": "agent-1"},
    }
    return jwt.encode(claims, SECRET, algorithm="HS256")


def test_a_plugins_token_is_read_for_its_identity_room_and_agent() -> None:
    claims = read_claims(token())
    assert (claims.identity, claims.room, claims.agent, claims.name) == (
        "avatar-1",
        "room-1",
        "agent-1",
        "Avatar",
    )
    assert claims.expires_at is not None
    assert claims.expires_at > time.time()


@pytest.mark.parametrize(
    ("minted", "says"),
    [
        (lambda: token(attributes={}), "lk.publish_on_behalf"),
        (lambda: token(ttl_s=-30), "expired"),
        (lambda: raw_token({"roomJoin": True}), "roomJoin"),
        (lambda: token(grants=api.VideoGrants(room="room-1")), "roomJoin"),
        (
            lambda: token(grants=api.VideoGrants(room_join=True, room="r", can_publish=False)),
            "canPublish=false",
        ),
        (
            lambda: token(grants=api.VideoGrants(room_join=True, room="r", can_publish_data=False)),
            "canPublishData=false",
        ),
        (lambda: "not-a-jwt", "not a JWT"),
        (lambda: "", "access token"),
        (lambda: "x" * 9000, "access token"),
    ],
)
def test_a_token_that_can_only_fail_is_refused_saying_what_to_change(
    minted: object, says: str
) -> None:
    assert callable(minted)
    with pytest.raises(LiveKitTokenError, match=says):
        read_claims(minted())


def test_tokens_are_taken_out_of_messages() -> None:
    jwt = token()
    message = f"engine: signal failure: 401 Unauthorized - invalid token: {jwt}, err: x"
    assert jwt not in redacted(message)
    assert redacted(message).count("<token>") == 1


@pytest.mark.parametrize(
    ("url", "joined"),
    [
        ("ws://127.0.0.1:7880", "ws://127.0.0.1:7880"),
        ("http://127.0.0.1:7880", "ws://127.0.0.1:7880"),
        ("https://127.0.0.1", "wss://127.0.0.1"),
    ],
)
async def test_urls_are_taken_as_the_sdk_connects_to_them(url: str, joined: str) -> None:
    join = await checked_join(url, token(), allow_private=True)
    assert join.url.rstrip("/") == joined
    assert join.claims.agent == "agent-1"


@pytest.mark.parametrize(
    ("url", "allow_private", "says"),
    [
        ("ftp://127.0.0.1", True, "ws"),
        ("ws://", True, "host"),
        ("ws://127.0.0.1:99999", True, "port"),
        ("ws://127.0.0.1:7880", False, "livekit.allow_private"),
        ("ws://10.1.2.3:7880", False, "livekit.allow_private"),
        ("ws://[::1]:7880", False, "livekit.allow_private"),
        ("ws://no-such-host.invalid", False, "resolve"),
    ],
)
async def test_urls_lipstream_must_not_or_cannot_reach_are_refused(
    url: str, allow_private: bool, says: str
) -> None:
    with pytest.raises(LiveKitUrlError, match=says):
        await checked_join(url, token(), allow_private=allow_private)


def test_segments_declare_their_rate_and_channels() -> None:
    assert segment_format({"sample_rate": "24000", "num_channels": "2"}).sample_bytes == 4
    for attributes in (
        {},
        {"sample_rate": "24000"},
        {"sample_rate": "fast", "num_channels": "1"},
        {"sample_rate": "4000", "num_channels": "1"},
        {"sample_rate": "48000", "num_channels": "9"},
    ):
        with pytest.raises(SegmentError):
            segment_format(attributes)


def test_a_frames_payloads_join_back_into_the_access_unit_they_were_cut_from() -> None:
    """What the room's pre-encoded source is handed: the encoder's payloads (FU-A for a
    big IDR, STAP-A for parameter sets) depacketized into Annex B, the first frame with
    its IDR slice, SPS and PPS (what a subscriber's decoder starts from)."""
    encoder = EncoderFactory(VideoSettings(preset="ultrafast")).create(320, 240, 25)
    rng = np.random.default_rng(1)
    for index in range(3):
        image = rng.integers(0, 255, (240 * 3 // 2, 320), dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(image, format="yuv420p")
        frame.pts = index * 3600
        frame.time_base = fractions.Fraction(1, 90_000)
        payloads, _ = encoder.encode(frame, force_keyframe=index == 0)
        unit = access_unit(payloads)
        assert unit.startswith(b"\x00\x00\x00\x01") or unit.startswith(b"\x00\x00\x01")
        if index == 0:
            types = {
                unit[i + 3] & 0x1F
                for i in range(len(unit) - 3)
                if unit[i : i + 3] == b"\x00\x00\x01"
            }
            assert {5, 7, 8} <= types  # IDR slice, SPS, PPS
    encoder.close()


def test_the_rooms_first_keyframe_request_is_answered_at_once_and_later_ones_are_owed() -> None:
    """LiveKit's keyframe requests (``streaming/livekit/media.py``): the first at once,
    though the stream's first IDR went out a moment ago (before anyone subscribed);
    later ones once per the encoder's interval, owed rather than dropped, and none when
    a shared loop's IDR went out meanwhile."""
    now = [0.0]
    encoder = LipstreamH264Encoder(
        EncoderConfig.from_settings(VideoSettings(preset="ultrafast"), 320, 240),
        clock=lambda: now[0],
    )
    encoder.keyframe_interval_s = 1.0

    def encode(index: int) -> None:
        frame = av.VideoFrame.from_ndarray(
            np.zeros((240 * 3 // 2, 320), dtype=np.uint8), format="yuv420p"
        )
        frame.pts = index * 3600
        frame.time_base = fractions.Fraction(1, 90_000)
        encoder.encode_packet(frame)

    requests = KeyframeRequests()
    encode(0)  # the stream's first IDR, at t = 0
    now[0] = 0.1
    requests.update(True, encoder)  # the first subscriber
    assert encoder.keyframe_wanted
    encode(1)  # that IDR, at 0.1
    assert not encoder.keyframe_wanted
    now[0] = 0.3
    requests.update(True, encoder)  # a second subscriber, within the interval
    assert not encoder.keyframe_wanted
    now[0] = 1.0
    requests.update(False, encoder)
    assert not encoder.keyframe_wanted
    now[0] = 1.15
    requests.update(False, encoder)  # owed: answered once the interval has passed
    assert encoder.keyframe_wanted
    encode(2)
    now[0] = 1.5
    requests.update(True, encoder)
    now[0] = 1.7
    encoder.take_keyframe_request()  # a shared loop's IDR went out
    for t in (1.74, 2.8, 3.0):
        now[0] = t
        requests.update(False, encoder)
    assert not encoder.keyframe_wanted  # the loop's IDR answered it
    assert (requests.asked, requests.granted) == (3, 2)
    encoder.close()


def test_slots_the_audio_track_skipped_are_filled_with_silence() -> None:
    """The room's audio source counts samples for its RTP timestamps: each skipped slot
    is filled (``streaming/livekit/media.py``), never a repeated or earlier one, and no
    more than MAX_FILL_SLOTS at once."""
    assert skipped_slots(None, 7) == 0  # the first packet
    assert skipped_slots(7, 7) == 0
    assert skipped_slots(7, 6) == 0
    assert skipped_slots(7, 10) == 3
    assert skipped_slots(0, 10_000) == MAX_FILL_SLOTS
