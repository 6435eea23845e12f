"""Malformed raw inference requests on every door, while a live call speaks on.

Each request below is refused with its own error before the server reads or allocates
its tensors (``docs/design/inference-protocols.md`` §17), and the live call on the same core keeps
sending lip-synced frames all along: nothing a raw client sends can stall a call.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tests.grpc_served import (
    AUDIO_NAME,
    MODEL,
    VISUAL_NAME,
    Served,
    float_inputs,
    make_avatar,
    served,
    settings_for,
)
from tests.live_calls import assert_lip_synced, frames_due, session_state, since, until
from tests.media import write_wav
from tests.webrtc_client import Caller
from web.inference.grpc_server import message_limits
from web.inference.protos import grpc_service_pb2 as pb

HEADER = "Inference-Header-Content-Length"
REPO = Path(__file__).resolve().parent.parent
FRAME_BYTES = 6 * 320 * 320 * 4
AUDIO_BYTES = 32 * 16 * 16 * 4


@pytest.fixture
async def server(tmp_path: Path, loopback: None) -> AsyncIterator[Served]:
    root = tmp_path / "avatars"
    make_avatar(root, MODEL)
    settings = settings_for(
        root,
        avatars={"root": str(root), "data_dir": str(tmp_path / "data"), "demo": True},
        video={"preset": "ultrafast"},
    )
    async with served(settings) as running:
        yield running


def _header(*, visual_bytes: int = FRAME_BYTES, shape: list[int] | None = None) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {
                    "name": VISUAL_NAME,
                    "datatype": "FP32",
                    "shape": shape or [1, 6, 320, 320],
                    "parameters": {"binary_data_size": visual_bytes},
                },
                {
                    "name": AUDIO_NAME,
                    "datatype": "FP32",
                    "shape": [1, 32, 16, 16],
                    "parameters": {"binary_data_size": AUDIO_BYTES},
                },
            ]
        }
    ).encode()


def _rest_abuse() -> list[tuple[str, bytes, dict[str, str], str]]:
    """(what, body, headers, words of the error) for each malformed REST request."""
    good = _header()
    blobs = bytes(FRAME_BYTES + AUDIO_BYTES)
    return [
        (
            "a binary_data_size past what the contract takes",
            _header(visual_bytes=FRAME_BYTES * 1000) + blobs,
            {HEADER: str(len(_header(visual_bytes=FRAME_BYTES * 1000)))},
            "binary_data_size",
        ),
        (
            "a header length past the body",
            good + blobs,
            {HEADER: str(len(good) + len(blobs) + 1)},
            HEADER,
        ),
        (
            "an absurd header length",
            good + blobs,
            {HEADER: "99999999999999999999"},
            HEADER,
        ),
        ("a truncated body", good + blobs[:-1000], {HEADER: str(len(good))}, "bytes"),
        (
            "an absurd shape",
            _header(shape=[1, 6, 320, 2**40]) + blobs,
            {HEADER: str(len(_header(shape=[1, 6, 320, 2**40])))},
            "shape",
        ),
        ("a header that is not JSON", b"{nope" + blobs, {HEADER: "5"}, "JSON"),
    ]


async def _speak(served: Served, session_id: str, wav: bytes) -> None:
    response = await served.http.post(
        f"/sessions/{session_id}/audio", data=wav, headers={"Content-Type": "audio/wav"}
    )
    assert response.status == 202, await response.text()


@pytest.mark.slow
async def test_malformed_requests_are_refused_while_a_call_speaks_on(
    server: Served,
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
    tmp_path: Path,
) -> None:
    caller = Caller(server.http, "demo")
    caller.keep_luma = False
    await caller.connect(microphone=None)
    try:
        await caller.wait_for_frames(1)
        pcm, _ = speech_16k
        wav = write_wav(tmp_path / "speech.wav", pcm, 16_000).read_bytes()
        for _ in range(3):  # ~12 s of speech queued: the call speaks through all of this
            await _speak(server, caller.session_id, wav)
        before = await session_state(server.http, caller.session_id)

        url = f"/v2/models/{MODEL}/infer"
        for what, body, headers, words in _rest_abuse():
            response = await server.http.post(url, data=io.BytesIO(body), headers=headers)
            error: dict[str, Any] = await response.json()
            assert response.status == 400, (what, error)
            assert isinstance(error["error"], str), what
            assert words in error["error"], (what, error)

        limit = message_limits().receive_bytes
        async with grpc.aio.insecure_channel(server.address) as channel:
            infer = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            # 76 MiB, from a client of its own, as an abuser is: made, copied and sent in
            # this process, it competed for the interpreter the served call shares with
            # the test, which no other client can (10 of 75 frames late once on a loaded
            # CI machine, not reproduced here).
            assert await _oversized_from_another_process(server.address, limit + 1) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED.name
            )
            absurd = _grpc_request([1, 6, 320, 2**40], bytes(FRAME_BYTES))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await infer(absurd)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "shape" in (refused.value.details() or "")
            short = _grpc_request([1, 6, 320, 320], bytes(FRAME_BYTES - 4))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await infer(short)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

            # The doors still serve a good request...
            visual, audio = float_inputs(1)
            good = _grpc_request([1, 6, 320, 320], visual.tobytes(), audio.tobytes())
            answer = await infer(good)
            assert len(answer.raw_output_contents[0]) == 3 * 320 * 320 * 4

        # ...and the call kept speaking: over the 3 s from the abuse on, it lip-synced what
        # it was due to, at the default margin.
        async def spoke_on() -> dict[str, Any] | None:
            state = await session_state(server.http, caller.session_id)
            return state if frames_due(since(before, state)) >= 75 else None

        state = await until(spoke_on, "3 s more of the call's speech")
        assert state["state"] == "streaming"
        assert_lip_synced(since(before, state), due_at_least=75)
    finally:
        await caller.close()


#: Sends one ModelInfer request of argv[2] bytes of visual input to argv[1] and prints
#: the status it ends with.
_OVERSIZED = """
import sys
import grpc
from web.inference.protos import grpc_service_pb2 as pb

address, size = sys.argv[1], int(sys.argv[2])
request = pb.ModelInferRequest(model_name=sys.argv[3])
request.raw_input_contents.append(bytes(size))
with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 2 * size)]) as c:
    infer = c.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    try:
        infer(request.SerializeToString(), timeout=60)
        print("OK")
    except grpc.RpcError as error:
        print(error.code().name)
"""


async def _oversized_from_another_process(address: str, size: int) -> str:
    """The status a request of ``size`` bytes sent by another process ends with."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _OVERSIZED,
        address,
        str(size),
        MODEL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, err.decode()
    return out.decode().strip()


def _grpc_request(
    shape: list[int], visual: bytes, audio: bytes | None = None
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name=VISUAL_NAME, datatype="FP32")
    tensor.shape.extend(shape)
    tensor = request.inputs.add(name=AUDIO_NAME, datatype="FP32")
    tensor.shape.extend([1, 32, 16, 16])
    request.raw_input_contents.extend([visual, audio or bytes(AUDIO_BYTES)])
    return request
