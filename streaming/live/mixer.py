"""A session's audio timeline: 48 kHz mono, one 20 ms chunk per tick, from every source.

Sources are the caller's WebRTC microphone (a short jitter buffer) and audio pushed over
HTTP or spoken by text-to-speech (a queue played in real time). Each tick mixes what is
there into one chunk; silence fills the gaps, so the timeline never stalls and the
avatar idles when nobody speaks. Both buffers are bounded: a push beyond the queue
limit is refused, and the microphone's buffer keeps only what the network's jitter
needs (``docs/design/audio-in.md`` §2): the lowest level it held at the ticks of the last
:data:`INBOUND_WINDOW_TICKS` was never needed, so beyond a chunk and
:data:`INBOUND_SLACK_MS` it is skipped, oldest first. After a stall (the event loop or
the caller's network held packets back, then delivered them at once) the call is back
at its configured delay within about two windows, by skipping the caller's audio, not
by keeping it queued; video follows the same chunks, so lips and sound skip together.

A microphone packet that comes after its tick, while the caller is speaking, would leave
a hole of silence in the middle of a word: a click in the voice sent back, and a frame
whose mouth the model closes. So that tick takes the missing samples from the caller's
decoder instead (Opus's packet-loss concealment, :meth:`AudioMixer.set_concealment`),
at most :data:`MAX_CONCEALED_MS` in a row, and as much of the late audio, when it comes,
is skipped: it was played already, made up (``docs/design/audio-in.md`` §2). A caller
that was silent, or paused (Opus DTX sends nothing), gets silence as before.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from streaming.audio_in.exceptions import AudioQueueFullError
from streaming.audio_rates import CHUNK_SAMPLES, OUT_RATE
from streaming.live.utterances import Mark, UtteranceLedger

logger = logging.getLogger(__name__)

#: Microphone audio the buffer may hold at a tick beyond the chunk it gives: one packet
#: interval, for a packet that arrives just after its tick.
INBOUND_SLACK_MS = 20.0
#: While pushed audio plays, ``on_played`` hears the queue's level every this many
#: chunks (100 ms), and when it runs dry: producers pace themselves on it.
PLAYED_EVERY_CHUNKS = 5
#: Ticks (20 ms each) over which the buffer's lowest level is watched before the excess
#: is skipped: 0.5 s, so a stall's backlog is gone within about 1 s.
INBOUND_WINDOW_TICKS = 25
#: The most of the caller's voice made up in a row for packets that come late (module
#: doc); a longer gap is silence. libopus's concealment fades out over about as long.
MAX_CONCEALED_MS = 100.0
#: Audio made up is owed for this long: what the caller sends later than that is new
#: (a caller whose Opus DTX paused sends its next packet 400 ms on).
OWED_FOR_S = 0.2

#: Makes up ``n`` samples of the caller's audio after what it sent last (None: it cannot).
Concealment = Callable[[int], "np.ndarray | None"]


class _SampleQueue:
    """FIFO of float32 samples in blocks; taking is O(blocks touched)."""

    def __init__(self) -> None:
        self._blocks: deque[np.ndarray] = deque()
        self._offset = 0  # samples already taken from the first block
        self.size = 0
        self.taken = 0  # samples taken (or dropped) since the start

    def put(self, samples: np.ndarray) -> None:
        if len(samples):
            self._blocks.append(samples)
            self.size += len(samples)

    def take_into(self, out: np.ndarray) -> int:
        """Add up to ``len(out)`` queued samples into ``out``; return how many."""
        filled = 0
        while filled < len(out) and self._blocks:
            block = self._blocks[0]
            n = min(len(out) - filled, len(block) - self._offset)
            out[filled : filled + n] += block[self._offset : self._offset + n]
            filled += n
            self._offset += n
            if self._offset == len(block):
                self._blocks.popleft()
                self._offset = 0
        self.size -= filled
        self.taken += filled
        return filled

    def snapshot(self) -> np.ndarray:
        """A copy of every queued sample, in order."""
        parts = [self._blocks[0][self._offset :], *list(self._blocks)[1:]] if self._blocks else []
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def drop_oldest(self, count: int) -> None:
        self.take_into(np.zeros(count, dtype=np.float32))

    def clear(self) -> int:
        dropped = self.size
        self._blocks.clear()
        self._offset = 0
        self.size = 0
        return dropped


class AudioMixer:
    """Mixes microphone and pushed audio into 20 ms chunks at 48 kHz (float32 mono).

    ``on_marks`` gets the utterances that started or ended in each chunk made
    (:class:`~streaming.live.utterances.UtteranceLedger`); ``on_played`` the seconds of
    pushed audio still queued as it plays (see :data:`PLAYED_EVERY_CHUNKS`), and the
    utterance playing.
    """

    def __init__(
        self,
        *,
        max_inbound_ms: float = 200.0,
        max_pushed_s: float = 120.0,
        inbound_slack_ms: float = INBOUND_SLACK_MS,
        inbound_window_ticks: int = INBOUND_WINDOW_TICKS,
        on_marks: Callable[[list[Mark]], None] | None = None,
        on_played: Callable[[float, int | None], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inbound = _SampleQueue()
        self.utterances = UtteranceLedger()
        self._on_marks = on_marks
        self._on_played = on_played
        self._chunks_made = 0
        self._playing_chunks = 0
        self._pushed = _SampleQueue()
        self._max_inbound = int(OUT_RATE * max_inbound_ms / 1000)
        self._max_pushed = int(OUT_RATE * max_pushed_s)
        self._keep_inbound = CHUNK_SAMPLES + int(OUT_RATE * inbound_slack_ms / 1000)
        self._window_ticks = inbound_window_ticks
        self._ticks = 0
        self._lowest = self._max_inbound  # the inbound level's minimum in this window
        self.inbound_dropped_samples = 0  # microphone audio skipped to hold the delay
        self.underruns = 0  # ticks where the microphone had less than a chunk
        self._concealment: Concealment | None = None
        self._max_concealed = int(OUT_RATE * MAX_CONCEALED_MS / 1000)
        self._voiced = False  # the caller's last audio was not silence
        self._owed = 0  # samples made up, to skip of the late audio when it comes
        self._owed_at = 0.0
        self.inbound_concealed_samples = 0  # microphone audio made up for late packets
        self._clock = clock
        self._arrived: deque[tuple[int, float]] = deque()  # (samples fed in all, when)
        self._fed = 0
        #: When the first microphone sample of each of the last chunks arrived, by chunk.
        self.chunk_arrivals: dict[int, float] = {}
        #: Called when audio that is not all zeros arrives from the caller, and for every
        #: push: the timeline, which may be sleeping through silence, listens here.
        self.on_sound: Callable[[], None] | None = None
        self._pushed_from = 0  # the first chunk that may take pushed audio

    def set_concealment(self, concealment: Concealment | None) -> None:
        """Where a late packet's samples are made up from (module doc): the caller's
        decoder, once the call knows it decodes the caller's audio itself."""
        self._concealment = concealment

    def feed_inbound(self, samples: np.ndarray) -> None:
        """Add microphone samples (float32 mono 48 kHz) as they arrive."""
        inbound = np.asarray(samples, dtype=np.float32)
        if self._owed:
            inbound = self._pay_owed(inbound)
        voiced = bool(inbound.any())
        if len(inbound):
            self._voiced = voiced
        self._inbound.put(inbound)
        if self.on_sound is not None and voiced:
            self.on_sound()
        self._fed += len(inbound)  # what the queue holds: a late packet's made-up part not
        self._arrived.append((self._fed, self._clock()))
        while len(self._arrived) > 64:
            self._arrived.popleft()
        self._drop_inbound(self._inbound.size - self._max_inbound)

    def _arrival_of_next_inbound(self) -> float | None:
        """When the oldest microphone sample still queued arrived (None: none queued)."""
        if not self._inbound.size:
            return None
        first = self._inbound.taken
        for fed_until, arrived in self._arrived:
            if fed_until > first:
                return arrived
        return None

    @property
    def inbound_ms(self) -> float:
        """Microphone audio waiting for the timeline, in milliseconds."""
        return self._inbound.size * 1000 / OUT_RATE

    @property
    def inbound_skipped_ms(self) -> float:
        """Microphone audio skipped so far, in milliseconds."""
        return self.inbound_dropped_samples * 1000 / OUT_RATE

    def _pay_owed(self, inbound: np.ndarray) -> np.ndarray:
        """The late audio's part that was made up already is skipped (module doc)."""
        if self._clock() - self._owed_at > OWED_FOR_S:
            self._owed = 0
            return inbound
        paid = min(self._owed, len(inbound))
        self._owed -= paid
        return inbound[paid:]

    def _conceal(self, chunk: np.ndarray, filled: int) -> None:
        """Make up the rest of ``chunk`` after ``filled`` samples, if the caller was
        speaking and not too much is made up already (module doc)."""
        missing = len(chunk) - filled
        if self._concealment is None or not self._voiced:
            return
        if self._owed + missing > self._max_concealed:
            return
        made = self._concealment(missing)
        if made is None or len(made) < missing:
            return
        chunk[filled:] += made[:missing]
        self._owed += missing
        self._owed_at = self._clock()
        self.inbound_concealed_samples += missing

    @property
    def inbound_concealed_ms(self) -> float:
        """Microphone audio made up for packets that came late, in milliseconds."""
        return self.inbound_concealed_samples * 1000 / OUT_RATE

    def _drop_inbound(self, excess: int) -> None:
        if excess > 0:  # keep the newest
            self._inbound.drop_oldest(excess)
            self.inbound_dropped_samples += excess

    def _watch_inbound(self) -> None:
        """At a tick: note the level; at a window's end skip what it never needed."""
        self._lowest = min(self._lowest, self._inbound.size)
        self._ticks += 1
        if self._ticks == self._window_ticks:
            self._drop_inbound(self._lowest - self._keep_inbound)
            self._ticks = 0
            self._lowest = self._max_inbound

    def push(self, samples: np.ndarray, utterance: int | None = None) -> float:
        """Queue audio of ``utterance`` (a new, complete one when None) to be played in
        real time; returns the seconds now queued.

        Raises :class:`AudioQueueFullError` when the queue would exceed its limit.
        """
        self.check_room(len(samples))
        number = self.utterances.open("push") if utterance is None else utterance
        self._pushed.put(np.asarray(samples, dtype=np.float32))
        self.utterances.queued(number, len(samples))
        if utterance is None:
            self.utterances.close(number)
        if self.on_sound is not None:
            self.on_sound()
        return self.pushed_seconds

    def check_room(self, samples: int) -> None:
        """Raise :class:`AudioQueueFullError` if ``samples`` more would not fit."""
        if self._pushed.size + samples > self._max_pushed:
            raise AudioQueueFullError(
                f"{samples / OUT_RATE:.1f} s of audio would exceed the session's queue of "
                f"{self._max_pushed / OUT_RATE:.0f} s ({self.pushed_seconds:.1f} s queued); "
                "wait for it to play or interrupt"
            )

    def pushed_samples(self) -> np.ndarray:
        """A copy of the pushed audio waiting to be played (48 kHz), for inspection."""
        return self._pushed.snapshot()

    @property
    def pushed_seconds(self) -> float:
        return self._pushed.size / OUT_RATE

    def clear_pushed(self) -> tuple[float, list[int]]:
        """Drop all queued pushed audio; returns the seconds dropped and the utterances cut
        (every one not yet ended)."""
        return self._pushed.clear() / OUT_RATE, self.utterances.clear()

    def hold_pushed(self, first_chunk: int) -> None:
        """Chunks before ``first_chunk`` take no pushed audio: they were due before it
        was pushed (a timeline that slept through silence makes them late)."""
        self._pushed_from = max(self._pushed_from, first_chunk)

    def next_chunk(self) -> np.ndarray:
        """The next 20 ms of the timeline (consumes from both sources)."""
        chunk = np.zeros(CHUNK_SAMPLES, dtype=np.float32)
        self._watch_inbound()
        arrived = self._arrival_of_next_inbound()
        if arrived is not None:
            self.chunk_arrivals[self._chunks_made] = arrived
            self.chunk_arrivals.pop(self._chunks_made - 256, None)
        had = self._inbound.size
        filled = self._inbound.take_into(chunk) if had else 0
        if filled < CHUNK_SAMPLES:
            self.underruns += 1 if had else 0
            self._conceal(chunk, filled)
        taken = self._pushed.take_into(chunk) if self._chunks_made >= self._pushed_from else 0
        marks = self.utterances.taken(taken, self._chunks_made)
        self._chunks_made += 1
        if marks and self._on_marks is not None:
            self._on_marks(marks)
        if taken and self._on_played is not None:
            self._playing_chunks += 1
            if self._pushed.size == 0 or self._playing_chunks % PLAYED_EVERY_CHUNKS == 0:
                self._on_played(self.pushed_seconds, self.utterances.playing)
        np.clip(chunk, -1.0, 1.0, out=chunk)
        return chunk
