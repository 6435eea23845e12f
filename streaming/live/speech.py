"""``speech_started`` and ``speech_ended``, told when the caller gets them, not before.

An utterance reaches the session's timeline a session delay before the caller sees and
hears it (``docs/design/delay.md`` §8). Its marks (:class:`~streaming.live.utterances.Mark`)
wait here until the video frame holding their media time is sent: that frame is the
first (or last) one lip-syncing the utterance, sent together with its audio. So an app
that starts a barge-in timer or a transcript highlight on these events is in step with
what the user perceives. A ``speech_ended`` also waits for the audio track to take the
utterance's last chunk (a slot after its frame, at most), so its ``played_ms`` is what
was sent, not what is about to be, and a ``speech_started`` for the audio track to take
the utterance's first chunk, so an interrupt that follows it always finds some of the
utterance sent (``played_ms`` above 0). The two tracks keep separate 40 ms and 20 ms
slots, so the audio holding a mark can go out a slot after the frame. An audio track
more than :data:`AUDIO_LAG_MS` behind the video (or none: a caller that did not
negotiate audio) is not waited for.

Every utterance that had audio ends with exactly one ``speech_ended``, with
``played_ms`` (its audio handed to the caller's audio track,
:class:`~streaming.live.utterances.Playback`) and ``interrupted``. An interrupt drops
the marks still waiting, since the caller will never get that audio, and ends every
utterance it cut short: their ``speech_ended`` (``interrupted: true``; sent even where
``speech_started`` never went out, with ``played_ms`` 0) in utterance order, then
``interrupted`` listing them, so an app holds every ``speech_ended`` before it reads
``interrupted``.
"""

from __future__ import annotations

from collections import deque
from typing import TypedDict

from streaming.audio_rates import AUDIO_CHUNK_S
from streaming.live.events import SessionEvents
from streaming.live.utterances import Mark, Playback

#: How far the audio track may be behind the video for an ended utterance to wait for its
#: last chunk: the two tracks' slots are one chunk apart at most, when both keep time.
AUDIO_LAG_MS = 100.0


class Played(TypedDict):
    """One cut utterance in ``interrupted``'s ``played``."""

    utterance: int
    played_ms: float


class SpeechEvents:
    """Publishes utterance marks as events when their video frame is sent."""

    def __init__(self, events: SessionEvents, fps: int) -> None:
        self._events = events
        self._frame_ms = 1000 / fps
        self._waiting: deque[Mark] = deque()  # in media-time order, as the timeline made them
        self._speaking: set[int] = set()  # started, not yet ended
        self._sent_until_ms = 0.0  # the end of the last video frame sent
        self._audio_until_ms = 0.0  # the end of the last audio slot taken

    @property
    def speaking(self) -> bool:
        """Whether the caller is getting an utterance now."""
        return bool(self._speaking)

    def schedule(self, marks: list[Mark]) -> None:
        """Marks the timeline just made (their frames are a session delay away)."""
        self._waiting.extend(marks)

    def frame_sent(self, index: int) -> None:
        """Video frame ``index`` went to the caller: publish the marks up to its end."""
        self._sent_until_ms = (index + 1) * self._frame_ms
        self._release()

    @property
    def waiting(self) -> bool:
        """Whether a speech event waits for the audio or video track to send its media."""
        return bool(self._waiting)

    def audio_sent(self, index: int) -> None:
        """The audio track took slot ``index`` (after the ledger counted it): an utterance
        whose frame went out and whose first (or last) chunk this was is told now."""
        self._audio_until_ms = (index + 1) * AUDIO_CHUNK_S * 1000
        if self._waiting:
            self._release()

    def _release(self) -> None:
        until_ms = self._sent_until_ms
        waiting = self._waiting
        while waiting and waiting[0].media_ms < until_ms:
            mark = waiting[0]
            if self._audio_until_ms + AUDIO_LAG_MS >= until_ms:  # the audio track keeps up
                if mark.kind == "start" and self._audio_until_ms <= mark.media_ms:
                    return  # its first chunk goes out in the next audio slot
                if mark.kind == "end" and mark.playback.waiting:
                    return  # its last chunk goes out in the next audio slot
            waiting.popleft()
            if mark.kind == "start":
                self._speaking.add(mark.utterance)
                fields = {"utterance": mark.utterance, "source": mark.source}
                self._events.publish("speech_started", **fields, media_ms=mark.media_ms)
            else:
                self._speaking.discard(mark.utterance)
                self._ended(mark.playback, mark.media_ms, mark.duration_ms, cut=False)

    def played(self, queued_s: float, utterance: int | None) -> None:
        """Queued audio is playing: ``queued_ms`` as it drains, for producers that pace
        themselves on it (the mixer tells at most every 100 ms, and once it is empty)."""
        self._events.publish("queued_ms", queued_ms=round(queued_s * 1000, 1), utterance=utterance)

    def interrupted(self, cut: list[Playback], dropped_s: float) -> list[Played]:
        """An interrupt dropped the queue (``cut``: the utterances it held, read before)
        and silenced what was not sent yet. Ends every utterance it cut short (those with
        audio: ``speech_ended``), then publishes ``interrupted``; returns what each played.

        Their ``media_ms`` is where the call was: the end of the last video frame sent.
        """
        affected = {playback.utterance: playback for playback in cut}
        for mark in self._waiting:  # their audio reached the timeline, its end not the caller
            affected.setdefault(mark.utterance, mark.playback)
        self._waiting.clear()
        self._speaking.clear()
        played: list[Played] = []
        for number in sorted(affected):
            playback = affected[number]
            played_ms = round(playback.played_ms(cut=True), 1)
            if playback.queued:  # one that never had audio gets no events, as it never did
                self._ended(playback, self._sent_until_ms, playback.queued_ms, cut=True)
            played.append({"utterance": number, "played_ms": played_ms})
        self._events.publish(
            "interrupted",
            utterances=[p["utterance"] for p in played],
            dropped_ms=round(dropped_s * 1000, 1),
            played=played,
        )
        return played

    def _ended(self, playback: Playback, media_ms: float, duration_ms: float, *, cut: bool) -> None:
        self._events.publish(
            "speech_ended",
            utterance=playback.utterance,
            source=playback.source,
            media_ms=round(media_ms, 1),
            duration_ms=round(duration_ms, 1),
            played_ms=round(playback.played_ms(cut=cut), 1),
            interrupted=cut,
        )
