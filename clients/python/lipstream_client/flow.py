"""How far ahead of the avatar an audio stream may send: the client's flow control.

The server reports the audio queued in the session (``queued_ms``) each time audio is
queued, not as it plays. So between reports the window estimates the queue as the last
report, plus what was sent since, less what has played since, where play-out runs at
real time only once the session is known to be speaking (a ``speech_started`` event):
before the call connects nothing plays, and the window fills once and then waits for
an event. Audio in flight when a report is made is counted once a later report shows
it, so the server's queue can briefly reach twice the window; :class:`AudioStream`
keeps the window at most half the server's ``max_buffer_ms`` for that reason.
"""

from __future__ import annotations

from collections.abc import Callable


class SendWindow:
    """Estimates the server's audio queue and says how long a send must wait.

    ``clock`` returns seconds (``loop.time`` in the stream; a test drives it by hand).
    """

    def __init__(self, max_ahead_ms: float, clock: Callable[[], float]) -> None:
        if max_ahead_ms <= 0:
            raise ValueError(f"max_ahead_ms must be positive, got {max_ahead_ms}")
        self.max_ahead_ms = max_ahead_ms
        self._clock = clock
        self._reported_ms = 0.0
        self._reported_at = clock()
        self._sent_ms = 0.0
        self._playing_since: float | None = None

    def on_report(self, queued_ms: float) -> None:
        """The server says ``queued_ms`` of audio wait in the session now."""
        self._reported_ms = queued_ms
        self._reported_at = self._clock()
        self._sent_ms = 0.0

    def on_sent(self, duration_ms: float) -> None:
        """``duration_ms`` of audio was just sent."""
        self._sent_ms += duration_ms

    def on_playing(self) -> None:
        """The session speaks: its queue now drains at real time."""
        if self._playing_since is None:
            self._playing_since = self._clock()

    def estimate_ms(self) -> float:
        """The audio the server is estimated to hold now."""
        played = 0.0
        if self._playing_since is not None:
            since = max(self._reported_at, self._playing_since)
            played = max(0.0, self._clock() - since) * 1000.0
        return max(0.0, self._reported_ms + self._sent_ms - played)

    def wait_s(self, duration_ms: float) -> float | None:
        """Seconds until ``duration_ms`` more may be sent: 0.0 now, ``None`` when only a
        report can open the window (nothing plays yet)."""
        excess = self.estimate_ms() + duration_ms - self.max_ahead_ms
        if excess <= 0 or self.estimate_ms() == 0.0:  # an empty queue takes any one piece
            return 0.0
        if self._playing_since is None:
            return None
        return excess / 1000.0
