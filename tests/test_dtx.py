"""Opus DTX for the avatar's silence (``streaming/webrtc/dtx.py``): which slots send what,
how the audio track sleeps through the rest without passing a chunk that matters, and a
real call whose offer asks for it (``usedtx=1``)."""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from aiohttp.test_utils import TestClient

import lipstream_client as lc
from streaming.audio_rates import AUDIO_CHUNK_S, CHUNK_SAMPLES, OUT_RATE
from streaming.live.send_buffers import SendBuffers
from streaming.webrtc.dtx import UPDATE_SLOTS, OpusDtx, dtx_frame
from streaming.webrtc.opus_decoder import OpusDecoder
from streaming.webrtc.tracks import SILENCE, AvatarAudioTrack, stamped
from tests.live_calls import demo_app, until
from tests.test_native_send import Recorded, _manager
from tests.test_pacing import DELAY_S, START, ManualTime, _clock
from tests.webrtc_client import Caller

VOICE = b"\x78voice"  # any payload that is not the silence frame


# -- the decision -----------------------------------------------------------------------


def test_silence_goes_out_as_libwebrtc_sends_it_two_packets_per_400_ms() -> None:
    dtx = OpusDtx(SILENCE)
    sent = [dtx.payload(i, VOICE) for i in range(3)]
    assert sent == [VOICE] * 3
    sent = [dtx.payload(i, SILENCE) for i in range(3, 3 + 4 * UPDATE_SLOTS)]
    assert sent[0] == SILENCE  # the encoder at rest, as it is
    assert sent[1] == dtx_frame(SILENCE) == bytes([SILENCE[0] & 0xFC])  # DTX begins
    out = [(i, p) for i, p in enumerate(sent) if p is not None]
    # Then per 400 ms: the silence frame (libopus's update) and a DTX frame, nothing else.
    assert len(out) == 2 + 2 * 3
    for (i, update), (j, dtx_byte) in itertools.pairwise(out[2:]):
        if update == SILENCE:
            assert (j - i, dtx_byte) == (1, dtx_frame(SILENCE))
    assert [j - i for (i, _), (j, _) in itertools.pairwise(out[1:])] == [19, 1, 19, 1, 19, 1]
    assert dtx.pausing
    assert dtx.payload(3 + 4 * UPDATE_SLOTS, VOICE) == VOICE  # sound goes out at once
    assert not dtx.pausing


def test_after_a_slot_that_sent_nothing_the_next_send_is_the_update() -> None:
    dtx = OpusDtx(SILENCE)
    dtx.payload(0, SILENCE)
    dtx.payload(1, SILENCE)  # the DTX frame: the pause starts at slot 1
    assert dtx.payload(2, SILENCE) is None
    assert dtx.next_send(2) == 1 + UPDATE_SLOTS - 1
    assert dtx.payload(7, SILENCE) is None  # a track that skipped slots (late) lands anywhere
    assert dtx.next_send(7) == 1 + UPDATE_SLOTS - 1


def test_the_dtx_frame_decodes_to_silence_in_libopus_and_ffmpeg() -> None:
    ours = OpusDecoder()
    ffmpeg = av.CodecContext.create("libopus", "r")
    ffmpeg.sample_rate, ffmpeg.layout = OUT_RATE, "mono"
    for payload in (SILENCE, dtx_frame(SILENCE), dtx_frame(SILENCE), SILENCE):
        assert not ours.decode(payload).any()
        (frame,) = ffmpeg.decode(av.Packet(payload))
        assert frame.samples == CHUNK_SAMPLES
        assert not frame.to_ndarray().any()


# -- the track ------------------------------------------------------------------------


class Chunks:
    """An audio source over real send buffers, recording the slots it was asked for."""

    def __init__(self, made_until: int) -> None:
        self.buffers = SendBuffers(DELAY_S, 25)
        self.asked: list[int] = []
        self.made_until = -1
        self.make(made_until)

    def make(self, until: int, payload: bytes = SILENCE) -> None:
        for index in range(self.made_until + 1, until + 1):
            self.buffers.put_chunk(index, stamped(payload, index))
        self.made_until = max(self.made_until, until)

    def __call__(self, index: int) -> av.Packet[Any]:
        self.asked.append(index)
        return self.buffers.take_chunk(index)


async def test_the_track_sleeps_through_silence_and_sends_sound_on_its_slot() -> None:
    made_later = 31  # the timeline makes chunks 31.. (sound from 40) when this slot is due

    class Making(ManualTime):
        async def sleep(self, seconds: float) -> None:
            await super().sleep(seconds)
            if self.now == pytest.approx(clock.due(made_later * AUDIO_CHUNK_S)):
                chunks.make(39)
                chunks.make(45, VOICE)

    time = Making(START)
    clock = _clock(time)
    chunks = Chunks(made_until=30)  # 600 ms of silence made ahead
    track = AvatarAudioTrack(clock, chunks, on_failure=lambda *_: None)
    track.send_dtx(chunks.buffers.silent_until)
    sent = [bytes(await track.recv()) for _ in range(4)]  # slots 0, 1, 20 and 21
    assert sent == [SILENCE, dtx_frame(SILENCE), SILENCE, dtx_frame(SILENCE)]
    assert chunks.asked == [0, 1, 2, 20, 21]  # slept from 3 to 19: made and silent
    assert len(time.sleeps) == 5
    # From slot 22 the track sleeps only to 31, the first chunk not made yet; by then
    # the chunks up to 45 are made, and it sleeps to the first with sound, sent on its slot.
    packet = await track.recv()
    assert bytes(packet) == VOICE
    assert packet.pts == 40 * CHUNK_SAMPLES
    assert time.now == pytest.approx(clock.due(40 * AUDIO_CHUNK_S))
    assert chunks.asked == [0, 1, 2, 20, 21, 22, 31, 40]
    assert track.dtx_slots == 18 + 18  # slots 2..19 and 22..39 sent nothing


async def test_a_sleeping_track_reports_the_slot_due_now() -> None:
    """The A/V offset the snapshots show comes from the audio track's next slot: in a
    DTX sleep that is the slot due now, not the one it will wake at."""
    seen: list[tuple[int, int]] = []  # (slots due, the track's next slot), mid-sleep

    class Probing(ManualTime):
        async def sleep(self, seconds: float) -> None:
            self.now += seconds / 2
            seen.append((clock.slots_due(AUDIO_CHUNK_S), track.next_index))
            self.now += seconds / 2

    time = Probing(START)
    clock = _clock(time)
    chunks = Chunks(made_until=30)
    track = AvatarAudioTrack(clock, chunks, on_failure=lambda *_: None)
    track.send_dtx(chunks.buffers.silent_until)
    for _ in range(3):
        await track.recv()
    # Slots 1 and 2 waited for themselves; the sleep from 3 to 20 is 17 slots long.
    assert [n for _, n in seen[1:]] == [1, 2, 12]
    assert all(due == n for due, n in seen[1:])


async def test_the_track_wakes_for_every_slot_where_nothing_is_sure() -> None:
    time = ManualTime(START)
    clock = _clock(time)
    chunks = Chunks(made_until=1)
    track = AvatarAudioTrack(clock, chunks, on_failure=lambda *_: None)
    track.send_dtx(lambda first, last: first - 1)  # e.g. an utterance waits on each chunk
    for _ in range(3):  # slots 0, 1 and the update at 20
        await track.recv()
    assert chunks.asked == list(range(21))  # taken on time, one by one
    assert len(time.sleeps) == 21
    assert track.dtx_slots == 18  # but slots 2..19 sent nothing


# -- a real call ----------------------------------------------------------------------


@pytest.fixture
async def client(tmp_path: Path, loopback: None) -> AsyncIterator[TestClient[Any, Any]]:
    async with demo_app(tmp_path) as test_client:
        yield test_client


def asking_for_dtx(sdp: str) -> str:
    """``sdp`` with ``usedtx=1`` on its Opus format (aiortc's offer has no fmtp for it)."""
    (pt,) = re.findall(r"a=rtpmap:(\d+) opus/", sdp)
    return re.sub(rf"(a=rtpmap:{pt} opus/\S+\r\n)", rf"\1a=fmtp:{pt} usedtx=1\r\n", sdp)


async def test_a_caller_asking_for_dtx_gets_the_avatars_silence_as_dtx_and_speech_whole(
    client: TestClient[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    offer = lc.Client.offer

    async def asking(self: lc.Client, sdp: str, avatar: str) -> lc.Answer:
        return await offer(self, asking_for_dtx(sdp), avatar)

    monkeypatch.setattr(lc.Client, "offer", asking)
    caller = Caller(client)
    recorded = Recorded()
    await caller.connect(microphone=None)  # nobody speaks: the avatar's audio is silence
    try:
        assert caller.pc.remoteDescription is not None
        assert "usedtx=1" in caller.pc.remoteDescription.sdp  # and the server asks back
        for transport in {t.receiver.transport for t in caller.pc.getTransceivers()}:
            recorded.tap(transport)
        audio = next(t for t in caller.pc.getTransceivers() if t.kind == "audio")
        start = len(caller.received.video_times)
        await caller.wait_for_frames(start + 100)  # 4 s of listening
        silent = [p for p in recorded.rtp() if p[1].get(1) == audio.mid.encode()]
        frames = len(caller.received.video_times) - start
        session = _manager(client).get(caller.session_id)
        assert session is not None
        # Two packets per 400 ms (20 slots) where 50 a second went before, counted over
        # the slots their timestamps span (slots a busy server skipped send nothing).
        span = (silent[-1][0].timestamp - silent[0][0].timestamp) & 0xFFFFFFFF
        slots = span // CHUNK_SAMPLES + 1
        assert slots >= 2 * frames // 3  # the packets cover the window
        assert 4 <= len(silent) <= slots // 10 + 4
        assert {len(payload) for _, _, payload in silent} <= {1, len(SILENCE)}
        assert session.peer is not None
        assert session.peer.audio_track is not None
        assert session.peer.audio_track.dtx_slots >= frames  # two slots a frame, most unsent
        # Speech: every chunk of it goes out, 20 ms apart, after the pause.
        assert caller.call is not None
        tone = 0.3 * np.sin(np.arange(OUT_RATE, dtype=np.float32) * np.float32(0.05))
        await caller.call.push_pcm(tone, OUT_RATE)

        def voiced() -> list[tuple[Any, dict[int, bytes], bytes]]:
            return [
                p
                for p in recorded.rtp()
                if p[1].get(1) == audio.mid.encode() and len(p[2]) > len(SILENCE)
            ]

        await until(lambda: len(voiced()) >= 45, "the pushed second of sound")
    finally:
        await caller.hang_up()
    packets = [p for p in recorded.rtp() if p[1].get(1) == audio.mid.encode()]
    headers = [h for h, _, _ in packets]
    assert all((b.sequence - a.sequence) & 0xFFFF == 1 for a, b in itertools.pairwise(headers))
    steps = [(b.timestamp - a.timestamp) & 0xFFFFFFFF for a, b in itertools.pairwise(headers)]
    assert all(step % CHUNK_SAMPLES == 0 and step > 0 for step in steps)  # jumps over pauses
    first = headers.index(voiced()[0][0])
    run = steps[first : first + 44]  # between the first 45 packets of sound
    assert run == [CHUNK_SAMPLES] * 44  # the sound itself, chunk after chunk


async def test_a_track_told_nothing_of_the_chunks_ahead_does_not_sleep_past_them() -> None:
    time = ManualTime(START)
    chunks = Chunks(made_until=30)
    track = AvatarAudioTrack(_clock(time), chunks, on_failure=lambda *_: None)
    track.send_dtx(None)
    for _ in range(3):  # slots 0, 1 and the update at 20
        await track.recv()
    assert chunks.asked == list(range(21))  # every slot taken, none slept through
