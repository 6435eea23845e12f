"""The avatar's media into its LiveKit room, slot by slot (``docs/design/livekit.md`` §22).

The session's :class:`~streaming.broadcast.station.Station` pulls its tracks on the
session's clock, as for any session no caller owns; :class:`RoomMedia` is its sink and
hands each slot's media to the room participant's sources as it is pulled, so nothing
waits here and nothing is queued:

- **video, ``livekit.video: encoded``** (the default): the station's own H.264, encoded
  once (the shared idle loops' frames included, never encoded per session), goes in as
  it is: each slot's RTP payloads are joined back into the Annex B access unit they
  were cut from (aiortc's depacketizer) and handed to an ``EncodedVideoSource``, which
  LiveKit forwards without decoding. LiveKit's keyframe requests reach the station's
  encoder (:class:`KeyframeRequests`) and its rate control sets the encoder's target
  bitrate.
- **video, ``h264`` or ``vp8``**: the composed frames go to a ``VideoSource`` as I420,
  for libwebrtc to encode (``vp8`` with LiveKit's default simulcast layers); kept to
  measure against, see the design page.
- **audio**: each 20 ms Opus packet is decoded (libopus, as the receive path does) and
  handed, as two 10 ms frames, to a 48 kHz mono ``AudioSource`` without a queue
  (``queue_size_ms=0``), which passes them straight to libwebrtc's encoder. So the
  audio leaves on the session's clock, as the video does. The SDK's default queue
  drains on a timer of its own, 10 ms after each run: on this VM it fell ~200 ms behind
  the video within 10 s (the mouth moved 0.2 s before the sound at a subscriber), and
  an interrupted sentence played on from it.
"""

from __future__ import annotations

import logging
from typing import Any

import av
import numpy as np
from livekit import rtc

from streaming.audio_rates import CHUNK_SAMPLES, OUT_RATE
from streaming.webrtc.opus_decoder import OpusDecoder
from streaming.webrtc.pacing import SessionClock
from streaming.webrtc.tracks import VIDEO_CLOCK
from streaming.webrtc.video_encoder import LipstreamH264Encoder, access_unit

logger = logging.getLogger(__name__)

#: The room's audio source holds nothing: each 10 ms goes to the encoder as captured.
AUDIO_QUEUE_MS = 0
#: What a queue-less source takes at once.
CAPTURE_SAMPLES = OUT_RATE // 100
#: The most silence (20 ms slots) put in for skipped slots at once: 2 s, past any stall
#: the session's watchdogs let go on.
MAX_FILL_SLOTS = 100
KIND = "livekit"
#: Both tracks' stream: LiveKit gives subscribers tracks of one stream in one
#: MediaStream, which libwebrtc (browsers, the SDKs) plays in sync.
STREAM = "avatar"


class RoomMedia:
    """The session's media into the room's tracks (module doc); a station's sink."""

    kind = KIND

    def __init__(
        self,
        video_mode: str,
        frame_size: tuple[int, int],
        fps: int,
        max_bitrate: int,
        clock: SessionClock,
    ) -> None:
        width, height = frame_size
        self.clock = clock
        self.video_mode = video_mode
        self.frame_size = frame_size
        self.fps = fps
        self.max_bitrate = max_bitrate
        #: The station's encoder, once there is one: LiveKit's keyframe requests and rate
        #: control go to it.
        self.encoder: LipstreamH264Encoder | None = None
        self._encoded: rtc.EncodedVideoSource | None = None
        self._raw: rtc.VideoSource | None = None
        if video_mode == "encoded":
            self._encoded = rtc.EncodedVideoSource(width, height)
            video_source: rtc.EncodedVideoSource | rtc.VideoSource = self._encoded
        else:
            self._raw = rtc.VideoSource(width, height)
            video_source = self._raw
        self.video_track = rtc.LocalVideoTrack.create_video_track("avatar-video", video_source)
        self._audio = rtc.AudioSource(OUT_RATE, 1, queue_size_ms=AUDIO_QUEUE_MS)
        self.audio_track = rtc.LocalAudioTrack.create_audio_track("avatar-audio", self._audio)
        self._opus = OpusDecoder()
        self._next_audio: int | None = None
        #: 20 ms slots of silence captured for slots the audio track skipped.
        self.audio_filled = 0
        self.frames_captured = 0
        self.frames_refused = 0
        self.keyframes = KeyframeRequests()
        self.bitrate_asked: int | None = None

    def video_options(self) -> rtc.TrackPublishOptions:
        """How the video track is published: one H.264 layer forwarded as made, or the
        codec (and simulcast for VP8) libwebrtc encodes with."""
        options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_CAMERA, stream=STREAM)
        options.video_encoding.max_framerate = self.fps
        options.video_encoding.max_bitrate = self.max_bitrate
        if self.video_mode == "vp8":
            options.video_codec = rtc.VideoCodec.VP8
            options.simulcast = True
        else:
            options.video_codec = rtc.VideoCodec.H264
            options.simulcast = False
        if self.video_mode == "encoded":
            options.video_encoder = rtc.VideoEncoderBackend.ENCODER_BACKEND_PRE_ENCODED
        return options

    @staticmethod
    def audio_options() -> rtc.TrackPublishOptions:
        return rtc.TrackPublishOptions(
            source=rtc.TrackSource.SOURCE_MICROPHONE, stream=STREAM, dtx=False
        )

    # -- the station's sink ---------------------------------------------------------------

    async def video(self, media: Any) -> None:
        """One video slot: an encoded packet (``encoded``) or a composed frame."""
        if self._encoded is not None:
            self._send_encoded(media)
        elif self._raw is not None and isinstance(media, av.VideoFrame):
            self._send_raw(media)

    async def audio(self, packet: av.Packet[Any]) -> None:
        """One 20 ms slot's Opus packet, decoded into the room's audio source, after
        silence for any slots the track skipped before it (:func:`skipped_slots`)."""
        index = (packet.pts or 0) // CHUNK_SAMPLES
        gap = skipped_slots(self._next_audio, index)
        self._next_audio = index + 1
        if gap:
            self.audio_filled += gap
            await self._capture(np.zeros(gap * CHUNK_SAMPLES, dtype=np.int16))
        try:
            samples = self._opus.decode(bytes(packet))
        except ValueError:
            samples = np.zeros(CHUNK_SAMPLES, dtype=np.float32)
        await self._capture((np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16))

    async def _capture(self, pcm: np.ndarray) -> None:
        for start in range(0, len(pcm) - CAPTURE_SAMPLES + 1, CAPTURE_SAMPLES):
            part = pcm[start : start + CAPTURE_SAMPLES]
            await self._audio.capture_frame(rtc.AudioFrame(part.tobytes(), OUT_RATE, 1, len(part)))

    def _send_encoded(self, packet: av.Packet[Any]) -> None:
        source, encoder = self._encoded, self.encoder
        assert source is not None
        assert encoder is not None
        payloads = packet.opaque
        if not isinstance(payloads, list) or not payloads:
            return  # nothing sent for this slot (the link's frame rate, or a skip)
        data = access_unit(payloads)
        keyframe = _carries_idr(data)
        width, height = encoder.config.width, encoder.config.height
        frame = rtc.EncodedVideoFrame(
            data=data,
            width=width,
            height=height,
            codec=rtc.VideoCodec.H264,
            frame_type=(
                rtc.EncodedFrameType.ENCODED_FRAME_KEY
                if keyframe
                else rtc.EncodedFrameType.ENCODED_FRAME_DELTA
            ),
            timestamp_us=self._due_us(packet.pts),
        )
        if source.capture_frame(frame):
            self.frames_captured += 1
        else:
            self.frames_refused += 1
        feedback = source.take_feedback()
        self.keyframes.update(feedback.keyframe_requested, encoder)
        if feedback.rate_control is not None:
            target = feedback.rate_control.target_bitrate_bps
            if target > 0 and target != self.bitrate_asked:
                self.bitrate_asked = target
                encoder.target_bitrate = target

    def _send_raw(self, frame: av.VideoFrame) -> None:
        source = self._raw
        assert source is not None
        i420 = frame if frame.format.name == "yuv420p" else frame.reformat(format="yuv420p")
        buffer = rtc.VideoFrame(i420.width, i420.height, rtc.VideoBufferType.I420, _planes(i420))
        source.capture_frame(buffer, timestamp_us=self._due_us(frame.pts))
        self.frames_captured += 1

    def _due_us(self, pts: int | None) -> int:
        """The capture time to stamp a frame with: when its slot was due on the session's
        clock (monotonic, as libwebrtc's clock is), not when it was pulled. The audio of
        the same media time is captured at its own slot, so a subscriber (which plays
        the avatar's two tracks in sync, one stream) lines the mouth up with the sound
        even when encoding or a busy loop delayed the frame."""
        index = round((pts or 0) * self.fps / VIDEO_CLOCK)
        return int(self.clock.due(index / self.fps) * 1_000_000)

    async def close(self) -> None:
        """Release the native sources and the decoder."""
        self._opus.close()
        if self._encoded is not None:
            await self._encoded.aclose()
        if self._raw is not None:
            await self._raw.aclose()
        await self._audio.aclose()


class KeyframeRequests:
    """The room's keyframe requests to the session's encoder.

    LiveKit's SFU asks the publisher for a keyframe when a subscriber needs one (a new
    one, or one that lost the picture), folding its subscribers' requests into one. The
    first is answered at once: no subscriber has had a picture, and the IDR the stream
    began with went out before anyone subscribed (answered as a viewer's, within a second
    of it, the first picture waited for the shared loop's next IDR, 0.5 s later on the
    development VM). Later ones at most one IDR per the encoder's interval (a second, as
    for viewers), owed rather than dropped: the SFU does not ask twice for one need.
    """

    def __init__(self) -> None:
        self.asked = 0
        self.granted = 0
        #: The age of the last IDR when the owed request came (None: nothing owed).
        self._owed_at_age: float | None = None

    def update(self, requested: bool, encoder: LipstreamH264Encoder) -> None:
        """One slot's feedback: ``requested`` if the room asked for a keyframe."""
        age = encoder.since_idr_s
        if requested:
            self.asked += 1
            if self._owed_at_age is None:
                self._owed_at_age = age
        owed_at = self._owed_at_age
        if owed_at is None:
            return
        if self.granted > 0 and age < owed_at:  # an IDR went out since (a shared loop's)
            self._owed_at_age = None
        elif self.granted == 0 or age >= encoder.keyframe_interval_s:
            self._owed_at_age = None
            self.granted += 1
            encoder.request_keyframe()


def skipped_slots(expected: int | None, index: int) -> int:
    """Audio slots missing before slot ``index`` when slot ``expected`` was due next.

    The room's audio source stamps its RTP timestamps by sample count, so a slot the
    session's audio track skipped (a loop too busy for real time: never sent) would
    shift all the audio after it against the video, whose frames carry their due times:
    at a subscriber the sound fell behind the mouth by each stall's length, 65 to 190 ms
    within 6 s on the development VM with the host stealing 40 % of its CPU. Silence for
    those slots keeps the audio on the clock; a slot seen twice, or one before the
    first, adds none."""
    if expected is None or index <= expected:
        return 0
    return min(index - expected, MAX_FILL_SLOTS)


def _carries_idr(annex_b: bytes) -> bool:
    """Whether an access unit holds an IDR slice (NAL type 5)."""
    start = 0
    while True:
        start = annex_b.find(b"\x00\x00\x01", start)
        if start < 0 or start + 3 >= len(annex_b):
            return False
        if annex_b[start + 3] & 0x1F == 5:
            return True
        start += 3


def _planes(frame: av.VideoFrame) -> bytes:
    """A yuv420p frame's planes, packed without row padding, as I420 wants them."""
    width, height = frame.width, frame.height
    sizes = ((width, height), (width // 2, height // 2), (width // 2, height // 2))
    parts = []
    for plane, (w, h) in zip(frame.planes, sizes, strict=True):
        rows = np.frombuffer(memoryview(plane), dtype=np.uint8).reshape(-1, plane.line_size)
        parts.append(rows[:h, :w].tobytes())
    return b"".join(parts)
