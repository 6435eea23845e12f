"""A Pipecat video service that gives a voice agent a lipstream avatar.

Install with ``pip install 'lipstream-client[pipecat]'``. Put
:class:`LipstreamVideoService` right after the text-to-speech service: it takes the
bot's speech, has the avatar say it, and pushes the avatar's lip-synced video and
(delayed) voice on to the output transport, which sends both::

    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker

    from lipstream_client.pipecat import LipstreamVideoService

    avatar = LipstreamVideoService(
        base_url="https://avatars.example.com", avatar="demo", token=session_jwt
    )
    pipeline = Pipeline([
        transport.input(), stt, user_aggregator, llm, tts,
        avatar,  # the TTS audio stops here; the avatar's video and voice go on
        transport.output(), assistant_aggregator,
    ])
    worker = PipelineWorker(pipeline, params=PipelineParams(audio_out_sample_rate=24000))

    @avatar.event_handler("on_speech_started")
    async def on_speech_started(service, event):  # the avatar's lips start moving
        ...

The transport needs ``audio_out_enabled=True, video_out_enabled=True,
video_out_is_live=True, video_out_framerate=25`` and the avatar's size
(``video_out_width=1280, video_out_height=720`` for the demo avatar), or pass
``video_size`` here to scale the frames once, before the transport would.

Frames in and out:

- set-up (before the ``StartFrame`` passes, as Pipecat connects services): a WebRTC
  call to the avatar with receive-only audio and video, and the session's audio stream
  (docs/apps.md) opened at the TTS rate (``sample_rate``, else the pipeline's
  ``audio_out_sample_rate``), ``s16le`` mono;
- ``TTSAudioRawFrame``: streamed to lipstream as it comes (the avatar starts speaking
  on the first chunk), never passed on; a frame at another accepted rate reopens the
  stream at that rate, a rate lipstream does not take is refused with an error frame;
- ``TTSStoppedFrame``: ends the utterance (``end``), and is passed on;
- ``InterruptionFrame``: drops the audio not sent yet and sends ``interrupt``, so the
  avatar goes idle at once; passed on;
- ``EndFrame``: sends what is left, waits (at most ``end_timeout_s``) until the avatar
  has said it, then hangs up; ``CancelFrame`` hangs up at once;
- out: every received video frame as an ``OutputImageRawFrame`` (RGB) and the received
  voice as ``SpeechOutputAudioRawFrame`` (mono, at the pipeline's output rate), each
  with ``metadata["lipstream_media_ms"]`` (and ``"lipstream_index"``, the session frame
  number, and ``"lipstream_received_at"``, ``time.monotonic()`` on arrival, on video).
  The voice is continuous (silence while the avatar is idle), so the transport tells
  when the bot speaks from its loudness, as for Pipecat's other avatar services.

Events (``@service.event_handler(name)``, called with the service and the event dict
of docs/apps.md): ``on_speech_started``, ``on_speech_ended`` (with ``played_ms``, what
the user was sent of the utterance, and ``interrupted``), ``on_interrupted`` (with
``played``, per cut utterance), ``on_avatar_changed``, ``on_idle_clip_changed``.

Playback positions: each utterance's ``speech_ended`` (exactly one, cut ones included,
before their ``interrupted``) is also pushed downstream as a
:class:`LipstreamSpeechEndedFrame` (``utterance``, ``played_ms``, ``duration_ms``,
``interrupted``): what a context aggregator needs to keep only what the user heard of a
reply the user barged into. It is a system frame, so an interruption does not drop it.

Mid-call: ``await service.switch_avatar("other")`` shows another avatar (same fps and
audio features; the speech goes on lip-synced, ``on_avatar_changed`` when its first
frame is sent; refusals raise the client's typed errors and leave the call as it was)
and ``await service.set_idle_clip("thinking")`` picks what the avatar plays while
silent. An avatar of another size changes the frames' size, unless ``video_size``
fixes it (the transport's ``video_out_width``/``_height`` do not follow).

Every queue is bounded: the audio waiting to be sent (``outbox_size`` chunks; a full
one holds the pipeline back, since a TTS makes audio faster than it plays) and the
call's receive queues (``queues``, dropping the oldest frames when the pipeline lags).
This module logs with :mod:`logging`, not Pipecat's loguru.

Why one module of about 560 lines (a third of them this docstring, the integration's
manual): the service's four tasks (sending, stream events, video, voice) share the
call, the stream and the utterance counts that an interruption and an ``EndFrame`` act
on, in one class.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import av
import numpy as np

try:
    from pipecat.frames.frames import (
        CancelFrame,
        EndFrame,
        Frame,
        InterruptionFrame,
        OutputImageRawFrame,
        SpeechOutputAudioRawFrame,
        StartFrame,
        SystemFrame,
        TTSAudioRawFrame,
        TTSStoppedFrame,
    )
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
    from pipecat.services.ai_service import AIService
    from pipecat.services.settings import ServiceSettings
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"lipstream_client.pipecat needs Pipecat ({exc}): pip install 'lipstream-client[pipecat]'"
    ) from exc

from lipstream_client.audio_stream import AudioStream
from lipstream_client.call import Call, connect
from lipstream_client.errors import LipstreamError, StreamClosed
from lipstream_client.models import (
    AudioFrame,
    AvatarSwitched,
    CallStats,
    Event,
    IceServer,
    IdleClipSet,
    QueueSizes,
    VideoFrame,
)
from lipstream_client.pcm import STREAM_RATES

logger = logging.getLogger(__name__)

#: The events handed to Pipecat event handlers, by lipstream event type.
EVENT_HANDLERS = {
    "speech_started": "on_speech_started",
    "speech_ended": "on_speech_ended",
    "interrupted": "on_interrupted",
    "avatar_changed": "on_avatar_changed",
    "idle_clip_changed": "on_idle_clip_changed",
}


@dataclass
class LipstreamSpeechEndedFrame(SystemFrame):
    """An utterance ended for the user: all of it played, or cut by an interruption.

    ``played_ms`` is how much of it the user was sent (0 for one cut before it
    started), ``duration_ms`` its whole length when the server reports it; pushed
    downstream once per utterance, in the order the server numbered them.
    """

    utterance: int
    played_ms: float
    duration_ms: float | None
    interrupted: bool

    @classmethod
    def from_event(cls, event: Event) -> LipstreamSpeechEndedFrame:
        duration = event.get("duration_ms")
        duration_ms = float(duration) if duration is not None else None
        played = event.get("played_ms")  # a server before playback positions: all of it
        return cls(
            utterance=int(event["utterance"]),
            played_ms=float(played) if played is not None else duration_ms or 0.0,
            duration_ms=duration_ms,
            interrupted=bool(event.get("interrupted", False)),
        )


@dataclass(frozen=True)
class _Chunk:
    """TTS audio waiting to be sent: mono ``s16le`` at ``rate``."""

    pcm: bytes
    rate: int


#: What the outbox holds: audio, or ``None`` for the end of an utterance.
_Item = _Chunk | None


class LipstreamVideoService(AIService):
    """Drives a lipstream avatar with the bot's TTS audio; pushes its video and voice.

    ``base_url``, ``avatar`` and ``token`` are :func:`lipstream_client.connect`'s.
    ``sample_rate`` is the rate of the TTS audio (default: the pipeline's
    ``audio_out_sample_rate``, which Pipecat's TTS services use); it must be one the
    server takes (16000, 22050, 24000, 44100, 48000). ``video_size`` scales the frames
    (default: the avatar's size). ``max_ahead_ms`` bounds how far ahead of the avatar
    the audio is sent (the server's buffer bounds it too); ``end_timeout_s`` is how long
    an ``EndFrame`` waits for the avatar to finish speaking.
    """

    def __init__(
        self,
        *,
        base_url: str,
        avatar: str,
        token: str | None = None,
        sample_rate: int | None = None,
        video_size: tuple[int, int] | None = None,
        ice_servers: Sequence[IceServer] | None = None,
        connect_timeout_s: float = 30.0,
        queues: QueueSizes | None = None,
        outbox_size: int = 250,
        max_ahead_ms: float = 2000.0,
        end_timeout_s: float = 10.0,
        **kwargs: Any,
    ) -> None:
        if sample_rate is not None and sample_rate not in STREAM_RATES:
            raise ValueError(f"sample_rate must be one of {STREAM_RATES}, got {sample_rate}")
        super().__init__(settings=ServiceSettings(model=None), **kwargs)
        self._base_url = base_url
        self._avatar = avatar
        self._token = token
        self._sample_rate = sample_rate
        self._video_size = video_size
        self._ice_servers = ice_servers
        self._connect_timeout_s = connect_timeout_s
        self._queues = queues or QueueSizes()
        self._max_ahead_ms = max_ahead_ms
        self._end_timeout_s = end_timeout_s
        self._out_rate = 24000
        self._call: Call | None = None
        self._stream: AudioStream | None = None
        self._outbox: asyncio.Queue[_Item] = asyncio.Queue(outbox_size)
        self._sender: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._executor: ThreadPoolExecutor | None = None
        # Held while a stream opens: an interrupt waits for it rather than cancel a
        # handshake half-way (its socket would keep the session's one stream busy).
        self._opening = asyncio.Lock()
        self._closing = False
        self._utterance_open = False
        self._refused_rates: set[int] = set()
        self._stream_failed = False
        # The last utterance the server queued and the last it finished (ended or cut):
        # an EndFrame waits until they meet. Until the server numbers an utterance whose
        # audio went out (a queued_ms above this), the wait also goes on.
        self._last_queued = 0
        self._last_done = 0
        self._unnumbered_above: int | None = None
        self._sending_utterance = False
        self._progress = asyncio.Event()
        for name in EVENT_HANDLERS.values():
            self._register_event_handler(name)

    # -- what a pipeline may read -----------------------------------------------------

    @property
    def call(self) -> Call | None:
        """The call to the avatar, once set up; ``None`` before and after."""
        return self._call

    @property
    def stats(self) -> CallStats:
        """Frames received from the avatar, and those dropped because the pipeline lagged."""
        return self._call.stats if self._call is not None else CallStats()

    @property
    def avatar(self) -> str:
        """The avatar the call shows (or will, once a switch answered)."""
        return self._avatar

    # -- mid-call control -------------------------------------------------------------

    async def switch_avatar(self, avatar: str) -> AvatarSwitched:
        """Show ``avatar`` from now on (:meth:`lipstream_client.Call.switch_avatar`):
        returns once it is loaded and the switch scheduled; the speech goes on."""
        switched = await self._live_call().switch_avatar(avatar)
        self._avatar = switched.avatar
        logger.info(
            "%s: avatar %s -> %s from frame %s", self, switched.previous, avatar, switched.frame
        )
        return switched

    async def set_idle_clip(self, clip: str) -> IdleClipSet:
        """Play the avatar's idle clip ``clip`` while it is silent."""
        return await self._live_call().set_idle_clip(clip)

    def _live_call(self) -> Call:
        if self._call is None:
            raise StreamClosed(
                f"{self}: there is no call to the avatar (not set up yet, or ended)",
                code="stream_closed",
            )
        return self._call

    # -- lifetime ---------------------------------------------------------------------

    # Pipecat's FrameProcessor itself narrows BaseObject.setup(task_manager) so.
    async def setup(self, setup: FrameProcessorSetup) -> None:  # type: ignore[override]
        """Call the avatar and open the audio stream (Pipecat sets services up
        concurrently, before the ``StartFrame`` passes)."""
        await super().setup(setup)
        self._out_rate = setup.audio_out_sample_rate
        self._call = await connect(
            self._base_url,
            self._avatar,
            token=self._token,
            receive_audio=True,
            data_channel=False,
            ice_servers=self._ice_servers,
            timeout_s=self._connect_timeout_s,
            queues=self._queues,
        )
        logger.info("%s: calling avatar %s, session %s", self, self._avatar, self._call.session_id)
        rate = self._sample_rate or setup.audio_out_sample_rate
        if rate in STREAM_RATES:
            await self._open_stream(rate)

    async def start(self, frame: StartFrame) -> None:
        """Start sending TTS audio."""
        await super().start(frame)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lipstream-rgb")
        self._sender = self.create_task(self._send_loop(), "lipstream-send")

    async def stop(self, frame: EndFrame) -> None:
        """Let the avatar say what it was given (at most ``end_timeout_s``), then hang up."""
        await super().stop(frame)
        try:
            async with asyncio.timeout(self._end_timeout_s):
                await self._finish_speaking()
        except TimeoutError:
            logger.warning(
                "%s: the avatar had not finished speaking after %.0f s; hanging up",
                self,
                self._end_timeout_s,
            )
        await self._shut_down()

    async def _finish_speaking(self) -> None:
        if self._sender is None:
            return
        if self._utterance_open:
            self._utterance_open = False
            await self._outbox.put(None)
        await self._outbox.join()
        while self._unnumbered_above is not None or self._last_done < self._last_queued:
            stream = self._stream
            if stream is None or stream.closed:
                return
            self._progress.clear()
            await self._progress.wait()

    async def cancel(self, frame: CancelFrame) -> None:
        """Hang up at once."""
        await super().cancel(frame)
        await self._shut_down()

    async def cleanup(self) -> None:
        """Release everything (also when the pipeline ended without an End/CancelFrame)."""
        await super().cleanup()  # type: ignore[no-untyped-call]  # Pipecat leaves it bare
        await self._shut_down()

    async def _shut_down(self) -> None:
        self._closing = True
        for task in [t for t in (self._sender, *self._tasks) if t is not None]:
            await self.cancel_task(task)
        self._sender = None
        self._tasks = []
        if self._stream is not None:
            await self._stream.close()
            self._stream = None
        if self._call is not None:
            await self._call.hang_up()
            logger.info("%s: hung up (%s)", self, self._call.stats)
            self._call = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # -- frames in --------------------------------------------------------------------

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Stream TTS audio to the avatar; pass every other frame on."""
        await super().process_frame(frame, direction)
        downstream = direction == FrameDirection.DOWNSTREAM
        if downstream and isinstance(frame, TTSAudioRawFrame):
            await self._queue_audio(frame)
            return
        if downstream and isinstance(frame, TTSStoppedFrame):
            if self._utterance_open:
                self._utterance_open = False
                await self._outbox.put(None)
        elif isinstance(frame, InterruptionFrame):
            await self._interrupt()
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame) and self._call is not None:
            # After the StartFrame went on: nothing downstream takes frames before it.
            self._start_receiving(self._call)

    async def _queue_audio(self, frame: TTSAudioRawFrame) -> None:
        rate = frame.sample_rate
        if rate not in STREAM_RATES:
            if rate not in self._refused_rates:
                self._refused_rates.add(rate)
                await self.push_error(
                    f"{self}: lipstream takes TTS audio at {STREAM_RATES} Hz, not {rate} Hz: "
                    "set the TTS service's sample_rate (or the pipeline's audio_out_sample_rate)"
                )
            return
        pcm = frame.audio
        if frame.num_channels > 1:
            samples = np.frombuffer(pcm, "<i2").reshape(-1, frame.num_channels)
            pcm = samples.mean(axis=1).astype("<i2").tobytes()
        self._utterance_open = True
        await self._outbox.put(_Chunk(pcm, rate))

    async def _interrupt(self) -> None:
        """Drop the audio not sent yet and tell the server to drop what it queued."""
        if self._sender is not None:
            async with self._opening:
                await self.cancel_task(self._sender)
        while not self._outbox.empty():
            self._outbox.get_nowait()
            self._outbox.task_done()
        self._utterance_open = self._sending_utterance = False
        self._unnumbered_above = None  # what was sent is numbered, then named as cut
        try:
            await self._send_interrupt()
        except (LipstreamError, OSError) as exc:
            logger.warning("%s: the interrupt did not reach the server: %s", self, exc)
        if self._sender is not None:
            self._sender = self.create_task(self._send_loop(), "lipstream-send")

    async def _send_interrupt(self) -> None:
        stream = self._stream
        if stream is not None and not stream.closed:
            for _ in range(2):
                try:
                    await stream.interrupt()
                    return
                except StreamClosed:
                    break
                except LipstreamError as exc:
                    # The stream raises an earlier message's error once, before sending:
                    # the second try sends the interrupt.
                    logger.warning("%s: the audio stream reported: %s", self, exc)
        if self._call is not None:
            await self._call.interrupt()

    # -- sending ----------------------------------------------------------------------

    async def _send_loop(self) -> None:
        while True:
            item = await self._outbox.get()
            try:
                if item is None:
                    self._sending_utterance = False
                    if self._stream is not None and not self._stream.closed:
                        await self._stream.end()
                else:
                    if not self._sending_utterance:
                        self._sending_utterance = True
                        self._unnumbered_above = self._last_queued
                    await self._send(item)
            except StreamClosed as exc:
                if not self._stream_failed:
                    self._stream_failed = True
                    await self.push_error(
                        f"{self}: the avatar's audio stream closed: {exc}",
                        force_treat_as_permanent=True,
                    )
            except (LipstreamError, OSError) as exc:
                logger.warning("%s: sending audio failed: %s", self, exc)
            finally:
                self._outbox.task_done()

    async def _send(self, chunk: _Chunk) -> None:
        stream = self._stream
        if stream is None or stream.rate != chunk.rate:
            stream = await self._open_stream(chunk.rate)
        try:
            await stream.send(chunk.pcm)
        except StreamClosed:
            raise
        except LipstreamError as exc:
            # An earlier message's error, raised before this chunk went out: send it again.
            logger.warning("%s: the audio stream reported: %s", self, exc)
            await stream.send(chunk.pcm)

    async def _open_stream(self, rate: int) -> AudioStream:
        """The audio stream at ``rate``, closing one at another rate first (its open
        utterance still plays)."""
        async with self._opening:
            if self._call is None:
                raise StreamClosed("the call to the avatar has ended", code="stream_closed")
            if self._stream is not None:
                logger.info("%s: TTS audio now at %d Hz; reopening the audio stream", self, rate)
                await self._stream.close()
            self._stream = None
            stream = self._call.stream_audio(
                format="s16le", rate=rate, max_ahead_ms=self._max_ahead_ms
            )
            await stream.open()
            self._stream = stream
        self._tasks.append(self.create_task(self._read_events(stream), "lipstream-events"))
        return stream

    async def _read_events(self, stream: AudioStream) -> None:
        async for event in stream.events():
            await self._on_event(event)
        self._progress.set()  # a closed stream will report nothing more

    async def _on_event(self, event: Event) -> None:
        kind = event.get("type")
        if kind == "queued_ms" and isinstance(event.get("utterance"), int):
            self._last_queued = max(self._last_queued, event["utterance"])
            if self._unnumbered_above is not None and self._last_queued > self._unnumbered_above:
                self._unnumbered_above = None
        elif kind == "speech_ended":
            self._last_done = max(self._last_done, int(event["utterance"]))
            await self.push_frame(LipstreamSpeechEndedFrame.from_event(event))
        elif kind == "interrupted":
            self._last_done = max([self._last_done, *map(int, event.get("utterances", []))])
        elif kind == "error":
            logger.warning("%s: the server refused a message: %s", self, event)
        if kind in EVENT_HANDLERS:
            await self._call_event_handler(EVENT_HANDLERS[kind], event)
        self._progress.set()

    # -- frames out -------------------------------------------------------------------

    def _start_receiving(self, call: Call) -> None:
        self._tasks.append(self.create_task(self._push_video(call), "lipstream-video"))
        self._tasks.append(self.create_task(self._push_audio(call), "lipstream-audio"))

    async def _push_video(self, call: Call) -> None:
        loop = asyncio.get_running_loop()
        async for received in call.video_frames():
            executor = self._executor
            if executor is None:
                return
            # A 720p frame takes milliseconds to convert: off the event loop.
            rgb, size = await loop.run_in_executor(executor, self._to_rgb, received)
            image = OutputImageRawFrame(image=rgb, size=size, format="RGB")
            image.metadata.update(
                lipstream_index=received.index,
                lipstream_media_ms=received.media_ms,
                lipstream_received_at=received.received_at,
            )
            await self.push_frame(image)
        if not self._closing:
            await self.push_error(
                f"{self}: the call to the avatar ended ({call.connection_state})",
                force_treat_as_permanent=True,
            )

    def _to_rgb(self, received: VideoFrame) -> tuple[bytes, tuple[int, int]]:
        width, height = self._video_size or (received.frame.width, received.frame.height)
        rgb = received.frame.reformat(width=width, height=height, format="rgb24").to_ndarray()
        return rgb.tobytes(), (width, height)

    async def _push_audio(self, call: Call) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=self._out_rate)
        received: AudioFrame
        async for received in call.audio_frames():
            for out in resampler.resample(received.frame):
                voice = SpeechOutputAudioRawFrame(
                    audio=out.to_ndarray().tobytes(), sample_rate=self._out_rate, num_channels=1
                )
                voice.metadata["lipstream_media_ms"] = received.media_ms
                await self.push_frame(voice)


__all__ = ["LipstreamSpeechEndedFrame", "LipstreamVideoService"]
