"""coturn run from the configuration the docs publish, for relay tests.

:func:`render_config` takes ``docs/deploy/turnserver.conf`` and changes only what a test
must: the values of a few settings the file sets (each must be set there, so the file
cannot drift from what is tested) and a few lines appended (addresses, file locations).
:func:`running_coturn` starts ``turnserver`` with the result, waits until its log says
it listens, and stops it on exit, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.live_calls import until

DOCUMENTED = Path(__file__).resolve().parent.parent / "docs" / "deploy" / "turnserver.conf"
STOP_TIMEOUT_S = 10.0


def render_config(text: str, replace: Mapping[str, str], append: Mapping[str, str]) -> str:
    """``text`` with the value of each setting in ``replace`` changed, then ``append``.

    Raises ``ValueError`` if a setting to replace is not set (uncommented) in ``text``.
    An empty value in ``append`` adds a bare flag.
    """
    lines = text.splitlines()
    for key, value in replace.items():
        found = [i for i, line in enumerate(lines) if re.match(rf"{re.escape(key)}=", line)]
        if len(found) != 1:
            raise ValueError(f"{key}= is set {len(found)} times in the config, expected once")
        lines[found[0]] = f"{key}={value}"
    lines.append("# -- appended by tests/coturn.py")
    lines += [f"{key}={value}" if value else key for key, value in append.items()]
    return "\n".join(lines) + "\n"


def documented_setting(key: str) -> str:
    """The value ``docs/deploy/turnserver.conf`` gives ``key``."""
    match = re.search(rf"^{re.escape(key)}=(.*)$", DOCUMENTED.read_text(), re.M)
    if match is None:
        raise ValueError(f"{DOCUMENTED} does not set {key}")
    return match.group(1).strip()


@dataclass
class Coturn:
    """A running ``turnserver``."""

    address: str
    port: int
    realm: str
    log: Path
    process: asyncio.subprocess.Process

    @property
    def url(self) -> str:
        """Its ``turn:`` URL (UDP), as lipstream's ``turn.urls`` lists it."""
        return f"turn:{self.address}:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def lines_for(self, username: str) -> list[str]:
        """The log lines that name TURN user ``username``."""
        return [line for line in self.log_text().splitlines() if f"<{username}>" in line]


@contextlib.asynccontextmanager
async def running_coturn(
    turnserver: str,
    directory: Path,
    *,
    address: str,
    secret: str,
    relay_ports: tuple[int, int],
    allowed_peer: str,
) -> AsyncIterator[Coturn]:
    """coturn on ``address`` (the documented port), relaying from ``address`` on
    ``relay_ports`` to the denied ranges' exception ``allowed_peer``; stopped on exit."""
    realm = "lipstream.test"
    log = directory / "turnserver.log"
    config = directory / "turnserver.conf"
    config.write_text(
        render_config(
            DOCUMENTED.read_text(),
            replace={
                "static-auth-secret": secret,
                "realm": realm,
                "min-port": str(relay_ports[0]),
                "max-port": str(relay_ports[1]),
                "log-file": str(log),
            },
            append={
                "listening-ip": address,
                "relay-ip": address,
                "allowed-peer-ip": allowed_peer,
                "userdb": str(directory / "turndb"),  # unused with use-auth-secret, but opened
                "pidfile": str(directory / "turnserver.pid"),
            },
        )
    )
    port = int(documented_setting("listening-port"))
    output = directory / "turnserver.out"
    with output.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            turnserver, "-c", str(config), stdout=out, stderr=asyncio.subprocess.STDOUT
        )
    server = Coturn(address, port, realm, log, process)
    try:

        def listening() -> bool:
            if process.returncode is not None:
                pytest.fail(
                    f"turnserver exited ({process.returncode}): "
                    f"{output.read_text(errors='replace')[-2000:]}{server.log_text()[-2000:]}"
                )
            return f"UDP listener opened on: {address}:{port}" in server.log_text()

        await until(listening, f"coturn to listen on {address}:{port}")
        yield server
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
