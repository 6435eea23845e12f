"""Send buffers: each slot handed out once, stale media dropped, bounded when never pulled."""

from __future__ import annotations

from typing import Any

import av
import numpy as np

from streaming.audio_rates import AUDIO_CHUNK_S, CHUNK_SAMPLES
from streaming.live.send_buffers import STALE_SLOTS, SendBuffers
from streaming.webrtc.tracks import SILENCE, stamped

FPS = 25
DELAY_S = 0.5  # 25 chunks


def _packet(index: int) -> av.Packet[Any]:
    return stamped(f"voice {index}".encode(), index)


def _frame(index: int) -> np.ndarray:
    return np.full((6, 4), index, dtype=np.int64)


def test_buffers_stay_bounded_when_no_track_pulls() -> None:
    buffers = SendBuffers(DELAY_S, FPS)
    keep_chunks = round(DELAY_S / AUDIO_CHUNK_S) + STALE_SLOTS  # 75
    # Ten minutes of media made and never sent: 30 000 chunks, 15 000 frames.
    for chunk in range(30_000):
        buffers.put_chunk(chunk, _packet(chunk))
        if chunk % 2 == 0:
            assert buffers.put_frame(chunk // 2, _frame(chunk // 2))
    sizes = buffers.sizes()
    # Chunks 29 924..29 999 are kept: the delay and STALE_SLOTS past it.
    assert sizes.audio_chunks == keep_chunks + 1
    # Frames from the same timeline time on: chunk 29 924 is at 598.48 s, frame 14 962.
    assert sizes.frames == 14_999 - 14_962 + 1
    assert bytes(buffers.take_chunk(29_923)) == SILENCE  # pruned: silence instead
    assert bytes(buffers.take_chunk(29_924)) == b"voice 29924"


def test_a_frame_is_handed_out_once() -> None:
    buffers = SendBuffers(DELAY_S, FPS)
    frame = _frame(3)
    assert buffers.put_frame(3, frame)
    assert buffers.take_frame(3) is frame
    assert buffers.take_frame(3) is None
    assert buffers.sizes().frames == 0


def test_a_frame_for_a_slot_already_taken_is_refused() -> None:
    buffers = SendBuffers(DELAY_S, FPS)
    assert buffers.put_frame(0, _frame(0))  # nothing taken yet
    assert buffers.take_frame(5) is None  # slot 5 went out without a composed frame
    assert not buffers.put_frame(5, _frame(5))  # too late for its slot
    assert not buffers.put_frame(4, _frame(4))
    assert buffers.put_frame(6, _frame(6))
    assert buffers.sizes().frames == 1  # frame 0 went when slot 5 was taken; 6 waits


def test_taking_a_slot_drops_the_older_ones() -> None:
    buffers = SendBuffers(DELAY_S, FPS)
    for index in range(1, 6):
        buffers.put_chunk(index, _packet(index))
        buffers.put_frame(index, _frame(index))
    assert bytes(buffers.take_chunk(4)) == b"voice 4"
    assert int(buffers.take_frame(4)[0, 0]) == 4  # type: ignore[index]
    assert buffers.sizes().audio_chunks == 1  # chunk 5
    assert buffers.sizes().frames == 1  # frame 5
    assert bytes(buffers.take_chunk(3)) == SILENCE  # dropped, not sent late
    assert buffers.take_frame(5) is not None


def test_a_missing_chunk_is_silence_at_its_place_on_the_timeline() -> None:
    buffers = SendBuffers(DELAY_S, FPS)
    packet = buffers.take_chunk(7)
    assert bytes(packet) == SILENCE
    assert packet.pts == 7 * CHUNK_SAMPLES


def test_interrupt_silences_queued_audio_and_drops_frames() -> None:
    buffers = SendBuffers(DELAY_S, FPS)
    for index in (10, 11, 12):
        buffers.put_chunk(index, _packet(index))
        buffers.put_frame(index, _frame(index))
    buffers.interrupt()
    assert buffers.sizes().frames == 0
    assert buffers.sizes().audio_chunks == 3  # the slots stay, quiet
    for index in (10, 11, 12):
        packet = buffers.take_chunk(index)
        assert bytes(packet) == SILENCE
        assert packet.pts == index * CHUNK_SAMPLES
    # What is made after the interrupt is sent as made.
    buffers.put_chunk(13, _packet(13))
    assert bytes(buffers.take_chunk(13)) == b"voice 13"
