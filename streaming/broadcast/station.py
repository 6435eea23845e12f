"""The sender of a session no caller owns (``POST /sessions``, ``docs/design/broadcast.md`` §21).

A call's tracks are pulled by its caller's peer connection, slot by slot. A callerless
session has no such peer, so its :class:`Station` pulls them itself: the same
:class:`~streaming.webrtc.tracks.AvatarVideoTrack` and
:class:`~streaming.webrtc.tracks.AvatarAudioTrack` on the session's clock, the video
encoded once by the station's own H.264 encoder at the avatar's full quality, and each
frame published to the session's feed (the session's video source does that,
:class:`~streaming.broadcast.feed.PublishedVideo`) for its viewers. Taking each audio
slot is what tells the session's utterances and speech events what was "sent", as a
caller's track does, so ``speech_started``, ``played_ms`` and the rest are the same
with or without anyone watching.

To the session it stands where a caller's :class:`~streaming.webrtc.peer.Peer` would:
it answers what the session reads of its peer (state, what was sent, the encoder's
bitrate) and is closed with it. A session whose audio comes from a WHIP publisher has
both: the publisher's receive-only ``Peer`` (the station's ``receiver``, whose state
and close are the station's) and the station pulling the tracks.
"""

from __future__ import annotations

from typing import Any, Protocol

import av

from streaming.broadcast.feed import VIEWER_KEYFRAME_INTERVAL_S
from streaming.webrtc.peer import CallTasks, Peer, PeerMedia, PeerState, SentMedia
from streaming.webrtc.tracks import AvatarAudioTrack, AvatarVideoTrack, pull
from streaming.webrtc.video_encoder import EncoderFactory, LipstreamH264Encoder


class MediaSink(Protocol):
    """Where a station's media goes besides its viewers (a LiveKit room,
    ``docs/design/livekit.md``): each video slot's packet (its RTP payloads in
    ``opaque``; none: nothing sent for the slot) and each 20 ms Opus packet, as pulled."""

    @property
    def kind(self) -> str: ...

    async def video(self, packet: av.Packet[Any]) -> None: ...

    async def audio(self, packet: av.Packet[Any]) -> None: ...

    async def close(self) -> None: ...


class Station:
    """A callerless session's sender (module doc); :meth:`start` starts its tasks."""

    #: What a session reads of a caller's peer, answered for a session without one.
    link = None
    video_codec = "video/H264"

    def __init__(
        self,
        session_id: str,
        media: PeerMedia,
        encoders: EncoderFactory,
        tasks: CallTasks,
        *,
        receiver: Peer | None = None,
        sink: MediaSink | None = None,
        encode: bool = True,
    ) -> None:
        self.session_id = session_id
        self.receiver = receiver
        self.sink = sink
        self._tasks = tasks
        self.encoder: LipstreamH264Encoder = encoders.create(*media.frame_size, media.fps)
        self.encoder.keyframe_interval_s = VIEWER_KEYFRAME_INTERVAL_S
        self._video = AvatarVideoTrack(media.clock, media.fps, media.video, tasks.fail)
        if encode:  # else its frames go to the sink as arrays (a LiveKit room encodes them)
            self._video.encode_with(self.encoder)
        self._audio = AvatarAudioTrack(media.clock, media.audio, tasks.fail)
        self._closed = False

    def start(self) -> None:
        """Pull both tracks at their slots from now on (the session's clock starts)."""
        sink = self.sink
        self._tasks.spawn("encode", pull(self._video, None if sink is None else sink.video))
        self._tasks.spawn("audio send", pull(self._audio, None if sink is None else sink.audio))

    @property
    def state(self) -> PeerState:
        if self.receiver is not None:
            return self.receiver.state
        return PeerState.CLOSED if self._closed else PeerState.CONNECTED

    @property
    def answer_sdp(self) -> str:
        """The answer to the publisher's offer ("" without a publisher)."""
        return "" if self.receiver is None else self.receiver.answer_sdp

    @property
    def has_caller(self) -> bool:
        """Whether a publisher sends the session's audio (WHIP)."""
        return self.receiver is not None

    @property
    def kind(self) -> str:
        """What the session is, as ``GET /sessions`` shows it: ``whip`` (a publisher's
        audio), the sink's kind (``livekit``), or ``callerless``."""
        if self.receiver is not None:
            return "whip"
        return "callerless" if self.sink is None else self.sink.kind

    @property
    def target_bitrate_bps(self) -> int:
        return self.encoder.target_bitrate

    def sent(self) -> SentMedia:
        video, audio = self._video, self._audio
        return SentMedia(
            frames_sent=video.frames_sent,
            frames_skipped=video.frames_skipped,
            video_next=video.next_index,
            audio_next=audio.next_index,
            audio_skipped=audio.chunks_skipped,
        )

    async def flush_events(self, timeout_s: float) -> None:
        """Nothing to flush: a callerless session's events go out on its streams."""

    async def close(self) -> None:
        """Stop both tracks (their pulling tasks end with the session's), and close the
        publisher's connection or the sink, if there is one."""
        self._video.stop()
        self._audio.stop()
        self._closed = True
        if self.receiver is not None:
            await self.receiver.close()
        if self.sink is not None:
            await self.sink.close()
