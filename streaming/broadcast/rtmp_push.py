"""The process that pushes one RTMP stream: what an RTMP output runs FFmpeg's RTMP client in.

    python -m streaming.broadcast.rtmp_push URL --fps 25

FFmpeg's RTMP writes block on the network, and PyAV holds the GIL through them: in the
server's process, an ingest that stops answering would stop the whole server. So each
connection of an output is a child process of its own
(:class:`~streaming.broadcast.rtmp.RtmpOutput` starts it, feeds it and kills it when it
stops making progress). It reads messages from standard input (:data:`HEADER`: kind,
index, length, then the bytes): video access units in Annex B (:data:`VIDEO`,
:data:`KEYFRAME`) and the session's Opus packets (:data:`AUDIO`, by 20 ms chunk index).
From the first keyframe it connects, writes FLV with H.264 as it came and the Opus
decoded and encoded as AAC, both stamped from that keyframe's media time, and reports
on standard output, one line each: ``connecting``, ``live``, ``sent FRAMES BYTES`` every
second, or ``error MESSAGE`` before it exits 1. End of input closes the stream (exit 0).
"""

from __future__ import annotations

import argparse
import fractions
import io
import struct
import sys
import time
from typing import Any, BinaryIO

import av
import numpy as np

from streaming.audio_rates import CHUNK_SAMPLES, OUT_RATE

HEADER = struct.Struct("!BqI")
VIDEO, KEYFRAME, AUDIO = 1, 2, 3
#: The AAC stream: bitrate, and samples per AAC frame (FFmpeg's encoder takes 1024).
AAC_BITRATE = 96_000
AAC_FRAME = 1024
_MS = fractions.Fraction(1, 1000)


def message(kind: int, index: int, data: bytes) -> bytes:
    """One message of the input (module doc)."""
    return HEADER.pack(kind, index, len(data)) + data


def _read(source: BinaryIO) -> tuple[int, int, bytes] | None:
    head = source.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    kind, index, length = HEADER.unpack(head)
    data = source.read(length)
    return None if len(data) < length else (kind, index, data)


def _report(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def push(url: str, fps: int, source: BinaryIO, timeout_s: float) -> None:
    """Push what ``source`` holds to ``url`` until it ends (module doc)."""
    first = _read(source)
    while first is not None and first[0] != KEYFRAME:
        first = _read(source)
    if first is None:
        return
    _report("connecting")
    container: Any = av.open(url, "w", format="flv", timeout=(timeout_s, timeout_s))
    try:
        video = _video_stream(container, first[2])
        audio = container.add_stream("aac", rate=OUT_RATE, layout="mono")
        audio.bit_rate = AAC_BITRATE
        origin = first[1]
        sound = _Sound(origin * OUT_RATE // fps)
        frames = sent = 0
        reported = time.monotonic()
        item: tuple[int, int, bytes] | None = first
        while item is not None:
            kind, index, data = item
            if kind in (VIDEO, KEYFRAME):
                packet = av.Packet(data)
                packet.stream = video
                packet.time_base = _MS
                packet.pts = packet.dts = (index - origin) * 1000 // fps
                packet.is_keyframe = kind == KEYFRAME
                container.mux(packet)
                if frames == 0:
                    _report("live")
                frames += 1
                sent += len(data)
            elif kind == AUDIO:
                for encoded in sound.encode(audio, index, data):
                    container.mux(encoded)
                    sent += encoded.size
            if time.monotonic() - reported >= 1.0:
                reported = time.monotonic()
                _report(f"sent {frames} {sent}")
            item = _read(source)
        _report(f"sent {frames} {sent}")
    finally:
        container.close()


def _video_stream(container: Any, keyframe: bytes) -> Any:
    """The FLV's video stream, its parameters (SPS, PPS, size) read from the first IDR."""
    with av.open(io.BytesIO(keyframe), format="h264") as parsed:
        stream = container.add_stream_from_template(parsed.streams.video[0])
    stream.time_base = _MS
    return stream


class _Sound:
    """The session's Opus packets → PCM → AAC frames of 1024 samples, stamped in
    samples from the stream's first frame (``origin``, in 48 kHz samples)."""

    def __init__(self, origin: int) -> None:
        self._origin = origin
        self._decoder = av.CodecContext.create("libopus", "r")
        self._decoder.sample_rate = OUT_RATE
        self._decoder.layout = "mono"
        self._pending = np.zeros(0, dtype=np.float32)
        self._pts: int | None = None

    def encode(self, stream: Any, index: int, payload: bytes) -> list[av.Packet[Any]]:
        start = index * CHUNK_SAMPLES - self._origin
        if start < 0:
            return []  # before the first video frame
        if self._pts is None:
            self._pts = start
        pcm = np.zeros(CHUNK_SAMPLES, dtype=np.float32)
        for decoded in self._decoder.decode(av.Packet(payload)):
            samples = decoded.to_ndarray().astype(np.float32).reshape(-1)
            if decoded.format.name.startswith("s16"):
                samples /= 32768.0
            pcm[: min(len(samples), CHUNK_SAMPLES)] = samples[:CHUNK_SAMPLES]
        self._pending = np.concatenate([self._pending, pcm])
        packets: list[av.Packet[Any]] = []
        while len(self._pending) >= AAC_FRAME:
            block, self._pending = self._pending[:AAC_FRAME], self._pending[AAC_FRAME:]
            frame = av.AudioFrame.from_ndarray(block[None, :], format="fltp", layout="mono")
            frame.sample_rate = OUT_RATE
            frame.pts = self._pts
            self._pts += AAC_FRAME
            packets.extend(stream.encode(frame))
        return packets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--fps", type=int, default=25)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    args = parser.parse_args()
    try:
        push(args.url, args.fps, sys.stdin.buffer, args.timeout_s)
    except (av.FFmpegError, OSError, ValueError) as exc:
        _report(f"error {type(exc).__name__}: {exc}"[:300].replace("\n", " "))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
