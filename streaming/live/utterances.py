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
ends it at the next chunk.

The ledger also follows each utterance's audio to the caller (:class:`Playback`): per
chunk made, which utterances' samples it holds, until the audio track takes that chunk
(:meth:`UtteranceLedger.chunk_sent`: those samples were sent) or the chunk is dropped (its
slot skipped, made after its slot, or silenced by an interrupt: never heard). So
``played_ms`` counts the audio handed to the caller's track, to the sample. Those runs
live only between a chunk's making and its slot, a session delay, and never longer than
:data:`MAX_WAITING_CHUNKS`. Not thread-safe: the event loop alone uses it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from streaming.audio_rates import AUDIO_CHUNK_S, OUT_RATE

Source = Literal["push", "say", "stream"]
MarkKind = Literal["start", "end"]

#: The most chunks whose runs wait for their send slot: far more than a session delay
#: (the send buffers keep the delay plus a second), so only a caller whose audio track
#: never pulls (it did not negotiate audio) reaches it; older runs count as not sent.
MAX_WAITING_CHUNKS = 500


@dataclass(eq=False)
class Playback:
    """One utterance's audio on its way to the caller, in samples at 48 kHz: queued by
    the app, in chunks made and waiting for their send slot, and in chunks the audio
    track took (sent). Samples in chunks dropped unsent are in none of the last two."""

    utterance: int
    source: Source
    queued: int = 0
    waiting: int = 0
    sent: int = 0

    @property
    def queued_ms(self) -> float:
        return self.queued * 1000 / OUT_RATE

    def played_ms(self, *, cut: bool) -> float:
        """What the caller was sent of it. A cut one counts only what was sent (the rest
        was silenced). One that ended counts its chunks still waiting too: there are none
        unless its audio track lags or is absent
        (:class:`~streaming.live.speech.SpeechEvents` waits for the last one otherwise)."""
        samples = self.sent if cut else self.sent + self.waiting
        return samples * 1000 / OUT_RATE


@dataclass(frozen=True)
class Mark:
    """An utterance's first or last sample reached the timeline at ``media_ms``."""

    kind: MarkKind
    utterance: int
    source: Source
    media_ms: float
    duration_ms: float  # samples taken so far (the whole utterance for an end)
    playback: Playback = field(compare=False, repr=False)


@dataclass
class _Utterance:
    playback: Playback
    taken: int = 0  # samples the timeline has taken
    closed: bool = False
    started: bool = False

    @property
    def number(self) -> int:
        return self.playback.utterance


_Runs = list[tuple[Playback, int]]  # (utterance, samples) in one chunk


class UtteranceLedger:
    """Runs of queued samples by utterance, in queue order; then by chunk, until sent."""

    def __init__(self) -> None:
        self._next_number = 1
        self._open: dict[int, _Utterance] = {}  # not yet ended, by number
        self._runs: deque[list[int]] = deque()  # [utterance, samples left], queue order
        self._pending_end: list[int] = []  # closed with nothing left: end at the next chunk
        self._chunks: deque[tuple[int, _Runs]] = deque()  # made, waiting for their slot
        self._audio_next = 0  # the next chunk the audio track will take

    def open(self, source: Source) -> int:
        """Start a new utterance; returns its number."""
        number = self._next_number
        self._next_number += 1
        self._open[number] = _Utterance(Playback(number, source))
        return number

    def queued(self, number: int, samples: int) -> None:
        """``samples`` of utterance ``number`` went onto the end of the pushed queue."""
        if samples <= 0:
            return
        self._open[number].playback.queued += samples
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

    @property
    def waiting_chunks(self) -> int:
        """Chunks made with utterance audio in them, not yet taken by the audio track."""
        return len(self._chunks)

    def is_open(self, number: int) -> bool:
        """Whether ``number`` still takes samples (opened, not closed, not cut)."""
        utterance = self._open.get(number)
        return utterance is not None and not utterance.closed

    def unended(self) -> list[Playback]:
        """Every utterance not yet ended on the timeline, in order (what an interrupt cuts,
        with or without audio)."""
        return [self._open[number].playback for number in sorted(self._open)]

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
        runs: _Runs = []
        offset = 0
        while count > 0 and self._runs:
            run = self._runs[0]
            utterance = self._open[run[0]]
            n = min(count, run[1])
            if not utterance.started:
                utterance.started = True
                marks.append(self._mark("start", utterance, chunk_ms + offset * 1000 / OUT_RATE))
            utterance.taken += n
            runs.append((utterance.playback, n))
            run[1] -= n
            count -= n
            offset += n
            if run[1] == 0:
                self._runs.popleft()
                if utterance.closed and not any(r[0] == utterance.number for r in self._runs):
                    del self._open[utterance.number]
                    marks.append(self._mark("end", utterance, chunk_ms + offset * 1000 / OUT_RATE))
        self._made(chunk_index, runs)
        return marks

    def _made(self, chunk_index: int, runs: _Runs) -> None:
        """Chunk ``chunk_index`` holds ``runs``: they wait for its slot, unless that slot
        was already taken (the chunk was made too late to be sent)."""
        if runs and chunk_index >= self._audio_next:
            for playback, n in runs:
                playback.waiting += n
            self._chunks.append((chunk_index, runs))
        while self._chunks and self._chunks[0][0] < chunk_index - MAX_WAITING_CHUNKS:
            self._drop(self._chunks.popleft()[1])

    def first_waiting_chunk(self) -> int | None:
        """The first made chunk that carries an utterance's samples to the caller, if any."""
        return self._chunks[0][0] if self._chunks else None

    def chunk_sent(self, index: int, made: bool) -> None:
        """The audio track took slot ``index``: ``made``, the chunk's packet was there and
        went to the caller (else silence went). Chunks before it were skipped."""
        chunks = self._chunks
        while chunks and chunks[0][0] < index:
            self._drop(chunks.popleft()[1])
        if chunks and chunks[0][0] == index:
            for playback, n in chunks.popleft()[1]:
                playback.waiting -= n
                if made:
                    playback.sent += n
        self._audio_next = max(self._audio_next, index + 1)

    @staticmethod
    def _drop(runs: _Runs) -> None:
        for playback, n in runs:
            playback.waiting -= n

    def clear(self) -> list[int]:
        """An interrupt dropped the queue and silenced the chunks not sent yet: every
        utterance not ended is cut. Returns them."""
        cut = sorted(self._open)
        self._open.clear()
        self._runs.clear()
        self._pending_end.clear()
        while self._chunks:
            self._drop(self._chunks.popleft()[1])
        return cut

    @staticmethod
    def _mark(kind: MarkKind, utterance: _Utterance, media_ms: float) -> Mark:
        playback = utterance.playback
        duration_ms = utterance.taken * 1000 / OUT_RATE
        return Mark(
            kind, playback.utterance, playback.source, round(media_ms, 1), duration_ms, playback
        )
