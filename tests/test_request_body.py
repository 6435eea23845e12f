"""Bodies read with a limit: into one buffer of the announced size, and past it when the
announced size is the compressed one."""

from __future__ import annotations

import gzip
import hashlib
import io
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from web.errors import error_middleware
from web.request_body import read_buffer, read_limited

LIMIT = 1 << 20


async def _digest(request: web.Request) -> web.Response:
    reader = read_buffer if request.query.get("buffer") else read_limited
    body = await reader(request, LIMIT)
    return web.json_response({"size": len(body), "sha": hashlib.sha256(body).hexdigest()})


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application(middlewares=[error_middleware], client_max_size=4 * LIMIT)
    app.router.add_post("/", _digest)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 7000):
        yield data[start : start + 7000]


@pytest.mark.parametrize("buffer", ["", "1"])
async def test_bodies_arrive_whole_however_they_are_sent(
    client: TestClient[web.Request, web.Application], buffer: str
) -> None:
    data = bytes(range(256)) * 3000  # 768 000 bytes, under the limit
    want = {"size": len(data), "sha": hashlib.sha256(data).hexdigest()}
    url = f"/?buffer={buffer}"
    plain = await client.post(url, data=data)
    assert await plain.json() == want
    chunked = await client.post(url, data=_chunks(data))  # no Content-Length
    assert await chunked.json() == want
    packed = gzip.compress(data)  # Content-Length is the compressed size, far smaller
    compressed = await client.post(url, data=packed, headers={"Content-Encoding": "gzip"})
    assert await compressed.json() == want


async def test_bodies_past_the_limit_are_refused(
    client: TestClient[web.Request, web.Application],
) -> None:
    big = bytes(LIMIT + 1)
    declared = await client.post("/?buffer=1", data=io.BytesIO(big))
    assert declared.status == 413
    assert "at most" in (await declared.json())["error"]["message"]
    streamed = await client.post("/?buffer=1", data=_chunks(big))
    assert streamed.status == 413
    unpacked = await client.post(
        "/?buffer=1", data=io.BytesIO(gzip.compress(big)), headers={"Content-Encoding": "gzip"}
    )
    assert unpacked.status == 413
