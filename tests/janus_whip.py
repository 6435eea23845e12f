"""Janus (Debian's ``janus`` 1.1.2) behind ``simple-whip-server``: the WHIP ingest a test's
lipstream publishes to, and Janus's own HTTP API to watch what it got, as a VideoRoom
subscriber would.

:func:`run_janus_whip` writes Janus's configuration of the test's own (the VideoRoom
plugin with room :data:`ROOM`, H.264 and Opus; the HTTP and WebSocket transports on free
ports), starts Janus, then ``simple-whip-server`` (Node.js) with a ``config.js`` of the
test's pointing at that Janus. ``simple-whip-server`` comes from Debian's package, whose
Node.js dependency cannot be installed next to the NodeSource Node.js these machines
carry: ``.ci/run`` unpacks the package into :data:`SIMPLE_WHIP_SERVER` and installs its
JavaScript dependencies there from npm. libnice (Janus's ICE) gathers no loopback
candidates, so Janus and the server meet on the machine's own address.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.live_calls import TIMEOUT_S, until
from tests.nginx_proxy import _accepts, free_port

JANUS = Path("/usr/bin/janus")
JANUS_LIBS = Path("/usr/lib/x86_64-linux-gnu/janus")
SIMPLE_WHIP_SERVER = Path(
    os.environ.get("LIPSTREAM_SIMPLE_WHIP_SERVER", "/opt/lipstream-ci/simple-whip-server")
)
ROOM = 1234
_PLUGINS_OFF = (
    "audiobridge duktape echotest lua nosip recordplay sip streaming textroom videocall voicemail"
)
_TRANSPORTS_OFF = "mqtt nanomsg pfunix rabbitmq"


@dataclass
class JanusWhip:
    janus_http: str  # Janus's HTTP API, .../janus
    whip: str  # simple-whip-server's REST base, .../whip
    directory: Path

    def log(self) -> str:
        return "\n".join(
            f"--- {name}\n{(self.directory / name).read_text(errors='replace')[-2500:]}"
            for name in ("janus.log", "whip.log")
            if (self.directory / name).exists()
        )

    async def endpoint(self, http: aiohttp.ClientSession, name: str, token: str) -> str:
        """A WHIP endpoint publishing into :data:`ROOM`; its URL."""
        body = {"id": name, "room": ROOM, "token": token}
        async with http.post(f"{self.whip}/create", json=body) as response:
            assert response.status == 200, await response.text()
        return f"{self.whip}/endpoint/{name}"


def _janus_conf(directory: Path, http_port: int, ws_port: int) -> None:
    conf = directory / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    plugins = ",".join(f"libjanus_{name}.so" for name in _PLUGINS_OFF.split())
    transports = ",".join(
        f"libjanus_{name}.so" for name in ("mqtt", "nanomsg", "pfunix", "rabbitmq")
    )
    (conf / "janus.jcfg").write_text(
        f"""general: {{
    configs_folder = "{conf}"
    plugins_folder = "{JANUS_LIBS}/plugins"
    transports_folder = "{JANUS_LIBS}/transports"
    events_folder = "{JANUS_LIBS}/events"
    loggers_folder = "{JANUS_LIBS}/loggers"
    debug_level = 4
}}
media: {{}}
nat: {{}}
plugins: {{ disable = "{plugins}" }}
transports: {{ disable = "{transports}" }}
loggers: {{ disable = "libjanus_jsonlog.so" }}
events: {{ broadcast = false }}
"""
    )
    (conf / "janus.plugin.videoroom.jcfg").write_text(
        f"""general: {{}}
room-{ROOM}: {{
    description = "lipstream"
    publishers = 4
    bitrate = 3000000
    fir_freq = 10
    audiocodec = "opus"
    videocodec = "h264"
}}
"""
    )
    (conf / "janus.transport.http.jcfg").write_text(
        f"""general: {{ json = "indented" base_path = "/janus" http = true port = {http_port}
    https = false }}
admin: {{ admin_http = false }}
"""
    )
    (conf / "janus.transport.websockets.jcfg").write_text(
        f"""general: {{ json = "indented" ws = true ws_port = {ws_port} wss = false }}
admin: {{ admin_ws = false }}
"""
    )


def _whip_server(directory: Path, ws_port: int, port: int) -> Path:
    """A copy of simple-whip-server's sources with the test's config.js; its server.js."""
    source = SIMPLE_WHIP_SERVER / "usr" / "share" / "simple-whip-server" / "src"
    if not (source / "server.js").exists() or not (SIMPLE_WHIP_SERVER / "node_modules").exists():
        pytest.fail(
            f"simple-whip-server is missing under {SIMPLE_WHIP_SERVER}: `.ci/run` unpacks "
            "Debian's package there and installs its npm dependencies"
        )
    copy = directory / "whip-src"
    copy.mkdir(parents=True, exist_ok=True)
    for name in ("server.js", "whip-janus.js"):
        shutil.copy(source / name, copy / name)
    (copy / "config.js").write_text(
        f"""module.exports = {{
    janus: {{ address: 'ws://127.0.0.1:{ws_port}' }},
    port: {port},
    rest: '/whip',
    allowTrickle: true,
    strictETags: false,
    iceServers: []
}};
"""
    )
    return copy / "server.js"


async def _start(command: list[str], log: Path, **kwargs: Any) -> asyncio.subprocess.Process:
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, **kwargs
        )


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
        try:
            async with asyncio.timeout(TIMEOUT_S):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


@contextlib.asynccontextmanager
async def run_janus_whip(directory: Path) -> AsyncIterator[JanusWhip]:
    """Janus and simple-whip-server on free ports; stopped when the block ends."""
    node, janus_binary = shutil.which("node"), shutil.which(str(JANUS))
    if janus_binary is None or node is None:
        pytest.fail("janus or node is missing: `.ci/run` installs janus and node")
    http_port, ws_port, whip_port = free_port(), free_port(), free_port()
    _janus_conf(directory, http_port, ws_port)
    server_js = _whip_server(directory, ws_port, whip_port)
    conf = directory / "conf"
    janus = await _start(
        [str(JANUS), "-F", str(conf), "-C", str(conf / "janus.jcfg")], directory / "janus.log"
    )
    whip: asyncio.subprocess.Process | None = None
    ingest = JanusWhip(
        f"http://127.0.0.1:{http_port}/janus", f"http://127.0.0.1:{whip_port}/whip", directory
    )
    try:

        async def janus_up() -> bool:
            if janus.returncode is not None:
                pytest.fail(f"janus exited with {janus.returncode}:\n{ingest.log()}")
            return await _accepts(http_port) and await _accepts(ws_port)

        await until(janus_up, "Janus to listen", poll_s=0.1)
        env = {**os.environ, "NODE_PATH": str(SIMPLE_WHIP_SERVER / "node_modules")}
        whip = await _start(
            [node, str(server_js)], directory / "whip.log", env=env, cwd=server_js.parent
        )

        async def whip_up() -> bool:
            assert whip is not None
            if whip.returncode is not None:
                pytest.fail(f"simple-whip-server exited with {whip.returncode}:\n{ingest.log()}")
            return await _accepts(whip_port)

        await until(whip_up, "simple-whip-server to listen", poll_s=0.1)
        yield ingest
    finally:
        if whip is not None:
            await _stop(whip)
        await _stop(janus)
