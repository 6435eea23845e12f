"""``speech_started`` and ``speech_ended``, told when the caller gets them, not before.

An utterance reaches the session's timeline a session delay before the caller sees and
hears it (``docs/architecture.md`` §8). Its marks (:class:`~streaming.live.utterances.Mark`)
wait here until the video frame holding their media time is sent: that frame is the
first (or last) one lip-syncing the utterance, sent together with its audio. So an app
that starts a barge-in timer or a transcript highlight on these events is in step with
what the user perceives. An interrupt drops the marks still waiting, since the caller
will never get that audio, and says which utterances it cut.
"""

from __future__ import annotations

from collections import deque

from streaming.live.events import SessionEvents
from streaming.live.utterances import Mark


class SpeechEvents:
    """Publishes utterance marks as events when their video frame is sent."""

    def __init__(self, events: SessionEvents, fps: int) -> None:
        self._events = events
        self._frame_ms = 1000 / fps
        self._waiting: deque[Mark] = deque()  # in media-time order, as the timeline made them
        self._speaking: set[int] = set()  # started, not yet ended

    @property
    def speaking(self) -> bool:
        """Whether the caller is getting an utterance now."""
        return bool(self._speaking)

    def schedule(self, marks: list[Mark]) -> None:
        """Marks the timeline just made (their frames are a session delay away)."""
        self._waiting.extend(marks)

    def frame_sent(self, index: int) -> None:
        """Video frame ``index`` went to the caller: publish the marks up to its end."""
        until_ms = (index + 1) * self._frame_ms
        waiting = self._waiting
        while waiting and waiting[0].media_ms < until_ms:
            mark = waiting.popleft()
            fields = {"utterance": mark.utterance, "source": mark.source, "media_ms": mark.media_ms}
            if mark.kind == "start":
                self._speaking.add(mark.utterance)
                self._events.publish("speech_started", **fields)
            else:
                self._speaking.discard(mark.utterance)
                duration = round(mark.duration_ms, 1)
                self._events.publish("speech_ended", **fields, duration_ms=duration)

    def played(self, queued_s: float, utterance: int | None) -> None:
        """Queued audio is playing: ``queued_ms`` as it drains, for producers that pace
        themselves on it (the mixer tells at most every 100 ms, and once it is empty)."""
        self._events.publish("queued_ms", queued_ms=round(queued_s * 1000, 1), utterance=utterance)

    def interrupted(self, cut: list[int], dropped_s: float) -> list[int]:
        """An interrupt dropped the queue (``cut``: utterances it held) and silenced what was
        not sent yet: publish ``interrupted`` with every utterance it cut short; return them."""
        affected = sorted(set(cut) | self._speaking | {mark.utterance for mark in self._waiting})
        self._waiting.clear()
        self._speaking.clear()
        self._events.publish(
            "interrupted", utterances=affected, dropped_ms=round(dropped_s * 1000, 1)
        )
        return affected
