"""Hostile connections: a request head must arrive in time, and each address has a cap.

aiohttp waits for a request head for ever: a client that sends half a head and
nothing more holds a connection (and a file descriptor) as long as it likes, and a few
thousand such clients exhaust the process. :class:`ConnectionGuard` wraps aiohttp's
protocol factory: a connection is closed unless each request head arrives within
``server.head_timeout_s`` of the connection opening or of the first byte of that head
(idle keep-alive connections are aiohttp's own ``keepalive_timeout``), and an address
with ``server.max_connections_per_client`` open connections has further ones refused at
once. The head is known to have arrived when aiohttp hands the request to the
application, which :meth:`ConnectionGuard.middleware` sees; no timer runs while a
request is handled or its response written.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

from aiohttp import web

from config.settings import ServerSettings
from web.client_address import is_trusted, parse_networks
from web.errors import Handler

logger = logging.getLogger(__name__)


class ConnectionGuard:
    """Counts and limits the server's connections; see the module docstring."""

    def __init__(
        self, head_timeout_s: float, max_per_client: int, *, exempt: Sequence[str] = ()
    ) -> None:
        self.head_timeout_s = head_timeout_s
        self.max_per_client = max_per_client
        # Trusted reverse proxies carry every user's connections: no per-address cap.
        self.exempt = parse_networks(exempt)
        self.open: Counter[str] = Counter()
        self.timed_out = 0
        self.refused = 0
        # aiohttp's protocol (by id: it takes no weak references) -> our wrapper; an entry
        # lives from connection_made to connection_lost.
        self._by_handler: dict[int, _GuardedProtocol] = {}

    @classmethod
    def for_server(cls, server: ServerSettings) -> ConnectionGuard:
        """The guard ``server``'s settings ask for (trusted proxies exempt from the cap)."""
        return cls(
            server.head_timeout_s,
            server.max_connections_per_client,
            exempt=[str(p) for p in server.trusted_proxies],
        )

    async def listen(self, runner: web.AppRunner, host: str, port: int) -> asyncio.Server:
        """Open the listener for ``runner`` (set up already), its connections guarded."""
        if runner.server is None:
            raise RuntimeError("the runner is not set up: call runner.setup() first")
        loop = asyncio.get_running_loop()
        factory = self.protocol_factory(runner.server)
        return await loop.create_server(factory, host, port, reuse_address=True)

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], Any]:
        """A factory for ``loop.create_server`` wrapping ``inner``'s protocols."""
        return lambda: _GuardedProtocol(inner(), self)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The head arrived: no timer while the request runs, a new one after it."""
        guarded = self._by_handler.get(id(request.protocol))
        if guarded is None:  # not a guarded connection (a test server)
            return await handler(request)
        guarded.disarm()
        guarded.in_request = True
        try:
            return await handler(request)
        finally:
            guarded.in_request = False


class _GuardedProtocol(asyncio.Protocol):
    """aiohttp's protocol, forwarded to, with a head timer and the per-address count."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.timer: asyncio.TimerHandle | None = None
        self.active = False
        self.in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have asyncio.Transport's methods without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        guard = self.guard
        if (
            self.address
            and guard.open[self.address] >= guard.max_per_client
            and not is_trusted(self.address, guard.exempt)
        ):
            guard.refused += 1
            if guard.refused % 100 == 1:
                logger.warning(
                    "refused a connection from %s: %d open (server.max_connections_per_client); "
                    "%d refused so far",
                    self.address,
                    guard.open[self.address],
                    guard.refused,
                )
            self.transport.abort()
            return
        self.active = True
        guard.open[self.address] += 1
        guard._by_handler[id(self.inner)] = self
        self.inner.connection_made(transport)
        self.arm()

    def arm(self) -> None:
        self.disarm()
        if self.active:
            loop = asyncio.get_running_loop()
            self.timer = loop.call_later(self.guard.head_timeout_s, self._head_too_slow)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _head_too_slow(self) -> None:
        self.timer = None
        self.guard.timed_out += 1
        if self.guard.timed_out % 100 == 1:
            logger.info(
                "closed a connection from %s: no request head within %.1f s (%d so far)",
                self.address,
                self.guard.head_timeout_s,
                self.guard.timed_out,
            )
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self.in_request and self.timer is None:
            self.arm()  # the first bytes of a new request head: it has head_timeout_s
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if not self.active:
            return
        self.active = False
        self.guard._by_handler.pop(id(self.inner), None)
        self.guard.open[self.address] -= 1
        if self.guard.open[self.address] <= 0:
            del self.guard.open[self.address]
        self.inner.connection_lost(exc)


GUARD = web.AppKey("connection_guard", ConnectionGuard)
