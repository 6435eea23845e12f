"""The admin API and the service routes, fuzzed from the OpenAPI document the server serves.

Schemathesis generates requests from ``web.openapi``'s document (valid and invalid ones)
and sends them to the real server, listening on a TCP port in a thread with its own event
loop; no response may be a 5xx, and every response must match the document.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from config.settings import Settings
from tests.packages import make_package
from web.app import build_app
from web.openapi import openapi_document

OPERATIONS = [
    "admin_page",
    "list_models",
    "load_model",
    "unload_model",
    "stats",
    "list_sessions",
    "end_session",
    "health",
    "ready",
    "list_avatars",
    "webrtc_config",
]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

schema = schemathesis.openapi.from_dict(openapi_document()).include(operation_id=OPERATIONS)


class ServerThread:
    """The app on 127.0.0.1:<free port>, served by a thread running its own event loop."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._thread = threading.Thread(target=self._run, name="schemathesis-server")
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.url = ""

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        runner = web.AppRunner(build_app(self._settings), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            host, port = runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"
            self._started.set()
            await self._stop.wait()
        finally:
            self._started.set()
            await runner.cleanup()

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(60.0) or not self.url:
            raise RuntimeError("the server did not start")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30.0)


TOKEN = "schemathesis-admin-token"


@dataclass(frozen=True)
class Target:
    url: str
    headers: dict[str, str]


@pytest.fixture(scope="module", params=["loopback", "token"])
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    """The server without an admin token (loopback rule) and with one (sent as a bearer)."""
    root: Path = tmp_path_factory.mktemp("schemathesis")
    # Short ids, so generated model ids sometimes name a real model (load and unload run).
    for avatar_id in ("0", "a", "-"):
        make_package(root / "avatars" / avatar_id)
    with_token = request.param == "token"
    server = ServerThread(
        Settings.model_validate(
            {
                "avatars": {"root": str(root / "avatars"), "data_dir": str(root / "data")},
                "devices": {"kind": "cpu", "count": 1},
                "server": {"admin_token": TOKEN if with_token else None},
            }
        )
    )
    server.start()
    try:
        yield Target(server.url, {"Authorization": f"Bearer {TOKEN}"} if with_token else {})
    finally:
        server.stop()


@schema.parametrize()
@settings(
    max_examples=50,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors_and_responses_match_the_document(
    case: schemathesis.Case, target: Target
) -> None:
    case.call_and_validate(base_url=target.url, headers=target.headers, checks=CHECKS)
