"""A real ``livekit-server`` (v1.13.5, built by ``.ci/run`` with ``go install``) for a test.

:func:`run_livekit` starts it in dev mode (single node, no Redis) on loopback, on free
ports (signalling and API, RTC over TCP, one UDP port), with an API key of the test's
own (a secret long enough that PyJWT does not warn), and stops it after. The server
auto-creates rooms. Without the binary the test fails, naming how to build it: LiveKit
tests never skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from tests.nginx_proxy import free_port

SERVER = Path(os.environ.get("LIPSTREAM_LIVEKIT_DIR", "/opt/lipstream-ci/livekit")) / "server"
API_KEY = "lipstreamtests"
API_SECRET = "lipstream-tests-secret-0123456789abcdef"
START_S = 20.0


def server_binary() -> Path:
    """The livekit-server binary, or a failed test saying how to get it."""
    if SERVER.is_file():
        return SERVER
    found = shutil.which("livekit-server")
    if found:
        return Path(found)
    pytest.fail(
        f"livekit-server is not at {SERVER}: build it with "
        f"GOBIN={SERVER.parent} go install github.com/livekit/livekit-server/cmd/server@v1.13.5 "
        "(.ci/run does), Go 1.26 or later"
    )


@dataclass
class LiveKit:
    """A running server: its URL for the SDKs, its HTTP base, and its process."""

    url: str  # ws://127.0.0.1:port
    http: str
    process: subprocess.Popen[bytes]
    log: Path

    def token(
        self,
        identity: str,
        room: str,
        *,
        kind: str | None = None,
        attributes: dict[str, str] | None = None,
        can_publish: bool = True,
        ttl_s: float = 600.0,
        secret: str = API_SECRET,
    ) -> str:
        """An access token for ``identity`` in ``room``, signed with the test key."""
        from livekit import api

        grants = api.VideoGrants(room_join=True, room=room, can_publish=can_publish)
        token = (
            api.AccessToken(API_KEY, secret)
            .with_identity(identity)
            .with_grants(grants)
            .with_ttl(timedelta(seconds=ttl_s))
        )
        if kind is not None:
            token = token.with_kind(kind)
        if attributes:
            token = token.with_attributes(attributes)
        return token.to_jwt()

    def kill(self) -> None:
        """Kill the server at once (SIGKILL): no goodbye to anyone in its rooms."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@contextlib.contextmanager
def run_livekit(directory: Path) -> Iterator[LiveKit]:
    """Start a livekit-server for the test (module doc); stopped on exit."""
    binary = server_binary()
    port, tcp_port, udp_port = free_port(), free_port(), free_port()
    config = (
        f"port: {port}\n"
        f"rtc:\n  tcp_port: {tcp_port}\n  udp_port: {udp_port}\n"
        f"keys:\n  {API_KEY}: {API_SECRET}\n"
    )
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "livekit.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(binary), "--dev", "--bind", "127.0.0.1", "--node-ip", "127.0.0.1"],
            env={**os.environ, "LIVEKIT_CONFIG": config},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = LiveKit(f"ws://127.0.0.1:{port}", f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + START_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"livekit-server exited ({process.returncode}):\n{server.tail()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(server.http, timeout=1) as answer,
            ):
                if answer.status == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"livekit-server did not answer in {START_S:g} s:\n{server.tail()}")
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
