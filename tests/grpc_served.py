"""An in-process lipstream app with its gRPC front doors, for the gRPC tests.

The app runs its startup under aiohttp's test server (so ``/v1/infer`` answers over real
HTTP too) and the gRPC listener opens on a free loopback port, as ``lipstream serve``
opens it (``web.inference.grpc_server.start_inference_grpc``). The avatar's model has
inputs with names of its own, in an unusual order, so the protocols must use the
model's names rather than guess them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from grpc_tools import protoc

from config.settings import Settings
from inference_core.serving.core import InferenceCore
from tests.onnx_builders import tiny_lipsync
from tests.packages import make_package
from web.app import build_app
from web.app_keys import CORE
from web.inference.grpc_server import GrpcListener, start_inference_grpc

PROTOS = Path(__file__).resolve().parent.parent / "web" / "inference" / "protos"
MODEL = "alice"
VISUAL_NAME = "face_crop_in"
AUDIO_NAME = "ave_window"
OUTPUT_NAME = "output"
S = 320
VISUAL = (6, S, S)
AUDIO = (32, 16, 16)
REGION = (S, S, 3)


def make_avatar(root: Path, model_id: str = MODEL) -> Path:
    """A valid avatar package whose model names its inputs its own way, audio first."""
    directory = make_package(root / model_id)
    tiny_lipsync(
        directory / "lipsync.onnx", visual_name=VISUAL_NAME, audio_name=AUDIO_NAME, audio_first=True
    )
    return directory


def settings_for(root: Path, **sections: Mapping[str, Any]) -> Settings:
    """One CPU device with one worker (queues and batches the tests can reason about)."""
    base: dict[str, Any] = {
        "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
        "devices": {"kind": "cpu", "count": 1, "workers_per_device": 1},
        "batching": {"max_batch_size": 8, "max_wait_ms": 2},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return Settings.model_validate(base)


@dataclass
class Served:
    app: web.Application
    http: TestClient[Any, Any]
    grpc: GrpcListener
    core: InferenceCore

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc.port}"


@asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[Served]:
    """The app of ``settings`` with HTTP and gRPC listening on loopback."""
    app = build_app(settings)
    async with TestClient(TestServer(app, host="127.0.0.1")) as http:
        listener = await start_inference_grpc(app, "127.0.0.1", 0)
        try:
            yield Served(app, http, listener, app[CORE])
        finally:
            await listener.close(None)


def float_inputs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` float visual inputs in [0,1) and ``n`` audio windows."""
    rng = np.random.default_rng(seed)
    visual = rng.random((n, *VISUAL), dtype=np.float32)
    audio = rng.normal(0, 1, (n, *AUDIO)).astype(np.float32)
    return visual, audio


def uint8_inputs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` BGR model regions and ``n`` audio windows."""
    rng = np.random.default_rng(seed)
    regions = rng.integers(0, 256, (n, *REGION), dtype=np.uint8)
    audio = rng.normal(0, 1, (n, *AUDIO)).astype(np.float32)
    return regions, audio


@dataclass(frozen=True)
class SeedStubs:
    messages: ModuleType  # inference_service_pb2
    services: ModuleType  # inference_service_pb2_grpc


@contextmanager
def seed_stubs(out: Path) -> Iterator[SeedStubs]:
    """The stubs a seed client makes from our .proto with protoc, written to ``out`` and
    imported from there (and forgotten again afterwards)."""
    args = ["protoc", f"-I{PROTOS}", f"--python_out={out}", f"--grpc_python_out={out}"]
    assert protoc.main([*args, str(PROTOS / "inference_service.proto")]) == 0
    sys.path.insert(0, str(out))
    try:
        yield SeedStubs(
            importlib.import_module("inference_service_pb2"),
            importlib.import_module("inference_service_pb2_grpc"),
        )
    finally:
        sys.path.remove(str(out))
        for name in ("inference_service_pb2_grpc", "inference_service_pb2"):
            sys.modules.pop(name, None)
