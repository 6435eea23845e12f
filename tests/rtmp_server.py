"""Debian's nginx with its RTMP module (``libnginx-mod-rtmp``) as the ingest a test's
lipstream pushes to, and FFmpeg (PyAV) reading the stream back from it, as a player or
a streaming platform's transcoder would.

:func:`run_rtmp_server` writes an nginx.conf of the test's own (``daemon off``, pid and
logs in the test's directory, one ``live`` application on a free loopback port), checks
it with ``nginx -t`` and runs nginx until the test ends; :func:`stop` ends it early (an
ingest that vanishes mid-stream).
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.live_calls import TIMEOUT_S, until
from tests.nginx_proxy import NGINX, _accepts, free_port

RTMP_MODULE = Path("/usr/lib/nginx/modules/ngx_rtmp_module.so")


@dataclass
class RtmpServer:
    process: asyncio.subprocess.Process
    port: int
    directory: Path

    def url(self, key: str) -> str:
        """Where a stream named ``key`` is pushed and played."""
        return f"rtmp://127.0.0.1:{self.port}/live/{key}"

    def log(self) -> str:
        path = self.directory / "error.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                async with asyncio.timeout(TIMEOUT_S):
                    await self.process.wait()
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def _conf(directory: Path, port: int) -> str:
    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    return f"""\
load_module {RTMP_MODULE};
daemon off;
user {user} {group};
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log info;
events {{
    worker_connections 64;
}}
rtmp {{
    server {{
        listen 127.0.0.1:{port};
        chunk_size 4096;
        application live {{
            live on;
            record off;
        }}
    }}
}}
"""


def _write_conf(directory: Path, port: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "nginx.conf"
    conf.write_text(_conf(directory, port))
    return conf


@asynccontextmanager
async def run_rtmp_server(directory: Path, *, port: int | None = None) -> AsyncIterator[RtmpServer]:
    """nginx taking RTMP on a free loopback port (or ``port``); stopped when the block ends."""
    for needed, package in ((NGINX, "nginx"), (RTMP_MODULE, "libnginx-mod-rtmp")):
        if not needed.exists():
            pytest.fail(
                f"{needed} is missing: `.ci/run` installs it (apt-get install -y {package})"
            )
    port = port or free_port()
    conf = _write_conf(directory, port)
    log = str(directory / "error.log")
    command = [str(NGINX), "-p", str(directory), "-c", str(conf), "-e", log]
    check = await asyncio.create_subprocess_exec(
        *command, "-t", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await check.communicate()
    if check.returncode != 0:
        pytest.fail(f"nginx refused {conf}:\n{output.decode(errors='replace')}")
    with (directory / "stderr.log").open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=stderr, stderr=stderr
        )
    server = RtmpServer(process, port, directory)
    try:

        async def listening() -> bool:
            if process.returncode is not None:
                pytest.fail(f"nginx exited with {process.returncode}:\n{server.log()}")
            return await _accepts(port)

        await until(listening, "nginx to take RTMP", poll_s=0.1)
        yield server
    finally:
        await server.stop()
