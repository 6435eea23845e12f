"""The raw batch inference API over real HTTP and a real inference core."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from config.settings import Settings
from inference_core.adapter.lipsync import LipSyncAdapter
from inference_core.adapter.spec import AdapterSpec
from tests.packages import make_package
from web.app import build_app

VISUAL = (6, 320, 320)
AUDIO = (32, 16, 16)


def _settings(root: Path) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
            "devices": {"kind": "cpu", "count": 2, "workers_per_device": 2},
            "batching": {"max_batch_size": 2, "max_wait_ms": 2},
        }
    )


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[TestClient[object, object]]:
    root = tmp_path / "avatars"
    make_package(root / "alice")
    app = build_app(_settings(root))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


def _body(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, bytes]:
    rng = np.random.default_rng(seed)
    visual = rng.random((n, *VISUAL), dtype=np.float32)
    audio = rng.normal(0, 1, (n, *AUDIO)).astype(np.float32)
    return visual, audio, visual.astype("<f4").tobytes() + audio.astype("<f4").tobytes()


async def test_round_trip_matches_the_model(
    client: TestClient[object, object], tmp_path: Path
) -> None:
    visual, audio, body = _body(5)  # more than max_batch_size: split into chunks
    response = await client.post("/v1/infer/alice?batch_size=5", data=io.BytesIO(body))
    assert response.status == 200, await response.text()
    assert response.headers["X-Lipstream-Device"] in {"cpu:0", "cpu:1"}
    assert float(response.headers["X-Lipstream-Inference-Ms"]) > 0
    assert response.headers["X-Lipstream-Output-Shape"] == "5,3,320,320"
    out = np.frombuffer(await response.read(), dtype="<f4").reshape(5, 3, 320, 320)
    model_path = tmp_path / "avatars" / "alice" / "lipsync.onnx"
    direct = LipSyncAdapter.from_path(model_path, AdapterSpec())
    np.testing.assert_allclose(out, direct.run_raw(visual, audio), atol=1e-6)


async def test_uint8_regions_get_faces_a_quarter_of_the_bytes(
    client: TestClient[object, object], tmp_path: Path
) -> None:
    rng = np.random.default_rng(3)
    regions = rng.integers(0, 256, (3, 320, 320, 3), dtype=np.uint8)
    audio = rng.normal(0, 1, (3, *AUDIO)).astype(np.float32)
    body = regions.tobytes() + audio.astype("<f4").tobytes()
    assert len(body) < len(_body(3)[2]) / 3  # vs the float contract's body
    headers = {"Content-Type": "application/vnd.lipstream.uint8"}
    response = await client.post(
        "/v1/infer/alice?batch_size=3", data=io.BytesIO(body), headers=headers
    )
    assert response.status == 200, await response.text()
    assert response.headers["Content-Type"] == "application/vnd.lipstream.uint8"
    assert response.headers["X-Lipstream-Output-Shape"] == "3,320,320,3"
    faces = np.frombuffer(await response.read(), dtype=np.uint8).reshape(3, 320, 320, 3)
    model_path = tmp_path / "avatars" / "alice" / "lipsync.onnx"
    np.testing.assert_array_equal(
        faces, LipSyncAdapter.from_path(model_path, AdapterSpec()).run(regions, audio)
    )
    # The size a uint8 body must have is its own; other content types are refused.
    short = await client.post(
        "/v1/infer/alice?batch_size=3", data=io.BytesIO(body[:-4]), headers=headers
    )
    assert short.status == 400
    assert "3x[320, 320, 3] uint8" in (await short.json())["error"]["message"]
    text = await client.post(
        "/v1/infer/alice?batch_size=3", data=b"x", headers={"Content-Type": "text/plain"}
    )
    assert text.status == 415
    assert (await text.json())["error"]["code"] == "bad_content_type"


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/v1/infer/alice", 400, "missing_batch_size"),
        ("/v1/infer/alice?batch_size=zero", 400, "bad_batch_size"),
        ("/v1/infer/alice?batch_size=0", 400, "bad_batch_size"),
        ("/v1/infer/alice?batch_size=33", 400, "bad_batch_size"),
        ("/v1/infer/nobody?batch_size=1", 404, "model_not_found"),
        ("/v1/infer/Bad.Id?batch_size=1", 400, "invalid_model_id"),
    ],
)
async def test_bad_requests_get_json_errors(
    client: TestClient[object, object], path: str, status: int, code: str
) -> None:
    _, _, body = _body(1)
    response = await client.post(path, data=io.BytesIO(body))
    assert response.status == status
    error = (await response.json())["error"]
    assert error["code"] == code
    assert error["message"]


async def test_wrong_body_sizes_are_rejected(client: TestClient[object, object]) -> None:
    _, _, body = _body(2)
    short = await client.post("/v1/infer/alice?batch_size=2", data=io.BytesIO(body[:-4]))
    assert short.status == 400
    assert "must be exactly" in (await short.json())["error"]["message"]
    long = await client.post("/v1/infer/alice?batch_size=1", data=io.BytesIO(body))
    assert long.status == 413
    assert (await long.json())["error"]["code"] == "bad_body_size"
    visual, audio, _ = _body(1)
    visual[0, 0, 0, 0] = np.nan
    nan = await client.post(
        "/v1/infer/alice?batch_size=1", data=io.BytesIO(visual.tobytes() + audio.tobytes())
    )
    assert nan.status == 400
    # the server keeps serving after bad requests
    _, _, good = _body(1)
    assert (await client.post("/v1/infer/alice?batch_size=1", data=io.BytesIO(good))).status == 200


async def test_unknown_route_is_json_404(client: TestClient[object, object]) -> None:
    response = await client.get("/v1/nothing")
    assert response.status == 404
    assert (await response.json())["error"]["code"] == "not_found"
