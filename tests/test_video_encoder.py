"""streaming.webrtc.video_encoder: real libx264 encodes, real H.264 decodes, real aiortc peers."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpCodecParameters,
    RTCRtpSender,
    VideoStreamTrack,
)
from aiortc.codecs.h264 import h264_depayload
from aiortc.exceptions import OperationError

from config.settings import VideoSettings
from streaming.webrtc.compat import receiver_codecs, sender_encoder
from streaming.webrtc.encoder_config import VBV_S
from streaming.webrtc.h264_sender import install_encoder, negotiated_codec, prefer_h264
from streaming.webrtc.video_encoder import (
    EncoderConfig,
    EncoderFactory,
    LipstreamH264Encoder,
    pick_encoder,
    probe_nvenc,
)
from tests.live_calls import TIMEOUT_S

WIDTH, HEIGHT = 320, 240
RTP_TIME_BASE = Fraction(1, 90_000)
NAL_IDR, NAL_SPS = 5, 7
# Where aiortc 1.16 keeps a sender's encoder; if an upgrade moves it, these tests fail.


def pattern(i: int, width: int = WIDTH, height: int = HEIGHT) -> np.ndarray:
    """A yuv420p (I420) array: diagonal luma bands and chroma ramps that move with ``i``."""
    x = np.arange(width)[None, :]
    y = np.arange(height)[:, None]
    luma = 128 + 90 * np.sin((x + y + 3 * i) / 14.0)
    cx = np.arange(width // 2)[None, :]
    cy = np.arange(height // 2)[:, None]
    u = np.broadcast_to(96 + (cx + i) % 64, (height // 2, width // 2))
    v = np.broadcast_to(160 - (cy + 2 * i) % 64, (height // 2, width // 2))
    chroma = np.concatenate([u, v], axis=0).reshape(height // 2, width)
    return np.concatenate([luma, chroma], axis=0).astype(np.uint8)


def video_frame(i: int, width: int = WIDTH, height: int = HEIGHT) -> av.VideoFrame:
    frame = av.VideoFrame.from_ndarray(pattern(i, width, height), format="yuv420p")
    frame.pts = i * 3600  # 25 fps on the RTP clock, as the session clock makes them
    frame.time_base = RTP_TIME_BASE
    return frame


def access_unit(payloads: list[bytes]) -> bytes:
    """Undo aiortc's RTP packetization (single NAL, STAP-A, FU-A) into Annex B bytes."""
    return b"".join(h264_depayload(payload) for payload in payloads)


def nal_types(annex_b: bytes) -> list[int]:
    return [annex_b[m.end()] & 0x1F for m in re.finditer(b"\x00\x00\x01", annex_b)]


def sps(annex_b: bytes) -> tuple[int, int, int]:
    """(profile_idc, constraint flags byte, level_idc) of the first SPS."""
    for m in re.finditer(b"\x00\x00\x01", annex_b):
        if annex_b[m.end()] & 0x1F == NAL_SPS:
            start = m.end() + 1
            return annex_b[start], annex_b[start + 1], annex_b[start + 2]
    raise AssertionError("no SPS in the access unit")


def x264_options(annex_b: bytes) -> dict[str, str]:
    """The option string x264 writes into an SEI of its first IDR, as a dict."""
    match = re.search(rb"options: ([ -~]+)", annex_b)
    assert match is not None, "no x264 options SEI in the access unit"
    pairs = (item.split("=", 1) for item in match.group(1).decode().split())
    return {key: value for key, value in pairs}


def encoder(settings: VideoSettings | None = None) -> LipstreamH264Encoder:
    return LipstreamH264Encoder(
        EncoderConfig.from_settings(settings or VideoSettings(), WIDTH, HEIGHT)
    )


def nvenc_works() -> bool:
    return probe_nvenc(VideoSettings(encoder="h264_nvenc")) is None


# --- encode -> decode ---------------------------------------------------------------


def test_round_trip_decodes_every_frame_with_small_error() -> None:
    enc = encoder(VideoSettings(keyframe_interval_s=10.0))
    decoder = av.CodecContext.create("h264", "r")
    keyframes: list[int] = []
    errors: list[float] = []
    for i in range(20):
        payloads, timestamp = enc.encode(video_frame(i), force_keyframe=(i == 12))
        assert timestamp == i * 3600
        au = access_unit(payloads)
        if NAL_IDR in nal_types(au):
            keyframes.append(i)
        decoded = decoder.decode(av.Packet(au))
        assert len(decoded) == 1, f"frame {i} did not decode"
        out = decoded[0]
        assert (out.width, out.height) == (WIDTH, HEIGHT)
        diff = out.to_ndarray().astype(np.int16) - pattern(i).astype(np.int16)
        errors.append(float(np.abs(diff).mean()))
    # Frame 0 opens the stream with an IDR; the forced one (PLI) is an IDR too, and the
    # 10 s GOP adds none in between.
    assert keyframes == [0, 12]
    assert max(errors) < 6.0, errors


def test_a_closed_encoder_frees_its_codec_and_opens_a_new_one_if_asked_again() -> None:
    enc = encoder(VideoSettings())
    enc.encode(video_frame(0))
    assert enc.codec is not None
    enc.close()  # a call's track stopped: x264's state goes now, not at a full collection
    assert enc.codec is None
    payloads, _ = enc.encode(video_frame(1))
    assert NAL_IDR in nal_types(access_unit(payloads))  # a new stream, from an IDR


def test_keyframes_follow_the_configured_interval() -> None:
    enc = encoder(VideoSettings(keyframe_interval_s=0.4))  # 10 frames at 25 fps
    keyframes = [
        i for i in range(25) if NAL_IDR in nal_types(access_unit(enc.encode(video_frame(i))[0]))
    ]
    assert keyframes == [0, 10, 20]


@pytest.mark.parametrize(("preset", "subme"), [("veryfast", "2"), ("ultrafast", "0")])
def test_stream_is_constrained_baseline_with_our_x264_options(preset: str, subme: str) -> None:
    enc = encoder(VideoSettings(preset=preset, keyframe_interval_s=2.0))  # type: ignore[arg-type]
    au = access_unit(enc.encode(video_frame(0))[0])
    profile_idc, flags, level_idc = sps(au)
    assert profile_idc == 66  # Baseline ...
    assert flags & 0x40  # ... with constraint_set1: Constrained Baseline
    assert level_idc == 31
    options = x264_options(au)
    assert options["subme"] == subme  # the preset reached x264 (aiortc's medium is 7)
    assert options["keyint"] == "50"
    assert options["bframes"] == "0"
    assert options["rc_lookahead"] == "0"  # tune=zerolatency
    assert options["bitrate"] == "1200"  # kbit/s, 320x240 at 25 fps
    assert options["vbv_maxrate"] == "1200"
    assert options["vbv_bufsize"] == str(round(1200 * VBV_S))


def test_frames_in_another_pixel_format_are_converted() -> None:
    enc = encoder()
    rgb = av.VideoFrame.from_ndarray(np.full((HEIGHT, WIDTH, 3), 90, np.uint8), format="rgb24")
    rgb.pts, rgb.time_base = 0, RTP_TIME_BASE
    decoded = av.CodecContext.create("h264", "r").decode(av.Packet(access_unit(enc.encode(rgb)[0])))
    assert [(f.width, f.height) for f in decoded] == [(WIDTH, HEIGHT)]


def test_the_links_target_is_clamped_and_small_moves_are_followed_in_place() -> None:
    enc = encoder()  # 1.2 Mbit/s configured
    enc.encode(video_frame(0))
    codec = enc.codec
    assert codec is not None
    assert codec.bit_rate == 1_200_000

    enc.target_bitrate = 100_000_000
    assert enc.target_bitrate == 1_200_000  # the configured bitrate is the ceiling
    enc.target_bitrate = 1_000
    assert enc.target_bitrate == 30_000  # the least any stream is given
    enc.target_bitrate = 900_000  # 0.75x: within what x264 follows in place

    payloads, _ = enc.encode(video_frame(1))
    assert enc.codec is codec, "a small bitrate change must not re-create the codec"
    assert codec.bit_rate == 900_000
    assert NAL_IDR not in nal_types(access_unit(payloads)), "no IDR on a small move"


def test_a_large_drop_reopens_with_an_idr_sized_for_the_new_rate() -> None:
    enc = encoder()  # 1.2 Mbit/s
    for i in range(5):
        enc.encode(video_frame(i))
    before = enc.codec
    enc.target_bitrate = 300_000  # under REOPEN_BELOW x the target it was opened for
    au = access_unit(enc.encode(video_frame(5))[0])
    assert NAL_IDR in nal_types(au)
    assert x264_options(au)["vbv_bufsize"] == str(round(300 * VBV_S))  # sized for 300
    reopened = enc.codec
    assert reopened is not before
    assert reopened is not None
    assert reopened.bit_rate == 300_000
    # opened with room (HEADROOM x) to follow the target back up in place
    enc.target_bitrate = 550_000
    assert NAL_IDR not in nal_types(access_unit(enc.encode(video_frame(6))[0]))
    assert enc.codec is reopened


def test_a_rise_within_the_headroom_is_in_place_and_beyond_it_reopens_after_a_second() -> None:
    enc = encoder()
    enc.target_bitrate = 300_000
    enc.encode(video_frame(0))  # opened for 300 kbit/s, at up to 600
    codec = enc.codec
    enc.target_bitrate = 550_000
    assert NAL_IDR not in nal_types(access_unit(enc.encode(video_frame(1))[0]))
    assert enc.codec is codec
    assert codec is not None
    assert codec.bit_rate == 550_000
    enc.target_bitrate = 1_000_000  # beyond the rate it was opened at
    idrs = [
        i for i in range(2, 30) if NAL_IDR in nal_types(access_unit(enc.encode(video_frame(i))[0]))
    ]
    assert idrs == [26]  # after a second (25 P-frames) since the last IDR, not at once
    assert enc.codec is not codec


def test_a_lower_target_lowers_the_bitrate_x264_produces() -> None:
    enc = encoder()  # 1.2 Mbit/s configured, 320x240
    rng = np.random.default_rng(3)
    noise = rng.integers(0, 256, (HEIGHT * 3 // 2, WIDTH), dtype=np.uint8)

    def bits(first: int, count: int) -> int:
        total = 0
        for i in range(first, first + count):
            frame = av.VideoFrame.from_ndarray(np.roll(noise, i * 7, axis=1), format="yuv420p")
            frame.pts, frame.time_base = i * 3600, RTP_TIME_BASE
            total += sum(len(p) for p in enc.encode(frame)[0]) * 8
        return total

    before = bits(0, 50)
    enc.target_bitrate = 300_000
    bits(50, 25)  # the VBV buffer drains
    after = bits(75, 50)
    assert after < before * 0.5, (before, after)


def test_a_ladder_step_scales_the_frames_and_reopens_at_the_steps_size() -> None:
    enc = encoder()  # 320x240 avatar frames
    enc.encode(video_frame(0))
    enc.set_link(0.5, 25, 200_000)
    assert (enc.config.width, enc.config.height) == (160, 120)
    assert enc.config.bitrate == 300_000  # the 1.2 Mbit/s ceiling, by pixel rate
    decoder = av.CodecContext.create("h264", "r")
    payloads, _ = enc.encode(video_frame(1))  # frames keep coming at the avatar's size
    au = access_unit(payloads)
    assert NAL_IDR in nal_types(au)
    decoded = decoder.decode(av.Packet(au))
    assert [(f.width, f.height) for f in decoded] == [(160, 120)]
    assert enc.frames_scaled == 1
    assert enc.source_size == (WIDTH, HEIGHT)


def test_a_lower_frame_rate_step_sends_only_its_share_of_frames() -> None:
    enc = encoder()
    assert all(enc.sends(i) for i in range(25))
    assert enc.sends_every_frame
    enc.set_link(0.5, 15, 100_000)
    assert not enc.sends_every_frame
    sent = [i for i in range(1, 26) if enc.sends(i)]
    assert len(sent) == 15  # 15 of every 25
    assert max(b - a for a, b in itertools.pairwise(sent)) == 2  # never two left out


def test_the_callers_keyframe_requests_are_answered_once_per_interval() -> None:
    now = [0.0]
    enc = LipstreamH264Encoder(
        EncoderConfig.from_settings(VideoSettings(), WIDTH, HEIGHT), clock=lambda: now[0]
    )
    enc.keyframe_interval_s = 0.3
    enc.encode_packet(video_frame(0))  # the stream's first IDR, at t = 0
    now[0] = 0.1
    enc.peer_requests_keyframe()  # the IDR is still on its way
    assert not enc.keyframe_wanted
    now[0] = 0.5
    enc.peer_requests_keyframe()
    enc.peer_requests_keyframe()  # a burst of requests for one loss
    assert enc.keyframe_wanted
    assert NAL_IDR in nal_types(access_unit(enc.encode_packet(video_frame(1)).opaque))
    now[0] = 0.6
    enc.peer_requests_keyframe()
    assert not enc.keyframe_wanted
    enc.request_keyframe()  # the call's own need (leaving a shared loop): always
    assert enc.keyframe_wanted
    assert (enc.keyframe_requests, enc.keyframe_requests_ignored) == (4, 2)


def test_the_qp_of_each_live_p_frame_is_reported() -> None:
    enc = encoder()
    for i in range(6):
        enc.encode(video_frame(i))
    assert len(enc.qps) == 5  # the first frame is an IDR
    assert all(0 < qp <= 51 for qp in enc.qps)


@pytest.mark.parametrize("preset", ["ultrafast", "superfast"])
def test_the_deblocking_filter_stays_on(preset: str) -> None:
    enc = encoder(VideoSettings(preset=preset))  # type: ignore[arg-type]
    options = x264_options(access_unit(enc.encode(video_frame(0))[0]))
    assert options["deblock"].startswith("1:"), options["deblock"]  # x264's ultrafast: 0:0:0


@pytest.mark.parametrize(("threads", "expected"), [(None, "1"), (3, "3")])
def test_encoder_threads_reach_x264(threads: int | None, expected: str) -> None:
    settings = VideoSettings() if threads is None else VideoSettings(encoder_threads=threads)
    enc = encoder(settings)
    assert x264_options(access_unit(enc.encode(video_frame(0))[0]))["threads"] == expected


def test_a_new_frame_size_reopens_at_a_matching_level() -> None:
    enc = encoder()
    enc.encode(video_frame(0))
    payloads, _ = enc.encode(video_frame(1, 1920, 1080))
    assert enc.config.level == "4.0"
    assert enc.codec is not None
    assert (enc.codec.width, enc.codec.height) == (1920, 1080)
    assert sps(access_unit(payloads))[2] == 40


# --- configuration ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "height", "fps", "bitrate", "level"),
    [
        (854, 480, 25, 1_200_000, "3.1"),
        (1280, 720, 25, 2_500_000, "3.1"),
        (1280, 720, 30, 3_000_000, "3.1"),
        (1280, 720, 50, 5_000_000, "3.2"),
        (1920, 1080, 25, 4_500_000, "4.0"),
        (1920, 1080, 50, 9_000_000, "4.2"),
    ],
)
def test_bitrate_and_level_by_resolution(
    width: int, height: int, fps: int, bitrate: int, level: str
) -> None:
    config = EncoderConfig.from_settings(VideoSettings(), width, height, fps)
    assert (config.bitrate, config.level) == (bitrate, level)
    assert config.codec_options()["level"] == level


@pytest.mark.parametrize(
    ("interval_s", "fps", "gop"), [(2.0, 25, 50), (1.0, 30, 30), (0.5, 25, 12), (0.01, 25, 1)]
)
def test_gop_from_keyframe_interval_and_fps(interval_s: float, fps: int, gop: int) -> None:
    settings = VideoSettings(keyframe_interval_s=interval_s)
    config = EncoderConfig.from_settings(settings, WIDTH, HEIGHT, fps)
    assert config.gop == gop
    assert config.codec_options()["g"] == str(gop)


def test_explicit_bitrate_is_honoured() -> None:
    settings = VideoSettings(bitrate_kbps=800)
    for width, height in [(WIDTH, HEIGHT), (1280, 720), (1920, 1080)]:
        config = EncoderConfig.from_settings(settings, width, height)
        assert config.bitrate == 800_000
        assert (config.min_bitrate, config.max_bitrate) == (30_000, 800_000)


def test_x264_and_nvenc_get_low_latency_options() -> None:
    def pick(options: dict[str, str], keys: tuple[str, ...]) -> dict[str, str]:
        return {key: options[key] for key in keys}

    x264 = EncoderConfig.from_settings(VideoSettings(preset="ultrafast"), 1280, 720)
    assert pick(x264.codec_options(), ("preset", "tune", "profile", "bf", "forced-idr")) == {
        "preset": "ultrafast",
        "tune": "zerolatency",
        "profile": "baseline",
        "bf": "0",
        "forced-idr": "1",
    }
    nvenc = EncoderConfig.from_settings(
        VideoSettings(preset="veryfast"), 1280, 720, codec_name="h264_nvenc"
    )
    keys = ("preset", "zerolatency", "delay", "bf", "profile", "forced-idr")
    assert pick(nvenc.codec_options(), keys) == {
        "preset": "p2",  # veryfast's counterpart
        "zerolatency": "1",
        "delay": "0",
        "bf": "0",
        "profile": "baseline",
        "forced-idr": "1",
    }


def test_odd_frame_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="even"):
        EncoderConfig.from_settings(VideoSettings(), 321, 240)


def test_nvenc_options_pass_ffmpegs_option_parser() -> None:
    # FFmpeg rejects an unknown value of a known option with EINVAL before it touches
    # the GPU; any other outcome (opens, or no usable device) means our values parse.
    config = EncoderConfig.from_settings(VideoSettings(), 256, 144, codec_name="h264_nvenc")
    codec = av.CodecContext.create("h264_nvenc", "w")
    codec.width, codec.height, codec.pix_fmt = 256, 144, "yuv420p"
    codec.time_base, codec.framerate = RTP_TIME_BASE, Fraction(25)
    codec.options = config.codec_options()
    try:
        codec.open()
    except av.error.ArgumentError as exc:
        pytest.fail(f"FFmpeg rejected our h264_nvenc options: {exc}")
    except av.FFmpegError:
        pass  # no NVENC device here


def test_nvenc_request_falls_back_to_libx264_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if nvenc_works():
        pytest.skip("this machine has a working NVENC")
    with caplog.at_level(logging.WARNING, logger="streaming.webrtc.video_encoder"):
        factory = EncoderFactory(VideoSettings(encoder="h264_nvenc"))
    assert factory.codec_name == "libx264"
    assert factory.create(WIDTH, HEIGHT).config.codec_name == "libx264"
    assert any(
        r.levelno == logging.WARNING and "falling back to libx264" in r.getMessage()
        for r in caplog.records
    )


def test_auto_picks_libx264_without_nvenc_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if nvenc_works():
        pytest.skip("this machine has a working NVENC")
    with caplog.at_level(logging.INFO, logger="streaming.webrtc.video_encoder"):
        assert pick_encoder(VideoSettings(encoder="auto")) == "libx264"
    assert any("h264_nvenc unavailable" in r.getMessage() for r in caplog.records)
    assert pick_encoder(VideoSettings(encoder="libx264")) == "libx264"


def test_an_nvenc_stream_that_cannot_open_encodes_with_libx264(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if nvenc_works():
        pytest.skip("this machine has a working NVENC")
    config = EncoderConfig.from_settings(VideoSettings(), WIDTH, HEIGHT, codec_name="h264_nvenc")
    enc = LipstreamH264Encoder(config)
    with caplog.at_level(logging.WARNING, logger="streaming.webrtc.video_encoder"):
        payloads, _ = enc.encode(video_frame(0))
    assert NAL_IDR in nal_types(access_unit(payloads))
    assert enc.config.codec_name == "libx264"
    assert any("h264_nvenc failed to open" in r.getMessage() for r in caplog.records)


# --- aiortc integration --------------------------------------------------------------


class PatternTrack(VideoStreamTrack):
    """Synthetic avatar frames at aiortc's own pacing."""

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        frame = av.VideoFrame.from_ndarray(pattern(pts // 3000), format="yuv420p")
        frame.pts, frame.time_base = pts, time_base
        return frame


class RecordingEncoder(LipstreamH264Encoder):
    """Our encoder, keeping what it produced so the test can read x264's options SEI."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.sent: list[list[bytes]] = []

    def encode(
        self, frame: av.frame.Frame, force_keyframe: bool = False
    ) -> tuple[list[bytes], int]:
        payloads, timestamp = super().encode(frame, force_keyframe)
        self.sent.append(payloads)
        return payloads, timestamp


def peer() -> RTCPeerConnection:
    return RTCPeerConnection(RTCConfiguration(iceServers=[]))


async def answer_with_h264(
    server: RTCPeerConnection, client: RTCPeerConnection, track: MediaStreamTrack
) -> tuple[RTCRtpSender, RTCRtpCodecParameters]:
    """The server's side as a session does it: addTrack, prefer H.264, then answer the
    client's offer. Returns the sender and the codec it negotiated."""
    sender = server.addTrack(track)
    transceiver = next(t for t in server.getTransceivers() if t.sender is sender)
    assert prefer_h264(transceiver)
    await server.setRemoteDescription(client.localDescription)
    await server.setLocalDescription(await server.createAnswer())
    codec = negotiated_codec(transceiver)
    assert codec is not None
    return sender, codec


@pytest.mark.usefixtures("loopback")
async def test_aiortc_sends_h264_with_our_encoder() -> None:
    server, client = peer(), peer()
    try:
        received: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()
        client.on("track", received.set_result)
        client_transceiver = client.addTransceiver("video", direction="recvonly")
        await client.setLocalDescription(await client.createOffer())

        sender, codec = await answer_with_h264(server, client, PatternTrack())
        assert codec.mimeType == "video/H264"
        config = EncoderConfig.from_settings(
            VideoSettings(preset="ultrafast"), WIDTH, HEIGHT, codec_name="libx264"
        )
        ours = RecordingEncoder(config)
        assert install_encoder(sender, ours, codec)
        await client.setRemoteDescription(server.localDescription)

        track = await asyncio.wait_for(received, TIMEOUT_S)
        frames = [await asyncio.wait_for(track.recv(), TIMEOUT_S) for _ in range(5)]

        assert all(
            isinstance(f, av.VideoFrame) and (f.width, f.height) == (WIDTH, HEIGHT) for f in frames
        )
        # The client's receiver can only decode what was negotiated: H.264 (+ RTX).
        client_codecs = receiver_codecs(client_transceiver)
        assert {c.mimeType for c in client_codecs if c.name != "rtx"} == {"video/H264"}
        # aiortc really encoded with our object, and x264 got our options.
        in_use = sender_encoder(sender)
        assert in_use is ours
        assert isinstance(in_use, LipstreamH264Encoder)
        assert ours.codec is not None
        assert ours.codec.bit_rate == config.bitrate
        options = x264_options(access_unit(ours.sent[0]))
        assert options["subme"] == "0"  # ultrafast; aiortc's default encoder runs 7
        assert options["keyint"] == str(config.gop)
    finally:
        await client.close()
        await server.close()


@pytest.mark.usefixtures("loopback")
async def test_a_peer_without_h264_fails_negotiation_instead_of_getting_vp8() -> None:
    server, client = peer(), peer()
    try:
        client_transceiver = client.addTransceiver("video", direction="recvonly")
        vp8 = [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType == "video/VP8"]
        client_transceiver.setCodecPreferences(vp8)
        await client.setLocalDescription(await client.createOffer())

        sender = server.addTrack(PatternTrack())
        transceiver = next(t for t in server.getTransceivers() if t.sender is sender)
        assert prefer_h264(transceiver)
        with pytest.raises(OperationError):
            await server.setRemoteDescription(client.localDescription)
    finally:
        await client.close()
        await server.close()


@pytest.mark.usefixtures("loopback")
async def test_install_encoder_leaves_a_vp8_sender_alone() -> None:
    server = peer()
    try:
        sender = server.addTrack(PatternTrack())
        vp8 = RTCRtpCodecParameters(mimeType="video/VP8", clockRate=90_000, payloadType=97)
        assert not install_encoder(sender, encoder(), vp8)
        assert sender_encoder(sender) is None
    finally:
        await server.close()


# --- frames encoded off the loop, handed to aiortc as packets --------------------------


def test_an_encoded_packet_carries_the_payloads_and_time_aiortc_sends() -> None:
    enc = encoder(VideoSettings(keyframe_interval_s=10.0))
    decoder = av.CodecContext.create("h264", "r")
    kinds: list[bool] = []
    for i in range(6):
        if i == 4:
            enc.request_keyframe()  # what a PLI does, through forward_keyframe_requests
        packet = enc.encode_packet(video_frame(i))
        payloads, timestamp = enc.pack(packet)
        assert timestamp == i * 3600  # the frame's pts, on the RTP clock
        assert payloads
        assert all(len(p) <= 1300 for p in payloads)  # RTP-sized
        au = access_unit(payloads)
        kinds.append(NAL_IDR in nal_types(au))
        [decoded] = decoder.decode(av.Packet(au))
        assert (decoded.width, decoded.height) == (WIDTH, HEIGHT)
    assert kinds == [True, False, False, False, True, False]  # the request was one IDR


def test_pack_still_packetises_a_plain_h264_packet() -> None:
    enc = encoder()
    au = access_unit(enc.encode(video_frame(0))[0])
    packet = av.Packet(au)
    packet.pts, packet.time_base = 7200, RTP_TIME_BASE
    payloads, timestamp = enc.pack(packet)
    assert timestamp == 7200
    assert access_unit(payloads) == au


class EncodedTrack(VideoStreamTrack):
    """Hands aiortc frames already encoded by the sender's own encoder, as sessions do."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder: LipstreamH264Encoder | None = None
        self.keyframes: list[int] = []
        self.keyframe_sent = asyncio.Event()

    async def recv(self) -> av.Packet:  # type: ignore[override]
        pts, _ = await self.next_timestamp()
        assert self.encoder is not None, "install the encoder before media flows"
        i = pts // 3000
        frame = av.VideoFrame.from_ndarray(pattern(i), format="yuv420p")
        frame.pts, frame.time_base = i * 3600, RTP_TIME_BASE
        packet = await asyncio.to_thread(self.encoder.encode_packet, frame)
        if NAL_IDR in nal_types(access_unit(packet.opaque)):
            self.keyframes.append(i)
            self.keyframe_sent.set()
        return packet


@pytest.mark.usefixtures("loopback")
async def test_aiortc_sends_packets_we_encoded_and_a_pli_reaches_our_encoder() -> None:
    server, client = peer(), peer()
    try:
        received: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()
        client.on("track", received.set_result)
        client.addTransceiver("video", direction="recvonly")
        await client.setLocalDescription(await client.createOffer())
        track = EncodedTrack()
        sender, codec = await answer_with_h264(server, client, track)
        track.encoder = encoder(VideoSettings(preset="ultrafast", keyframe_interval_s=10.0))
        assert install_encoder(sender, track.encoder, codec)
        await client.setRemoteDescription(server.localDescription)

        remote = await asyncio.wait_for(received, TIMEOUT_S)
        frames = [await asyncio.wait_for(remote.recv(), TIMEOUT_S) for _ in range(5)]
        assert all(
            isinstance(f, av.VideoFrame) and (f.width, f.height) == (WIDTH, HEIGHT) for f in frames
        )
        assert len(track.keyframes) == 1  # the stream's first frame only
        track.keyframe_sent.clear()
        # aiortc reacts to a PLI or FIR from the caller with this; our encoder hears it too.
        sender._send_keyframe()
        await asyncio.wait_for(track.keyframe_sent.wait(), TIMEOUT_S)
        assert len(track.keyframes) == 2
        await asyncio.wait_for(remote.recv(), TIMEOUT_S)  # still decodes after the IDR
    finally:
        await client.close()
        await server.close()
