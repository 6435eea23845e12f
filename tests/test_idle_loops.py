"""Shared encoded idle loops: the loop, its cache, and a call's switches in and out of it.

Real libx264 encodes and FFmpeg decodes (aiortc's H.264 decoder) throughout: a spliced
stream is checked by decoding it, every picture against the picture it should show.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import cast

import numpy as np
import pytest
from aiortc.codecs.h264 import H264Decoder, H264PayloadDescriptor
from aiortc.jitterbuffer import JitterFrame

from compositor.sequencer import bounce_index
from config.settings import Settings, VideoSettings
from streaming.idle_loops import (
    IdleLoopCache,
    LoopKey,
    carries_idr,
    encode_loop,
    loop_length,
    parameter_sets,
)
from streaming.idle_loops.loop import loop_config
from streaming.live.idle_sharing import IdleSharing, rung_keys
from streaming.webrtc.encoder_config import EncoderConfig
from streaming.webrtc.tracks import video_frame
from streaming.webrtc.video_encoder import LipstreamH264Encoder

W, H, FPS = 192, 112, 25
COUNT = 9  # avatar frames: a bounce period of 16
EVERY = 4  # a shared keyframe every 4 positions
#: Y-PSNR a decoded frame must reach against the picture it should show. The test frames
#: are smooth gradients at ~10x the bits per pixel of 720p at 2.5 Mbit/s; they decode
#: at 40-50 dB. A frame decoded against the wrong reference (a broken splice) or another
#: loop position lands far below (neighbouring test frames differ by ~20 dB).
MIN_PSNR_DB = 35.0


def _frame(i: int, face: bool = False) -> np.ndarray:
    """Avatar frame ``i`` (yuv420p): a gradient that moves with ``i``; ``face`` paints a
    box where a lip-synced face would go."""
    y, x = np.mgrid[0:H, 0:W]
    luma = (128 + 80 * np.sin((x + 9 * i) / 17.0) * np.cos((y - 5 * i) / 13.0)).astype(np.uint8)
    if face:
        luma[30:70, 60:120] = 40 + 10 * (i % 7)
    chroma = np.full((H // 2, W), 128, dtype=np.uint8)
    return np.concatenate([luma, chroma])


def _config(**changes: object) -> EncoderConfig:
    video = VideoSettings(bitrate_kbps=1500)
    return replace(EncoderConfig.from_settings(video, W, H, FPS), **changes)  # type: ignore[arg-type]


def _key(config: EncoderConfig | None = None, **changes: object) -> LoopKey:
    config = config or _config()
    key = LoopKey("alice", "v1", config, config.bitrate, EVERY, "veryfast", COUNT)
    return replace(key, **changes)  # type: ignore[arg-type]


def _decode(frames: list[list[bytes] | tuple[bytes, ...]]) -> list[np.ndarray]:
    decoder = H264Decoder()
    pictures = []
    for i, payloads in enumerate(frames):
        data = b"".join(H264PayloadDescriptor.parse(p)[1] for p in payloads)
        for picture in decoder.decode(JitterFrame(data=data, timestamp=i * 3600)):
            pictures.append(picture.to_ndarray(format="yuv420p"))  # type: ignore[attr-defined]
    return pictures


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    err = np.mean((a[:H].astype(np.float64) - b[:H].astype(np.float64)) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(255**2 / err))


# -- the loop ---------------------------------------------------------------------------


def test_loop_length_holds_a_whole_bounce_and_a_keyframe_interval() -> None:
    assert loop_length(125, 12) == 248  # the demo avatar: its bounce period
    assert loop_length(1, 12) == 12  # a still image: one keyframe interval of it
    assert loop_length(3, 12) == 12  # period 4, three times
    assert loop_length(3, 5) == 8


def test_a_loop_decodes_from_every_keyframe_through_its_wrap() -> None:
    loop = encode_loop(_key(), _frame)
    assert loop.length == 16
    assert {p for p in range(16) if p % EVERY == 0} <= loop.keyframes
    assert all(loop.is_keyframe(p) == carries_idr(loop.payloads[p]) for p in range(16))
    for start in sorted(loop.keyframes):
        order = [(start + n) % loop.length for n in range(loop.length + EVERY)]
        pictures = _decode([loop.payloads[p] for p in order])
        assert len(pictures) == len(order)
        for p, picture in zip(order, pictures, strict=True):
            assert _psnr(picture, _frame(bounce_index(p, COUNT))) > MIN_PSNR_DB, (start, p)
    # frame n of any call is position n % length, stamped with the call's own time
    packet = loop.packet(37, FPS)
    assert packet.pts == 37 * 3600
    assert packet.opaque == list(loop.payloads[37 % 16])
    # Two calls sending one position: freeing one's packet must leave the other's
    # payloads (PyAV drops an ``opaque`` object shared by a freed packet).
    other = loop.packet(37 + 16, FPS)
    del packet
    assert other.opaque == list(loop.payloads[37 % 16])
    assert loop.nbytes == sum(len(p) for frame in loop.payloads for p in frame)


def test_a_loop_has_the_live_streams_parameter_sets() -> None:
    """A decoder must not reconfigure at a switch (H.264 SPS/PPS equal byte for byte);
    a preset that changes them (medium: more reference frames, other PPS) gives way."""
    live = _config()
    assert loop_config(_key(live)).preset == "veryfast"
    assert parameter_sets(loop_config(_key(live)), live.bitrate) == parameter_sets(
        live, live.bitrate
    )
    assert loop_config(_key(live, preset="medium")).preset == live.preset
    # constant quality: CRF 26, the one whose PPS equals a bitrate-controlled stream's
    quality = loop_config(_key(live, constant_quality=True))
    assert quality.crf == 26
    assert parameter_sets(quality, live.bitrate) == parameter_sets(live, live.bitrate)
    assert loop_config(_key(live, constant_quality=True, preset="medium")).crf is None


def test_a_constant_quality_loop_spends_no_more_than_its_rung() -> None:
    """Capped at the rung's bitrate, and fewer bytes where the picture allows; it still
    decodes to the pictures it must show."""
    at_bitrate = encode_loop(_key(), _frame)
    quality = encode_loop(_key(constant_quality=True), _frame)
    assert quality.crf == 26
    assert quality.keyframes == at_bitrate.keyframes
    assert quality.nbytes < at_bitrate.nbytes
    pictures = _decode(list(quality.payloads))
    for p, picture in enumerate(pictures):
        assert _psnr(picture, _frame(bounce_index(p, COUNT))) > MIN_PSNR_DB


def test_carries_idr_reads_single_stap_a_and_fu_a_payloads() -> None:
    idr, non_idr = bytes([0x65, 1, 2]), bytes([0x41, 1, 2])
    stap = bytes([0x78]) + len(idr).to_bytes(2, "big") + idr
    fu_start = bytes([0x7C, 0x85, 9, 9])
    assert carries_idr([idr])
    assert carries_idr([stap])
    assert carries_idr([fu_start])
    assert not carries_idr([non_idr])
    assert not carries_idr([bytes([0x78]) + len(non_idr).to_bytes(2, "big") + non_idr])
    assert not carries_idr([bytes([0x7C, 0x81, 9])])


# -- the cache --------------------------------------------------------------------------


async def _built(cache: IdleLoopCache) -> None:
    async with asyncio.timeout(60):
        while cache.stats().building:  # noqa: ASYNC110 - polls the cache's own tasks
            await asyncio.sleep(0.01)


async def test_the_cache_builds_each_loop_once_however_many_ask() -> None:
    cache = IdleLoopCache(64 * 1024 * 1024)
    reads: list[int] = []

    def frames(i: int) -> np.ndarray:
        reads.append(i)
        return _frame(i)

    key = _key()
    assert all(cache.get(key, frames) is None for _ in range(20))
    assert cache.stats().building == 1
    await _built(cache)
    loop = cache.get(key, frames)
    assert loop is not None
    assert cache.get(key, frames) is loop
    stats = cache.stats()
    assert (stats.built, stats.loops, stats.bytes) == (1, 1, loop.nbytes)
    assert len(reads) == loop.length  # one pass over the loop's frames
    await cache.close()


async def test_the_cache_stays_under_its_bound_with_many_avatars() -> None:
    one = encode_loop(_key(), _frame).nbytes
    cache = IdleLoopCache(int(2.5 * one))
    keys = [_key(avatar_id=f"avatar-{n}") for n in range(6)]
    for key in keys:
        cache.get(key, _frame)
        await _built(cache)
        assert cache.stats().bytes <= cache.max_bytes
    stats = cache.stats()
    assert (stats.built, stats.loops, stats.evicted) == (6, 2, 4)
    # least recently used out: the last two are kept, a rebuilt one comes back once
    assert cache.get(keys[-1], _frame) is not None
    assert cache.get(keys[0], _frame) is None
    await _built(cache)
    assert cache.get(keys[0], _frame) is not None
    assert cache.evict_avatar("avatar-0") == 1
    await cache.close()


async def test_a_loop_larger_than_the_cache_is_refused_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = IdleLoopCache(1000)
    with caplog.at_level(logging.WARNING):
        cache.get(_key(), _frame)
        await _built(cache)
        assert cache.get(_key(), _frame) is None
        assert cache.stats().building == 0  # not queued again
    assert "more than cache.idle_loop_bytes" in caplog.text
    assert cache.stats().bytes == 0
    disabled = IdleLoopCache(0)
    assert disabled.get(_key(), _frame) is None
    assert disabled.stats().building == 0


async def test_closing_the_cache_cancels_its_builds() -> None:
    cache = IdleLoopCache(64 * 1024 * 1024)
    cache.get(_key(frame_count=200), _frame)
    await cache.close()
    assert cache.stats().building == 0
    assert cache.stats().loops == 0


# -- a call's switches ------------------------------------------------------------------


class _Call:
    """One call's video as the renderer sends it: each frame the shared loop's packet
    when :class:`IdleSharing` gives one, else encoded by the call's own encoder."""

    def __init__(self, sharing: IdleSharing, encoder: LipstreamH264Encoder) -> None:
        self.sharing = sharing
        self.encoder = encoder
        self.sent: list[tuple[int, list[bytes] | tuple[bytes, ...], bool, bool]] = []

    def send(self, index: int, face: bool) -> None:
        shared = None
        if face:
            self.sharing.live(index, self.encoder)
        else:
            shared = self.sharing.idle(index, self.encoder)
        if shared is not None:
            self.sent.append((index, cast(list[bytes], shared.opaque), face, True))
            return
        packet = self.encoder.encode_packet(video_frame(_image(index, face), index, FPS))
        self.sent.append((index, cast(list[bytes], packet.opaque), face, False))

    def decoded(self) -> list[tuple[int, float]]:
        """Each frame sent, decoded: its index and PSNR against what it should show."""
        pictures = _decode([payloads for _, payloads, _, _ in self.sent])
        assert len(pictures) == len(self.sent), "a frame did not decode"
        return [
            (index, _psnr(picture, _image(index, face)))
            for (index, _, face, _), picture in zip(self.sent, pictures, strict=True)
        ]

    def shared(self) -> list[bool]:
        return [shared for *_, shared in self.sent]


def _image(index: int, face: bool) -> np.ndarray:
    return _frame(bounce_index(index, COUNT), face=face)


async def _call(
    rungs: tuple[float, ...] = (1.0,), steady_every: int | None = None
) -> tuple[_Call, IdleLoopCache]:
    cache = IdleLoopCache(64 * 1024 * 1024)
    config = _config()
    keys = rung_keys(_key(config), rungs)
    sharing = IdleSharing(cache, keys, _frame, FPS, steady_every=steady_every)
    sharing.prepare()
    await _built(cache)
    encoder = LipstreamH264Encoder(config)
    encoder.steady_idle = True  # what the link says once transport-cc drives it
    return _Call(sharing, encoder), cache


async def test_a_call_splices_in_and_out_of_the_loop_and_every_frame_decodes() -> None:
    call, cache = await _call()
    speech = {range(10, 21), range(41, 43), range(60, 75)}
    for index in range(100):
        call.send(index, face=any(index in span for span in speech))
    shared = call.shared()
    # the loop is ready and frame 0 is a shared keyframe; faces are never shared, and
    # after them idle frames are encoded until the next shared keyframe
    assert shared[:10] == [True] * 10
    assert not any(s for (index, _, face, s) in call.sent if face)
    assert shared[21:24] == [False] * 3
    assert shared[24] is True
    assert sum(shared) >= 55
    # the first face after the loop is the call's own IDR
    for first_face in (10, 41, 60):
        assert carries_idr(call.sent[first_face][1])
    assert all(psnr > MIN_PSNR_DB for _, psnr in call.decoded())
    await cache.close()


async def test_a_keyframe_request_while_sharing_takes_the_nearer_keyframe() -> None:
    call, cache = await _call()
    for index in range(6):
        call.send(index, face=False)  # shared from 0 on
    assert call.shared()[:6] == [True] * 6
    call.encoder.request_keyframe()  # at position 6: the call's own IDR now
    call.send(6, face=False)
    assert call.shared()[6] is False
    assert carries_idr(call.sent[6][1])
    assert not call.encoder.keyframe_wanted
    call.send(7, face=False)
    call.send(8, face=False)  # back at the next shared keyframe
    assert call.shared()[7:9] == [False, True]
    call.encoder.request_keyframe()  # at a shared keyframe position: the loop's IDR
    for index in range(9, 13):
        call.send(index, face=False)
    call.encoder.request_keyframe()
    call.send(13, face=False)
    call.encoder.request_keyframe()  # a request at position 16 % 16 = 0: a shared IDR
    for index in range(14, 17):
        call.send(index, face=False)
    assert call.shared()[16] is True
    assert not call.encoder.keyframe_wanted
    assert all(psnr > MIN_PSNR_DB for _, psnr in call.decoded())
    await cache.close()


async def test_a_skipped_slot_leaves_the_loop_and_a_rejoin_waits_one_frame() -> None:
    call, cache = await _call()
    for index in [*range(8), *range(10, 14)]:  # slots 8 and 9 skipped
        call.send(index, face=False)
    shared = dict(zip([i for i, *_ in call.sent], call.shared(), strict=True))
    assert shared[7] is True
    assert shared[10] is False
    assert carries_idr(call.sent[8][1])
    assert shared[11] is False  # never two IDRs in a row
    assert shared[12] is True  # the next shared keyframe
    await cache.close()


async def test_the_rung_follows_the_target_bitrate() -> None:
    call, cache = await _call(rungs=(1.0, 0.5, 0.25))
    bitrate = _config().bitrate
    for index in range(8):
        call.send(index, face=False)
    assert call.sharing.rung_bitrate == bitrate
    call.encoder.target_bitrate = round(0.3 * bitrate)  # what the call's link may set
    for index in range(8, 12):
        call.send(index, face=False)  # the 0.25 rung is built in the background ...
    assert call.sharing.rung_bitrate == bitrate
    await _built(cache)
    for index in range(12, 48):
        call.send(index, face=False)  # ... and joined at its next keyframe
    assert call.sharing.rung_bitrate == round(0.25 * bitrate)
    assert all(call.shared())
    sizes = [sum(map(len, payloads)) for _, payloads, *_ in call.sent]
    assert sum(sizes[-16:]) < sum(sizes[:16])  # one loop round each, fewer bytes
    assert all(psnr > MIN_PSNR_DB - 5 for _, psnr in call.decoded())
    assert cache.stats().built == 2  # the rungs asked for, not all three
    await cache.close()


async def test_a_call_moves_to_the_steady_loop_and_sends_fewer_keyframes() -> None:
    steady = 4 * EVERY  # a steady keyframe every 16 positions: one per bounce period
    call, cache = await _call(steady_every=steady)
    call.send(0, face=False)  # the steady loop is asked for here, built in the background
    assert call.sharing.keyframe_every == EVERY
    await _built(cache)
    for index in range(1, 64):
        call.send(index, face=False)
    assert all(call.shared())
    idrs = [index for index, payloads, *_ in call.sent if carries_idr(payloads)]
    assert idrs == [0, 4, 8, 12, 16, 32, 48]  # on the steady loop from 16 on
    assert call.sharing.keyframe_every == steady
    # a keyframe request between steady keyframes: the joining loop's IDR where it has
    # one, then the steady loop again at its next keyframe
    for index in range(64, 68):
        call.send(index, face=False)
    call.encoder.request_keyframe()  # due at 68: a joining keyframe, not a steady one
    for index in range(68, 81):
        call.send(index, face=False)
    assert all(call.shared())
    idrs = [index for index, payloads, *_ in call.sent[64:] if carries_idr(payloads)]
    assert idrs == [64, 68, 72, 76, 80]
    assert not call.encoder.keyframe_wanted
    assert call.sharing.keyframe_every == steady
    assert all(psnr > MIN_PSNR_DB for _, psnr in call.decoded())
    # a call that starts at a steady keyframe joins the steady loop at once
    late = _Call(
        IdleSharing(cache, rung_keys(_key(_config()), (1.0,)), _frame, FPS, steady_every=steady),
        LipstreamH264Encoder(_config()),
    )
    late.encoder.steady_idle = True
    late.send(0, face=False)
    assert late.sharing.keyframe_every == steady
    # a link that says no (its caller turned out to send REMB only): back to the joining
    # loop at its next keyframe, and there it stays
    call.encoder.steady_idle = False
    for index in range(81, 100):
        call.send(index, face=False)
    assert all(call.shared())
    idrs = [index for index, payloads, *_ in call.sent[81:] if carries_idr(payloads)]
    assert idrs == [84, 88, 92, 96]
    assert call.sharing.keyframe_every == EVERY
    assert all(psnr > MIN_PSNR_DB for _, psnr in call.decoded())
    await cache.close()


def test_sharing_is_a_setting() -> None:
    assert Settings().video.shared_idle is True
    assert Settings.model_validate(
        {"video": {"idle_bitrate_rungs": [0.5, 1.0]}}
    ).video.idle_bitrate_rungs == (1.0, 0.5)
    with pytest.raises(ValueError, match=r"0\.05\.\.1\.0"):
        Settings.model_validate({"video": {"idle_bitrate_rungs": [0.01]}})
