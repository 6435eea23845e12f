"""Audio packets reach the decoder as they arrive, where aiortc's buffer held them back.

Each test feeds the same RTP packets (as aiortc's receiver has them: depayloaded into
``_data``) to :class:`ArrivalOrderAudioBuffer` and, for comparison, to the
``JitterBuffer(capacity=16, prefetch=4)`` aiortc 1.16 gives every audio receiver, and
counts the packets each holds: 20 ms of the caller's audio per packet held.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiortc import AudioStreamTrack, RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from streaming.audio_in.resample import resample_mono
from streaming.audio_rates import CHUNK_SAMPLES, OUT_RATE
from streaming.webrtc.audio_receive import ArrivalOrderAudioBuffer
from streaming.webrtc.compat import install_audio_receive_buffer, negotiated_codecs
from streaming.webrtc.opus_decoder import OpusDecoder
from streaming.webrtc.tracks import OpusChunkEncoder


def packet(sequence: int) -> RtpPacket:
    p = RtpPacket(payload_type=111, sequence_number=sequence % 0x10000, timestamp=960 * sequence)
    p._data = bytes([sequence % 256])  # type: ignore[attr-defined]
    return p


def behind_after(buffer: ArrivalOrderAudioBuffer | JitterBuffer, sequences: list[int]) -> int:
    """How many packets the newest one handed on trails the newest one fed."""
    newest_out = -1
    for s in sequences:
        frame = buffer.add(packet(s))[1]
        if frame is not None:
            newest_out = frame.timestamp // 960
    return sequences[-1] - newest_out


def aiortc_audio_buffer() -> JitterBuffer:
    return JitterBuffer(capacity=16, prefetch=4)


def test_packets_in_order_pass_at_once_where_aiortc_holds_four() -> None:
    sequences = list(range(1000, 1100))
    assert behind_after(aiortc_audio_buffer(), sequences) == 4  # 80 ms on every call
    ours = ArrivalOrderAudioBuffer()
    for s in sequences:  # each one on the packet's own arrival
        pli, frame = ours.add(packet(s))
        assert not pli
        assert frame is not None
        assert frame.data == bytes([s % 256])
        assert frame.timestamp == 960 * s
    assert ours.passed == 100


def test_one_lost_packet_costs_20_ms_once_where_aiortc_keeps_the_buffer_full() -> None:
    sequences = [s for s in range(0, 300) if s != 50]  # packet 50 never comes
    assert behind_after(aiortc_audio_buffer(), sequences) == 14  # 280 ms, for good
    assert behind_after(ArrivalOrderAudioBuffer(), sequences) == 0


def test_a_reordered_or_repeated_packet_is_dropped_not_played_out_of_order() -> None:
    ours = ArrivalOrderAudioBuffer()
    handed = [s for s in (1, 2, 4, 3, 5, 5, 6) if ours.add(packet(s))[1] is not None]
    assert handed == [1, 2, 4, 5, 6]
    assert ours.dropped == 2


def test_sequence_numbers_wrap_around() -> None:
    assert behind_after(ArrivalOrderAudioBuffer(), list(range(65530, 65545))) == 0


def test_a_packet_without_aiortcs_depayloaded_data_fails_naming_the_fix() -> None:
    bare = RtpPacket(payload_type=111, sequence_number=1, timestamp=0)
    with pytest.raises(RuntimeError, match=r"RtpPacket\._data.*streaming\.webrtc\.compat"):
        ArrivalOrderAudioBuffer().add(bare)


async def test_a_real_audio_call_flows_through_the_buffer(loopback: None) -> None:
    """The seam as the server uses it: installed after the offer, before media."""
    caller, server = RTCPeerConnection(), RTCPeerConnection()
    buffer = ArrivalOrderAudioBuffer()
    received: asyncio.Queue[object] = asyncio.Queue()
    server.on("track", received.put_nowait)
    try:
        caller.addTrack(AudioStreamTrack())  # 20 ms of silence per packet, in real time
        await caller.setLocalDescription(await caller.createOffer())
        await server.setRemoteDescription(caller.localDescription)
        (transceiver,) = server.getTransceivers()
        install_audio_receive_buffer(transceiver, buffer)
        await server.setLocalDescription(await server.createAnswer())
        await caller.setRemoteDescription(server.localDescription)
        track = await asyncio.wait_for(received.get(), 30)
        for _ in range(10):
            await asyncio.wait_for(track.recv(), 30)  # type: ignore[attr-defined]
        assert buffer.passed >= 10
        with pytest.raises(ValueError, match="only audio"):
            install_audio_receive_buffer(caller.addTransceiver("video"), buffer)
    finally:
        await caller.close()
        await server.close()


# -- Opus decoded on arrival ---------------------------------------------------------------


def opus_packets(count: int, payload_type: int = 111) -> list[RtpPacket]:
    """``count`` 20 ms packets of a 440 Hz tone, as aiortc's receiver has them."""
    encoder = OpusChunkEncoder()
    packets = []
    for i in range(count):
        t = (np.arange(CHUNK_SAMPLES) + i * CHUNK_SAMPLES) / OUT_RATE
        tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        p = RtpPacket(payload_type=payload_type, sequence_number=i, timestamp=960 * i)
        p._data = bytes(encoder.encode(tone, i))  # type: ignore[attr-defined]
        packets.append(p)
    return packets


def test_opus_is_decoded_on_arrival_to_48khz_mono_and_kept_from_aiortc() -> None:
    heard: list[np.ndarray] = []
    buffer = ArrivalOrderAudioBuffer(heard.append, opus_payload_types=[111])
    for p in opus_packets(50):
        assert buffer.add(p) == (False, None)  # aiortc's decoder thread gets nothing
        assert len(heard) == p.sequence_number + 1  # decoded on this packet's arrival
    assert {(h.dtype, h.shape) for h in heard} == {(np.dtype(np.float32), (CHUNK_SAMPLES,))}
    steady = np.concatenate(heard)[OUT_RATE // 4 :]
    amplitude = np.sqrt(np.mean(steady.astype(np.float64) ** 2)) * np.sqrt(2)
    assert 0.35 < amplitude < 0.65, amplitude  # 0.5 sent
    spectrum = np.abs(np.fft.rfft(steady * np.hanning(len(steady))))
    assert abs(np.argmax(spectrum) * OUT_RATE / len(steady) - 440) < 5
    assert (buffer.passed, buffer.decoded, buffer.undecodable) == (50, 50, 0)


def test_other_payload_types_still_go_to_aiortc() -> None:
    heard: list[np.ndarray] = []
    buffer = ArrivalOrderAudioBuffer(heard.append, opus_payload_types=[111])
    for p in opus_packets(3, payload_type=0):  # e.g. PCMU: aiortc decodes it
        _, frame = buffer.add(p)
        assert frame is not None
    assert not heard


def test_an_undecodable_packet_costs_its_20_ms_not_the_call() -> None:
    heard: list[np.ndarray] = []
    buffer = ArrivalOrderAudioBuffer(heard.append, opus_payload_types=[111])
    packets = opus_packets(6)
    packets[3]._data = b"\xff" * 3  # type: ignore[attr-defined]  # not an Opus frame
    for p in packets:
        buffer.add(p)
    assert buffer.undecodable == 1
    assert len(heard) == 5


async def test_a_real_opus_call_is_decoded_by_the_buffer(loopback: None) -> None:
    caller, server = RTCPeerConnection(), RTCPeerConnection()
    heard: list[np.ndarray] = []
    enough = asyncio.Event()

    def hear(samples: np.ndarray) -> None:
        heard.append(samples)
        if len(heard) >= 10:
            enough.set()

    try:
        caller.addTrack(AudioStreamTrack())
        await caller.setLocalDescription(await caller.createOffer())
        await server.setRemoteDescription(caller.localDescription)
        (transceiver,) = server.getTransceivers()
        opus = [c.payloadType for c in negotiated_codecs(transceiver) if c.name == "opus"]
        assert opus  # aiortc offers Opus first
        buffer = ArrivalOrderAudioBuffer(hear, opus_payload_types=[int(pt) for pt in opus])
        install_audio_receive_buffer(transceiver, buffer)
        await server.setLocalDescription(await server.createAnswer())
        await caller.setRemoteDescription(server.localDescription)
        await asyncio.wait_for(enough.wait(), 30)
        # aiortc's AudioStreamTrack is digital silence: decoded until the decoder is at
        # rest on its silence packet, then taken as zeros without decoding
        assert buffer.decoded >= 2
        assert buffer.decoded + buffer.silent >= 10
        assert all(h.shape == (CHUNK_SAMPLES,) for h in heard)
    finally:
        await caller.close()
        await server.close()


def test_repeated_silence_is_not_decoded_and_changes_nothing() -> None:
    """A caller's digital silence (one small payload over and over) skips the decoder
    once it is at rest on it: what is heard is the same, sample for sample."""
    encoder = OpusChunkEncoder()
    t = np.arange(OUT_RATE) / OUT_RATE
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    silence = np.zeros(OUT_RATE, dtype=np.float32)
    signal = np.concatenate([tone, silence, silence, tone[: OUT_RATE // 2], silence, tone])
    packets = []
    for i in range(len(signal) // CHUNK_SAMPLES):
        p = RtpPacket(payload_type=111, sequence_number=i, timestamp=960 * i)
        chunk = signal[i * CHUNK_SAMPLES : (i + 1) * CHUNK_SAMPLES]
        p._data = bytes(encoder.encode(chunk, i))  # type: ignore[attr-defined]
        packets.append(p)
    skipping_heard: list[np.ndarray] = []
    decoding_heard: list[np.ndarray] = []
    skipping = ArrivalOrderAudioBuffer(skipping_heard.append, opus_payload_types=[111])
    decoding = ArrivalOrderAudioBuffer(decoding_heard.append, opus_payload_types=[111])
    for p in packets:
        skipping.add(p)
        decoding.add(p)
        decoding._at_rest = None  # decodes every packet
    assert np.array_equal(np.concatenate(skipping_heard), np.concatenate(decoding_heard))
    assert decoding.silent == 0
    # 3 s of silence, 50 packets a second; libopus takes a few hundred ms after sound to
    # settle on its one silence packet
    assert skipping.silent >= 0.5 * 150
    assert skipping.decoded + skipping.silent == len(packets)


def _speech_packets(
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]], fec_percent: int
) -> tuple[list[RtpPacket], np.ndarray]:
    speech, _ = speech_16k
    pcm = resample_mono(speech[: 16000 * 2], 16000, OUT_RATE).astype(np.float32)
    encoder = OpusChunkEncoder(fec_percent=fec_percent)
    packets = []
    for i in range(len(pcm) // CHUNK_SAMPLES):
        p = RtpPacket(payload_type=111, sequence_number=i, timestamp=960 * i)
        chunk = pcm[i * CHUNK_SAMPLES : (i + 1) * CHUNK_SAMPLES]
        p._data = bytes(encoder.encode(chunk, i))  # type: ignore[attr-defined]
        packets.append(p)
    return packets, pcm


def _heard(packets: list[RtpPacket], lost: set[int]) -> tuple[np.ndarray, ArrivalOrderAudioBuffer]:
    heard: list[np.ndarray] = []
    buffer = ArrivalOrderAudioBuffer(heard.append, opus_payload_types=[111])
    for p in packets:
        if p.sequence_number not in lost:
            buffer.add(p)
    return np.concatenate(heard), buffer


def test_a_lost_packet_is_rebuilt_from_the_next_ones_fec(
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
) -> None:
    packets, _ = _speech_packets(speech_16k, fec_percent=10)
    loud = [i for i in range(5, len(packets) - 5) if len(packets[i]._data) > 60]  # type: ignore[attr-defined]
    speaking = loud[::10]
    complete, _ = _heard(packets, set())
    rebuilt, buffer = _heard(packets, set(speaking))
    # each from its successor's FEC, where libopus put one in (it does for active speech)
    assert buffer.recovered + buffer.concealed == len(speaking)
    assert buffer.recovered >= 0.6 * len(speaking)
    assert len(rebuilt) == len(complete)  # nothing missing from the mixer's timeline
    # What a rebuilt frame sounds like against what the lost packet carried: close (a
    # coarser copy), where concealment without FEC only guesses.
    plain, _ = _speech_packets(speech_16k, fec_percent=0)
    guessed, plain_buffer = _heard(plain, set(speaking))
    plain_complete, _ = _heard(plain, set())
    assert plain_buffer.concealed == len(speaking)  # no FEC in the packets: concealed
    frames = [slice(i * CHUNK_SAMPLES, (i + 1) * CHUNK_SAMPLES) for i in speaking]
    rebuilt_error = sum(float(np.mean((rebuilt[f] - complete[f]) ** 2)) for f in frames)
    guessed_error = sum(float(np.mean((guessed[f] - plain_complete[f]) ** 2)) for f in frames)
    assert rebuilt_error < 0.5 * guessed_error


def test_a_gap_of_several_packets_is_concealed_then_rebuilt(
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
) -> None:
    packets, _ = _speech_packets(speech_16k, fec_percent=10)
    complete, _ = _heard(packets, set())
    heard, buffer = _heard(packets, {20, 21, 22})
    assert buffer.concealed + buffer.recovered == 3  # two concealed, the last from FEC
    assert buffer.concealed >= 2
    assert len(heard) == len(complete)
    heard, buffer = _heard(packets, set(range(30, 40)))  # a pause longer than 5 packets
    assert (buffer.concealed, buffer.recovered) == (0, 0)
    assert len(heard) == len(complete) - 10 * CHUNK_SAMPLES


#: What Chromium's Opus encoder sends for a silent microphone with DTX (``usedtx=1``):
#: a comfort-noise update (captured from Debian's Chromium on a loopback call), then a
#: 1-byte DTX frame, then nothing for 360 ms.
CHROMIUM_SILENCE = bytes.fromhex(
    "7807c979c8c957c0a21223faef67f32ee3d3d5e9ecdb3ebc80b66e2ab78c83cd83cd00"
)


@pytest.mark.parametrize("libopus", [True, False])
def test_a_browsers_silence_a_bit_off_zero_is_heard_as_digital_silence(libopus: bool) -> None:
    """libopus decodes Chromium's silent microphone to ±1 in 16 bits: passed on as zeros,
    so the timeline's silence shortcuts hold for a browser caller; sound is untouched."""
    heard: list[np.ndarray] = []
    buffer = ArrivalOrderAudioBuffer(heard.append, opus_payload_types=[111])
    buffer._use_libopus = libopus
    payloads = [CHROMIUM_SILENCE, CHROMIUM_SILENCE[:1]] * 3
    for number, payload in enumerate(payloads):
        p = RtpPacket(payload_type=111, sequence_number=number, timestamp=960 * number)
        p._data = payload  # type: ignore[attr-defined]
        buffer.add(p)
    raw = OpusDecoder() if libopus else None
    if raw is not None:
        assert 0 < np.abs(raw.decode(CHROMIUM_SILENCE)).max() <= 1 / 32768  # not zeros as sent
    assert len(heard) == len(payloads)
    assert all(len(samples) == CHUNK_SAMPLES and not samples.any() for samples in heard)
    assert buffer.decoded == len(payloads)
    # A quiet voice, 40 dB below full scale, is passed on as decoded.
    quiet = (0.01 * np.sin(2 * np.pi * 440 * np.arange(CHUNK_SAMPLES * 5) / OUT_RATE)).astype(
        np.float32
    )
    encoder = OpusChunkEncoder()
    for i in range(5):
        p = RtpPacket(payload_type=111, sequence_number=10 + i, timestamp=960 * (10 + i))
        chunk = quiet[i * CHUNK_SAMPLES : (i + 1) * CHUNK_SAMPLES]
        p._data = bytes(encoder.encode(chunk, i))  # type: ignore[attr-defined]
        buffer.add(p)
    assert np.abs(heard[-1]).max() > 0.005


def test_a_late_packets_tick_is_made_up_by_libopus_and_the_packet_decoded_after(
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
) -> None:
    """The mixer's tick came before packet ``k``: libopus makes up its 20 ms from the
    voice before it, and packet ``k``, when it comes, decodes as it would have."""
    packets, _ = _speech_packets(speech_16k, fec_percent=0)
    complete, _ = _heard(packets, set())
    sizes = [len(p._data) for p in packets]  # type: ignore[attr-defined]
    loud = next(i for i in range(5, len(packets)) if min(sizes[i - 4 : i + 1]) > 60)
    heard: list[np.ndarray] = []
    buffer = ArrivalOrderAudioBuffer(heard.append, opus_payload_types=[111])
    for p in packets[:loud]:
        buffer.add(p)
    made = buffer.conceal(CHUNK_SAMPLES)
    assert made is not None
    assert len(made) == CHUNK_SAMPLES
    voice = complete[(loud - 1) * CHUNK_SAMPLES : loud * CHUNK_SAMPLES]
    assert np.sqrt(np.mean(made**2)) > 0.2 * np.sqrt(np.mean(voice**2))  # voice, not a hole
    assert buffer.concealed_late == 1
    for p in packets[loud:]:
        buffer.add(p)
    assert len(heard) == len(packets)  # the late packet and the rest, each decoded
    assert buffer.decoded + buffer.silent == len(packets)
    # A few ms of the late packet differ (libopus carries on from its guess); the
    # packets after it are as they were.
    after = slice((loud + 5) * CHUNK_SAMPLES, None)
    assert np.allclose(np.concatenate(heard)[after], complete[after], atol=1e-3)


def test_nothing_is_made_up_without_libopus_or_for_a_silent_caller() -> None:
    assert ArrivalOrderAudioBuffer().conceal(CHUNK_SAMPLES) is None  # nothing decoded yet
    heard: list[np.ndarray] = []
    buffer = ArrivalOrderAudioBuffer(heard.append, opus_payload_types=[111])
    encoder = OpusChunkEncoder()
    for i in range(10):  # digital silence: the decoder comes to rest on its payload
        p = RtpPacket(payload_type=111, sequence_number=i, timestamp=960 * i)
        p._data = bytes(encoder.encode(np.zeros(CHUNK_SAMPLES, np.float32), i))  # type: ignore[attr-defined]
        buffer.add(p)
    assert buffer.silent > 0
    assert buffer.conceal(CHUNK_SAMPLES) is None
