"""What a caller's data channel takes (``docs/apps.md``): the server's control messages.

``interrupt`` acts at once; ``switch_avatar`` and ``set_idle_clip`` go to the web layer's
handling (``shared.control``, the same as for the session's WebSocket), which answers on
that channel. Without it (a session built outside a server) only ``interrupt`` is taken.
"""

from __future__ import annotations

from typing import Protocol

from streaming.live.events import error_event, message_type
from streaming.live.pipeline import Control, Reply


class Interruptible(Protocol):
    """The session, as far as its messages need it."""

    def interrupt(self) -> object: ...


class CallerMessages:
    """What the caller's data channel takes (``docs/apps.md``): the server's control
    messages (``shared.control``: interrupt, switch_avatar, set_idle_clip), answered
    on that channel; ``session`` is set once the call exists (no message comes before)."""

    def __init__(self, control: Control | None) -> None:
        self._control = control
        self.session: Interruptible | None = None

    def bind(self, session: Interruptible) -> None:
        """The call exists: its messages act on ``session`` from now on."""
        self.session = session

    def answer(self, message: object, reply: Reply) -> None:
        session = self.session
        if session is None:
            return
        if self._control is not None:
            self._control(session, message, reply)
        elif message_type(message) == "interrupt":
            session.interrupt()
        else:
            reply(error_event("bad_message", 'the data channel takes {"type": "interrupt"}'))
