"""The OpenAPI document: valid, in step with the registered routes, and true of the server.

The conformance tests drive the real app (a tiny avatar, a real inference core, an
aiortc offer) and check every response against the document: the status is documented
for that operation, a JSON body validates against the documented schema, an error code
is one the operation lists for that status, required headers are present.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import re
import socket
import wave
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jsonschema
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection
from livekit import api
from openapi_spec_validator import validate as validate_spec
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from config.settings import Settings
from tests.live_calls import until
from tests.packages import make_package
from web import errors
from web.app import build_app
from web.app_keys import SESSIONS
from web.openapi import openapi_document
from web.session_tokens import mint_token

Json = dict[str, Any]
BASE_URI = "urn:lipstream:openapi"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
VISUAL, AUDIO = (6, 320, 320), (32, 16, 16)  # tests/onnx_builders.tiny_lipsync
TOKEN = "s3cret-admin-token"


@pytest.fixture(scope="module")
def document() -> Json:
    return openapi_document()


def _settings(tmp_path: Path, **sections: Json) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {
                "root": str(tmp_path / "avatars"),
                "data_dir": str(tmp_path / "data"),
                "demo": False,
            },
            "devices": {"kind": "cpu", "count": 1},
            **sections,
        }
    )


def _walk(node: object) -> Iterator[Json]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _pointer(*parts: str) -> str:
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


def _lookup(document: Json, ref: str) -> Json:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    assert isinstance(node, dict)
    return node


def _operations(document: Json) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in METHODS
    }


def _registered(app: web.Application) -> set[tuple[str, str]]:
    routes = set()
    for route in app.router.routes():
        if route.method == "HEAD":  # aiohttp adds one for every GET
            continue
        resource = route.resource
        assert resource is not None
        path = resource.canonical
        if isinstance(resource, web.StaticResource):
            path += "/{filename}"
        routes.add((route.method, path))
    return routes


def _operations_tagged(document: Json, tag: str) -> set[tuple[str, str]]:
    return {
        (method, path)
        for method, path in _operations(document)
        if tag in document["paths"][path][method.lower()]["tags"]
    }


def _documented_codes(response: Json) -> set[str]:
    """The error codes an operation's error response lists in its description."""
    return set(re.findall(r"`([a-z0-9_]+)`:", response.get("description", "")))


# --- the document itself ----------------------------------------------------------------


def test_document_is_valid_openapi_3_1(document: Json) -> None:
    assert json.loads(json.dumps(document)) == document  # plain JSON data
    validate_spec(document)
    assert document["openapi"].startswith("3.1.")
    ids = [
        document["paths"][path][method.lower()]["operationId"]
        for method, path in _operations(document)
    ]
    assert len(ids) == len(set(ids))


def test_every_ref_resolves_and_every_schema_is_valid(document: Json) -> None:
    refs = [node["$ref"] for node in _walk(document) if "$ref" in node]
    assert len(refs) > 30
    for ref in refs:
        _lookup(document, ref)
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_error_codes_are_documented_with_the_status_the_server_maps_them_to(
    document: Json,
) -> None:
    mapped = {code: status for _, status, code, _ in errors._MAPPING}
    for method, path in _operations(document):
        for status, response in document["paths"][path][method.lower()]["responses"].items():
            if int(status) < 400 or "$ref" not in response:
                continue
            codes = _documented_codes(response)
            assert codes, f"{method} {path} {status} lists no error codes"
            for code in codes & mapped.keys():
                assert mapped[code] == int(status), f"{method} {path}: {code} is {mapped[code]}"


def test_registered_routes_and_documented_operations_agree(document: Json, tmp_path: Path) -> None:
    registered = _registered(build_app(_settings(tmp_path)))
    documented = _operations(document)
    assert registered - documented == set(), "routes the document does not describe"
    assert documented - registered == set(), "documented operations the app does not serve"


# --- responses against the document ---------------------------------------------------


@dataclass
class Checked:
    status: int
    headers: Any
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Conformance:
    """Sends requests and checks each response against the document."""

    client: TestClient[Any, Any]
    document: Json
    seen: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        resource = DRAFT202012.create_resource(self.document)
        self.registry: Registry[Any] = Registry().with_resource(BASE_URI, resource)

    def _validate(self, instance: object, pointer: str) -> None:
        schema = {"$ref": f"{BASE_URI}#{quote(pointer, safe='/~')}"}
        jsonschema.Draft202012Validator(schema, registry=self.registry).validate(instance)

    def request_schema_accepts(self, template: str, method: str, body: object) -> None:
        pointer = _pointer("paths", template, method, "requestBody")
        node = _lookup(self.document, "#" + pointer)
        assert "application/json" in node["content"]
        self._validate(body, pointer + _pointer("content", "application/json", "schema"))

    async def __call__(
        self, method: str, template: str, expect: int, *, path: str | None = None, **kwargs: Any
    ) -> Checked:
        response = await self.client.request(method, path or template, **kwargs)
        body = await response.read()
        what = f"{method} {path or template} -> {response.status}: {body[:300]!r}"
        assert response.status == expect, what
        operation = self.document["paths"][template][method.lower()]
        assert str(response.status) in operation["responses"], f"undocumented status: {what}"
        pointer = _pointer("paths", template, method.lower(), "responses", str(response.status))
        documented = operation["responses"][str(response.status)]
        if "$ref" in documented:
            pointer = documented["$ref"][1:]
        resolved = _lookup(self.document, "#" + pointer)
        for name, header in resolved.get("headers", {}).items():
            if header.get("required"):
                assert name in response.headers, f"missing header {name}: {what}"
            if name in response.headers and header["schema"].get("type") == "integer":
                int(response.headers[name])
        content = resolved.get("content", {})
        if content:
            media = response.content_type
            major = media.split("/")[0]
            key = next((k for k in (media, f"{major}/*", "*/*") if k in content), None)
            assert key is not None, f"undocumented content type {media}: {what}"
            schema = content[key].get("schema", {})
            if key == "application/json":
                self._validate(json.loads(body), pointer + _pointer("content", key, "schema"))
            elif "maxLength" in schema:
                assert len(body) <= schema["maxLength"], what
        if response.status >= 400 and "$ref" in documented:
            error = json.loads(body)["error"]
            if isinstance(error, dict):  # the protocol's (/v2) carry a message alone
                assert error["code"] in _documented_codes(documented), f"undocumented: {what}"
        self.seen.add((method, template))
        return Checked(response.status, response.headers, body)


@pytest.fixture
async def check(tmp_path: Path, document: Json, loopback: None) -> AsyncIterator[Conformance]:
    make_package(tmp_path / "avatars" / "alice")
    settings = _settings(
        tmp_path,
        session={"max_audio_push_bytes": 100_000, "max_queued_audio_s": 1.0},
        outputs={"allow_private": True, "max_per_session": 1},
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        yield Conformance(client, document)


def _pcm(seconds: float, rate: int = 16_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * 32767 * np.sin(2 * math.pi * 220 * t)).astype(np.int16)


def _wav(seconds: float) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(_pcm(seconds).astype("<i2").tobytes())
    return buffer.getvalue()


async def _offer_sdp() -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="recvonly")
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


def _listeners(check: Conformance, session_id: str) -> int:
    app = check.client.server.app
    assert app is not None
    return app[SESSIONS].get(session_id).events.listeners


async def test_session_routes_answer_as_documented(check: Conformance) -> None:
    pc, sdp = await _offer_sdp()
    try:
        offer = {"sdp": sdp, "type": "offer", "avatar": "alice"}
        check.request_schema_accepts("/offer", "post", offer)
        answer = (await check("POST", "/offer", 200, json=offer)).json()
        sid = answer["session_id"]
        session = f"/sessions/{sid}"

        state = (await check("GET", "/sessions/{session_id}", 200, path=session)).json()
        assert state["avatar"] == "alice"
        assert answer["delay"]["server_ms"] == state["delay_ms"]  # one figure, two places
        assert answer["delay"]["lookahead_ms"] == state["lookahead_ms"]
        assert state["state"] == "new"  # the answer was never applied: ICE cannot connect

        say = {"text": "hello", "voice": "en"}
        check.request_schema_accepts("/sessions/{session_id}/say", "post", say)
        said = await check(
            "POST", "/sessions/{session_id}/say", 202, path=f"{session}/say", json=say
        )
        assert said.json()["duration_ms"] > 0
        for bad, code in (
            ({"text": ""}, "bad_text"),
            ({"text": 5}, "bad_field"),
            ({"text": "hi", "voice": "-x"}, "bad_text"),
            ([1], "bad_json"),
        ):
            refused = await check(
                "POST", "/sessions/{session_id}/say", 400, path=f"{session}/say", json=bad
            )
            assert refused.json()["error"]["code"] == code
        dropped = await check(
            "POST", "/sessions/{session_id}/interrupt", 200, path=f"{session}/interrupt"
        )
        assert dropped.json()["dropped_ms"] > 0

        audio = "/sessions/{session_id}/audio"
        raw = _pcm(0.3).astype("<i2").tobytes()
        for body, content_type, query in (
            (_wav(0.3), "audio/wav", ""),
            (_pcm(0.3).astype(">i2").tobytes(), "audio/L16; rate=16000", ""),
            (raw, "application/octet-stream", "?format=s16le&rate=16000&channels=1"),
        ):
            await check(
                "POST",
                audio,
                202,
                path=f"{session}/audio{query}",
                data=body,
                headers={"Content-Type": content_type},
            )
        full = await check(
            "POST",
            audio,
            429,
            path=f"{session}/audio?format=s16le&rate=16000&channels=1",
            data=raw,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert full.headers["Retry-After"] == "2"
        for body, content_type, status in (
            (raw, "text/plain", 400),
            (raw, "application/octet-stream", 400),  # raw PCM without its format
            (bytes(150_000), "audio/wav", 413),
        ):
            await check(
                "POST",
                audio,
                status,
                path=f"{session}/audio",
                data=body,
                headers={"Content-Type": content_type},
            )

        for bad_offer, status in (
            ({"sdp": sdp, "type": "offer", "avatar": "nobody"}, 404),
            ({"sdp": sdp, "type": "offer", "avatar": "Bad.Id"}, 400),
            ({"sdp": sdp, "type": "answer", "avatar": "alice"}, 400),
            ({"sdp": "garbage", "type": "offer", "avatar": "alice"}, 400),
            ({"sdp": sdp}, 400),
            ({"sdp": "v=0" + " " * 70_000, "type": "offer"}, 413),
        ):
            await check("POST", "/offer", status, json=bad_offer)
        await check("POST", "/offer", 400, data=b"{", headers={"Content-Type": "application/json"})

        stream = "/sessions/{session_id}/audio/stream"
        for query, code in (
            ("?format=s16le&rate=16000", "websocket_required"),  # not an upgrade
            ("?format=s24le&rate=16000", "bad_stream_format"),
            ("?format=s16le&rate=8000", "bad_stream_format"),
        ):
            refused = await check("GET", stream, 400, path=f"{session}/audio/stream{query}")
            assert refused.json()["error"]["code"] == code
        # The events stream runs until the session ends: the hang-up below ends it.
        events = asyncio.create_task(
            check("GET", "/sessions/{session_id}/events", 200, path=f"{session}/events")
        )
        await until(lambda: _listeners(check, sid) == 1, "the events stream to open")
        same = await check(
            "POST",
            "/sessions/{session_id}/avatar",
            200,
            path=f"{session}/avatar",
            json={"avatar": "alice"},
        )
        assert same.json()["changed"] is False
        clip = await check(
            "POST",
            "/sessions/{session_id}/idle",
            200,
            path=f"{session}/idle",
            json={"clip": "idle"},
        )
        assert clip.json()["clips"] == ["idle"]
        unknown = await check(
            "POST", "/sessions/{session_id}/idle", 404, path=f"{session}/idle", json={"clip": "x"}
        )
        assert unknown.json()["error"]["code"] == "clip_not_found"
        closed = await check("DELETE", "/sessions/{session_id}", 200, path=session)
        assert closed.json() == {"session_id": sid, "state": "closed"}
        ended = (await events).body.decode()
        assert "event: session_ended" in ended, ended
    finally:
        await pc.close()

    for method, template, suffix in (
        ("GET", "/sessions/{session_id}", ""),
        ("DELETE", "/sessions/{session_id}", ""),
        ("POST", "/sessions/{session_id}/say", "/say"),
        ("POST", "/sessions/{session_id}/audio", "/audio"),
        ("POST", "/sessions/{session_id}/interrupt", "/interrupt"),
        ("POST", "/sessions/{session_id}/avatar", "/avatar"),
        ("POST", "/sessions/{session_id}/idle", "/idle"),
        ("GET", "/sessions/{session_id}/events", "/events"),
        ("GET", "/sessions/{session_id}/audio/stream", "/audio/stream?format=s16le&rate=16000"),
    ):
        await check(method, template, 404, path=f"{session}{suffix}", json={"text": "hi"})

    await _check_broadcast_routes(check)
    avatars = (await check("GET", "/avatars", 200)).json()
    assert avatars == {"avatars": [{"id": "alice", "name": "test", "clips": ["idle"]}]}
    config = (await check("GET", "/webrtc-config", 200)).json()
    assert config["iceServers"] == []
    assert config["delay"]["server_ms"] > 0  # tests/test_delay_budget.py checks the figures
    tagged = _operations_tagged(check.document, "sessions")
    assert tagged - check.seen == set(), "operations this test did not exercise"


async def _check_broadcast_routes(check: Conformance) -> None:
    """A session no caller owns, watched and left over WHEP, and what they refuse."""
    created = await check("POST", "/sessions", 201, json={"avatar": "alice"})
    sid = created.json()["session_id"]
    assert created.headers["Location"] == f"/sessions/{sid}" == created.json()["whep"][:-5]
    for bad, status in (({"avatar": "nobody"}, 404), ({"avatar": "Bad.Id"}, 400), ([1], 400)):
        await check("POST", "/sessions", status, json=bad)
    watch, leave = "/sessions/{session_id}/whep", "/sessions/{session_id}/whep/{viewer_id}"
    sdp_type = {"Content-Type": "application/sdp"}
    pc, sdp = await _offer_sdp()
    try:
        answered = await check(
            "POST", watch, 201, path=f"/sessions/{sid}/whep", data=sdp, headers=sdp_type
        )
        assert answered.body.startswith(b"v=0")
        location = answered.headers["Location"]
        assert location.startswith(f"/sessions/{sid}/whep/")
        for body, headers, status in (
            (sdp, {"Content-Type": "application/json"}, 415),
            ("garbage", sdp_type, 400),
        ):
            await check(
                "POST", watch, status, path=f"/sessions/{sid}/whep", data=body, headers=headers
            )
        await check("DELETE", leave, 200, path=location)
        await check("DELETE", leave, 404, path=location)
        await _check_output_routes(check, sid)
        await _check_whip(check)
        await _check_livekit(check)
        await check("DELETE", "/sessions/{session_id}", 200, path=f"/sessions/{sid}")
        await check("POST", watch, 404, path=f"/sessions/{sid}/whep", data=sdp, headers=sdp_type)
    finally:
        await pc.close()


async def _check_whip(check: Conformance) -> None:
    whip, sdp_type = "/whip/{avatar}", {"Content-Type": "application/sdp"}
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio", direction="sendonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        published = await check("POST", whip, 201, path="/whip/alice", data=sdp, headers=sdp_type)
        location = published.headers["Location"]
        await check("POST", whip, 415, path="/whip/alice", data=sdp)
        await check("POST", whip, 404, path="/whip/nobody", data=sdp, headers=sdp_type)
        await check("DELETE", "/sessions/{session_id}", 200, path=location)
    finally:
        await pc.close()
    video_only = RTCPeerConnection()
    try:  # no audio: nothing for the avatar to speak
        video_only.addTransceiver("video", direction="sendonly")
        await video_only.setLocalDescription(await video_only.createOffer())
        sdp = video_only.localDescription.sdp
        await check("POST", whip, 400, path="/whip/alice", data=sdp, headers=sdp_type)
    finally:
        await video_only.close()


async def _check_livekit(check: Conformance) -> None:
    """Its refusals (the 201 needs a LiveKit server: tests/test_livekit.py)."""
    route = "/livekit/sessions"
    token = (
        api.AccessToken("key", "a-secret-long-enough-for-pyjwt-0123456789")
        .with_identity("avatar")
        .with_grants(api.VideoGrants(room_join=True, room="room"))
        .with_attributes({"lk.publish_on_behalf": "agent"})
        .to_jwt()
    )
    body = {"livekit_url": "ws://127.0.0.1:7880", "livekit_token": token, "avatar": "alice"}
    check.request_schema_accepts(route, "post", body)
    await check("POST", route, 400, json={"livekit_url": "ws://127.0.0.1:7880"})
    await check("POST", route, 400, json={**body, "livekit_token": "not-a-token"})
    await check("POST", route, 400, json=body)  # loopback, and livekit.allow_private is off
    await check("POST", route, 404, json={**body, "avatar": "nobody"})


async def _check_output_routes(check: Conformance, sid: str) -> None:
    outputs, one = "/sessions/{session_id}/outputs", "/sessions/{session_id}/outputs/{output_id}"
    path = f"/sessions/{sid}/outputs"
    assert (await check("GET", outputs, 200, path=path)).json() == {"outputs": []}
    closed_port = f"rtmp://127.0.0.1:{_closed_port()}/live/key"  # it will only retry
    added = (await check("POST", outputs, 201, path=path, json={"rtmp": closed_port})).json()
    assert added["target"].endswith("/live/…")
    for bad, status in (({"rtmp": "ftp://x/y/z"}, 400), ({"rtmp": closed_port}, 409)):
        await check("POST", outputs, status, path=path, json=bad)
    listed = (await check("GET", outputs, 200, path=path)).json()["outputs"]
    assert [o["output_id"] for o in listed] == [added["output_id"]]
    removed = f"{path}/{added['output_id']}"
    assert (await check("DELETE", one, 200, path=removed)).json()["state"] == "ended"
    await check("DELETE", one, 404, path=removed)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _infer_body(n: int) -> bytes:
    rng = np.random.default_rng(0)
    visual = rng.random((n, *VISUAL), dtype=np.float32)
    audio = rng.normal(0, 1, (n, *AUDIO)).astype(np.float32)
    return visual.astype("<f4").tobytes() + audio.astype("<f4").tobytes()


async def test_raw_inference_answers_as_documented(check: Conformance) -> None:
    infer = "/v1/infer/{model_id}"
    done = await check(
        "POST", infer, 200, path="/v1/infer/alice?batch_size=2", data=io.BytesIO(_infer_body(2))
    )
    shape = [int(x) for x in done.headers["X-Lipstream-Output-Shape"].split(",")]
    assert shape == [2, 3, 320, 320]
    assert len(done.body) == 4 * math.prod(shape)
    one = _infer_body(1)
    nan = bytearray(one)
    nan[:4] = np.array([np.nan], dtype="<f4").tobytes()
    for query, body, status, code in (
        ("/v1/infer/alice", one, 400, "missing_batch_size"),
        ("/v1/infer/alice?batch_size=0", one, 400, "bad_batch_size"),
        ("/v1/infer/alice?batch_size=33", one, 400, "bad_batch_size"),
        ("/v1/infer/nobody?batch_size=1", one, 404, "model_not_found"),
        ("/v1/infer/Bad.Id?batch_size=1", one, 400, "invalid_model_id"),
        ("/v1/infer/alice?batch_size=1", one[:-4], 400, "bad_body_size"),
        ("/v1/infer/alice?batch_size=1", one + one, 413, "bad_body_size"),
        ("/v1/infer/alice?batch_size=1", bytes(nan), 400, "bad_values"),
    ):
        refused = await check("POST", infer, status, path=query, data=io.BytesIO(body))
        assert refused.json()["error"]["code"] == code
    assert _operations_tagged(check.document, "inference") - check.seen == set()


def _protocol_request(n: int, *, uint8: bool, json_output: bool = False) -> tuple[bytes, str]:
    """An Open Inference Protocol request with binary tensors, and its JSON's length."""
    rng = np.random.default_rng(n)
    visual = (
        rng.integers(0, 256, (n, 320, 320, 3), dtype=np.uint8)
        if uint8
        else rng.random((n, *VISUAL), dtype=np.float32)
    )
    audio = rng.normal(0, 1, (n, *AUDIO)).astype(np.float32)
    inputs = [
        {
            "name": name,
            "datatype": "UINT8" if array.dtype == np.uint8 else "FP32",
            "shape": list(array.shape),
            "parameters": {"binary_data_size": array.nbytes},
        }
        for name, array in (("input", visual), ("audio", audio))
    ]
    outputs = [{"name": "output", "parameters": {"binary_data": not json_output}}]
    head = json.dumps({"id": "x", "inputs": inputs, "outputs": outputs}).encode()
    return head + visual.tobytes() + audio.tobytes(), str(len(head))


async def test_inference_protocol_routes_answer_as_documented(check: Conformance) -> None:
    model, version = "/v2/models/{model_id}", "/v2/models/{model_id}/versions/{version}"
    assert (await check("GET", "/v2/health/live", 200)).json() == {"live": True}
    assert (await check("GET", "/v2/health/ready", 200)).json() == {"ready": True}
    assert "binary_tensor_data" in (await check("GET", "/v2", 200)).json()["extensions"]
    for template, path in (
        (model, "/v2/models/alice"),
        (version, "/v2/models/alice/versions/uint8"),
    ):
        await check("GET", template, 200, path=path)
        await check("GET", f"{template}/config", 200, path=f"{path}/config")
        await check("GET", f"{template}/stats", 200, path=f"{path}/stats")
        await check("GET", f"{template}/ready", 400, path=f"{path}/ready")  # not loaded
    await check("GET", model, 404, path="/v2/models/nobody")
    await check("GET", model, 400, path="/v2/models/Bad.Id")
    await check("GET", version, 404, path="/v2/models/alice/versions/3")
    await check("GET", f"{version}/config", 404, path="/v2/models/alice/versions/3/config")
    await check("GET", "/v2/models/stats", 200)
    index = "/v2/repository/index"
    check.request_schema_accepts(index, "post", {"ready": True})
    listed = (await check("POST", index, 200)).json()
    assert listed == [{"name": "alice", "state": "UNAVAILABLE", "reason": "not loaded"}]
    await check("POST", index, 400, data=b'{"ready": 1}')

    load = "/v2/repository/models/{model_id}/load"
    check.request_schema_accepts(load, "post", {"parameters": {"device": 0}})
    await check("POST", load, 200, path="/v2/repository/models/alice/load")
    await check(
        "POST",
        load,
        200,
        path="/v2/repository/models/alice/load",
        json={"parameters": {"device": 0}},
    )
    for path, body, status in (
        ("/v2/repository/models/alice/load", {"parameters": {"device": 9}}, 400),
        ("/v2/repository/models/alice/load", {"parameters": {"config": "{}"}}, 400),
        ("/v2/repository/models/nobody/load", {}, 404),
    ):
        await check("POST", load, status, path=path, json=body)
    await check("GET", f"{model}/ready", 200, path="/v2/models/alice/ready")
    await check("GET", f"{version}/ready", 200, path="/v2/models/alice/versions/float/ready")

    infer = "/v2/models/{model_id}/infer"
    body, length = _protocol_request(2, uint8=False)
    header = {"Inference-Header-Content-Length": length}
    done = await check(
        "POST", infer, 200, path="/v2/models/alice/infer", data=io.BytesIO(body), headers=header
    )
    assert done.headers["Content-Type"] == "application/octet-stream"
    assert (
        len(done.body)
        == int(done.headers["Inference-Header-Content-Length"]) + 2 * 3 * 320 * 320 * 4
    )
    body, length = _protocol_request(1, uint8=True, json_output=True)
    header = {"Inference-Header-Content-Length": length}
    answered = await check(
        "POST",
        f"{version}/infer",
        200,
        path="/v2/models/alice/versions/uint8/infer",
        data=io.BytesIO(body),
        headers=header,
    )
    assert len(answered.json()["outputs"][0]["data"]) == 320 * 320 * 3
    for path, data, headers, status in (
        ("/v2/models/alice/infer", body, {"Inference-Header-Content-Length": "x"}, 400),
        ("/v2/models/alice/infer", b'{"inputs": []}', {}, 400),
        ("/v2/models/nobody/infer", body, header, 404),
    ):
        await check("POST", infer, status, path=path, data=io.BytesIO(data), headers=headers)
    await check(
        "POST", f"{version}/infer", 404, path="/v2/models/alice/versions/2/infer", data=b"{}"
    )

    unload = "/v2/repository/models/{model_id}/unload"
    await check("POST", unload, 200, path="/v2/repository/models/alice/unload")
    await check("POST", unload, 404, path="/v2/repository/models/nobody/unload")
    foreign = {"Origin": "https://elsewhere.example"}  # the admin rule, as /admin's
    await check("POST", unload, 403, path="/v2/repository/models/alice/unload", headers=foreign)
    assert _operations_tagged(check.document, "inference-protocol") - check.seen == set()


async def test_service_routes_answer_as_documented(check: Conformance) -> None:
    assert (await check("GET", "/health", 200)).json() == {"status": "ok"}
    assert (await check("GET", "/ready", 200)).json()["ready"] is True
    metrics = await check("GET", "/metrics", 200)
    assert b"lipstream_sessions_live" in metrics.body
    served = (await check("GET", "/openapi.json", 200)).json()
    assert served == check.document

    page = await check("GET", "/", 200)
    assert b"<html" in page.body.lower()
    static = "/static/{filename}"
    js = await check("GET", static, 200, path="/static/app.js")
    last_modified = js.headers["Last-Modified"]
    await check(
        "GET", static, 304, path="/static/app.js", headers={"If-Modified-Since": last_modified}
    )
    part = await check("GET", static, 206, path="/static/app.js", headers={"Range": "bytes=0-9"})
    assert len(part.body) == 10
    await check("GET", static, 404, path="/static/nothing.js")  # an empty body
    await check("GET", static, 404, path="/static/%2Fetc%2Fpasswd")  # JSON
    await check("GET", static, 403, path="/static/")  # a directory
    await check("GET", static, 416, path="/static/app.js", headers={"Range": "bytes=999999-"})
    old = "Mon, 01 Jan 2001 00:00:00 GMT"
    await check("GET", static, 412, path="/static/app.js", headers={"If-Unmodified-Since": old})
    assert _operations_tagged(check.document, "service") - check.seen == set()


async def test_admin_routes_answer_as_documented(check: Conformance) -> None:
    # The test client connects from loopback and no token is configured: admin access.
    page = await check("GET", "/admin", 200)
    assert b"<html" in page.body.lower()
    models = (await check("GET", "/admin/models", 200)).json()
    assert [m["id"] for m in models["models"]] == ["alice"]
    load = "/admin/models/{model_id}/load"
    loaded = await check("POST", load, 200, path="/admin/models/alice/load")
    assert loaded.json()["state"] == "loaded"
    check.request_schema_accepts(load, "post", {"device": 0})
    await check("POST", load, 200, path="/admin/models/alice/load", json={"device": 0})
    for path, body, status, code in (
        ("/admin/models/alice/load", b"{", 400, "bad_json"),
        ("/admin/models/alice/load", b'{"device": 7}', 400, "bad_device"),
        ("/admin/models/alice/load", b'{"device": true}', 400, "bad_device"),
        ("/admin/models/alice/load", b" " * 2000, 413, "body_too_large"),
        ("/admin/models/nobody/load", b"", 404, "model_not_found"),
        ("/admin/models/Bad.Id/load", b"", 400, "invalid_model_id"),
    ):
        refused = await check("POST", load, status, path=path, data=body)
        assert refused.json()["error"]["code"] == code

    pc, sdp = await _offer_sdp()
    try:
        offer = {"sdp": sdp, "type": "offer", "avatar": "alice"}
        sid = (await check("POST", "/offer", 200, json=offer)).json()["session_id"]
        sessions = (await check("GET", "/admin/sessions", 200)).json()["sessions"]
        assert [s["id"] for s in sessions] == [sid]
        stats = (await check("GET", "/admin/stats", 200)).json()
        assert stats["global"]["live_sessions"] == 1
        history = (await check("GET", "/admin/history", 200)).json()
        assert ("server", "live_sessions") in {(s["scope"], s["name"]) for s in history["series"]}
        unload = "/admin/models/{model_id}/unload"
        await check("POST", unload, 409, path="/admin/models/alice/unload")  # the session holds it
        end = "/admin/sessions/{session_id}"
        await check("DELETE", end, 200, path=f"/admin/sessions/{sid}")
        await check("DELETE", end, 404, path=f"/admin/sessions/{sid}")
    finally:
        await pc.close()
    unloaded = await check("POST", unload, 200, path="/admin/models/alice/unload")
    assert unloaded.json()["state"] == "registered"
    await check("POST", unload, 404, path="/admin/models/nobody/unload")
    await check("POST", unload, 400, path="/admin/models/Bad.Id/unload")
    wanted = {"source": "synctalk2d", "directory": "may", "lipsync": "m.onnx", "id": "may"}
    check.request_schema_accepts("/admin/avatars/import", "post", wanted)
    disabled = await check("POST", "/admin/avatars/import", 403, json=wanted)  # no import_root
    assert disabled.json()["error"]["code"] == "import_disabled"
    # From loopback, but through a proxy: refused without a token.
    proxied = {"X-Forwarded-For": "203.0.113.9"}
    await check("GET", "/admin/stats", 403, headers=proxied)
    await check("GET", "/admin", 403, headers=proxied)
    foreign = {"Origin": "https://elsewhere.example"}  # a local browser, another site's script
    await check(
        "POST",
        "/admin/models/{model_id}/unload",
        403,
        path="/admin/models/alice/unload",
        headers=foreign,
    )
    assert _operations_tagged(check.document, "admin") - check.seen == set()


async def test_other_configurations_answer_as_documented(tmp_path: Path, document: Json) -> None:
    # No avatar root and no demo avatar: not ready. ICE servers and an admin token set.
    settings = _settings(
        tmp_path,
        server={
            "ice_servers": [
                {"urls": "stun:stun.example.org:3478"},
                {"urls": ["turn:turn.example.org:3478"], "username": "u", "credential": "c"},
            ],
            "admin_token": TOKEN,
        },
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        check = Conformance(client, document)
        not_ready = (await check("GET", "/ready", 503)).json()
        assert not_ready["ready"] is False
        assert "does not exist" in not_ready["reasons"][0]
        config = (await check("GET", "/webrtc-config", 200)).json()
        assert config["iceServers"][1] == {
            "urls": ["turn:turn.example.org:3478"],
            "username": "u",
            "credential": "c",
        }
        await check("GET", "/admin/models", 401)
        await check("GET", "/admin/models", 401, headers={"Authorization": "Bearer wrong"})
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        await check("GET", "/admin/models", 200, headers=bearer)
        await check("GET", "/admin", 200)  # the page asks for the token itself


async def test_session_tokens_and_the_offer_rate_limit_answer_as_documented(
    tmp_path: Path, document: Json, loopback: None
) -> None:
    make_package(tmp_path / "avatars" / "alice")
    settings = _settings(
        tmp_path,
        auth={"jwt_secret": "a-secret-of-at-least-32-bytes-for-hs256"},
        server={"offer_rate_limit_per_minute": 2},
    )
    bearer = {"Authorization": f"Bearer {mint_token(settings.auth, 'alice', ttl_s=60)}"}
    pc, sdp = await _offer_sdp()
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as client:
        check = Conformance(client, document)
        offer = {"sdp": sdp, "type": "offer", "avatar": "alice"}
        try:
            await check("POST", "/offer", 401, json=offer)
            sid = (await check("POST", "/offer", 200, json=offer, headers=bearer)).json()
            session = f"/sessions/{sid['session_id']}"
            limited = await check("POST", "/offer", 429, json=offer, headers=bearer)
            assert int(limited.headers["Retry-After"]) >= 1
            await check("GET", "/sessions/{session_id}", 401, path=session)
            await check("GET", "/sessions/{session_id}", 200, path=session, headers=bearer)
            await check("DELETE", "/sessions/{session_id}", 200, path=session, headers=bearer)
        finally:
            await pc.close()
