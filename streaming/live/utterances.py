"""Which app-brought utterance each pushed sample belongs to, and where it lands on the timeline.

An utterance is one push, one ``say``, or what a WebSocket stream sends between two
``end`` messages (``docs/apps.md``). Its samples wait in the mixer's pushed queue in
order; :class:`UtteranceLedger` keeps the matching runs (utterance, samples) beside that
queue, so when the timeline takes samples into chunk ``c`` it can tell which utterance
started or finished in it, and at what sample of the chunk. Those become :class:`Mark`
values with their media time; the session turns them into ``speech_started`` and
``speech_ended`` events when the video frame holding that time is sent
(:class:`~streaming.live.speech.SpeechEvents`).

An utterance ends when it is closed (a push and a say are closed at once, a stream at its
``end``) and its last sample has been taken; closing one whose samples have all played
ends it at the next chunk. Not thread-safe: the event loop alone uses it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from streaming.audio_rates import AUDIO_CHUNK_S, OUT_RATE

Source = Literal["push", "say", "stream"]
MarkKind = Literal["start", "end"]


@dataclass(frozen=True)
class Mark:
    """An utterance's first or last sample reached the timeline at ``media_ms``."""

    kind: MarkKind
    utterance: int
    source: Source
    media_ms: float
    duration_ms: float  # samples taken so far (the whole utterance for an end)


@dataclass
class _Utterance:
    number: int
    source: Source
    taken: int = 0  # samples the timeline has taken
    closed: bool = False
    started: bool = False


class UtteranceLedger:
    """Runs of queued samples by utterance, in queue order."""

    def __init__(self) -> None:
        self._next_number = 1
        self._open: dict[int, _Utterance] = {}  # not yet ended, by number
        self._runs: deque[list[int]] = deque()  # [utterance, samples left], queue order
        self._pending_end: list[int] = []  # closed with nothing left: end at the next chunk

    def open(self, source: Source) -> int:
        """Start a new utterance; returns its number."""
        number = self._next_number
        self._next_number += 1
        self._open[number] = _Utterance(number, source)
        return number

    def queued(self, number: int, samples: int) -> None:
        """``samples`` of utterance ``number`` went onto the end of the pushed queue."""
        if samples <= 0:
            return
        if self._runs and self._runs[-1][0] == number:
            self._runs[-1][1] += samples
        else:
            self._runs.append([number, samples])

    def close(self, number: int) -> None:
        """Utterance ``number`` has all its samples queued."""
        utterance = self._open.get(number)
        if utterance is None or utterance.closed:
            return
        utterance.closed = True
        if not any(run[0] == number for run in self._runs):
            self._pending_end.append(number)

    @property
    def playing(self) -> int | None:
        """The utterance whose samples the timeline takes next (None: the queue is empty)."""
        return self._runs[0][0] if self._runs else None

    @property
    def opened(self) -> int:
        """Utterances opened so far."""
        return self._next_number - 1

    def is_open(self, number: int) -> bool:
        """Whether ``number`` still takes samples (opened, not closed, not cut)."""
        utterance = self._open.get(number)
        return utterance is not None and not utterance.closed

    def taken(self, count: int, chunk_index: int) -> list[Mark]:
        """The timeline took ``count`` queued samples into chunk ``chunk_index``, from its
        start; returns the utterances that started and ended in it."""
        marks: list[Mark] = []
        chunk_ms = chunk_index * AUDIO_CHUNK_S * 1000
        for number in self._pending_end:
            utterance = self._open.pop(number, None)
            if utterance is not None and utterance.started:  # one with no audio: no events
                marks.append(self._mark("end", utterance, chunk_ms))
        self._pending_end.clear()
        offset = 0
        while count > 0 and self._runs:
            run = self._runs[0]
            utterance = self._open[run[0]]
            n = min(count, run[1])
            if not utterance.started:
                utterance.started = True
                marks.append(self._mark("start", utterance, chunk_ms + offset * 1000 / OUT_RATE))
            utterance.taken += n
            run[1] -= n
            count -= n
            offset += n
            if run[1] == 0:
                self._runs.popleft()
                if utterance.closed and not any(r[0] == utterance.number for r in self._runs):
                    del self._open[utterance.number]
                    marks.append(self._mark("end", utterance, chunk_ms + offset * 1000 / OUT_RATE))
        return marks

    def clear(self) -> list[int]:
        """An interrupt dropped the queue: every utterance not ended is cut. Returns them."""
        cut = sorted(self._open)
        self._open.clear()
        self._runs.clear()
        self._pending_end.clear()
        return cut

    @staticmethod
    def _mark(kind: MarkKind, utterance: _Utterance, media_ms: float) -> Mark:
        duration_ms = utterance.taken * 1000 / OUT_RATE
        return Mark(kind, utterance.number, utterance.source, round(media_ms, 1), duration_ms)
