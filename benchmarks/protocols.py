"""Raw inference through each front door: served / raw, and what a request costs.

    .venv/bin/python -m benchmarks.run --only protocols [--quick]
    .venv/bin/python -m benchmarks.protocols [--rounds 3] [--seconds 4] [--json out.json]

For each model (the benchmark UNet, ≈4.9 GMAC/frame, and the demo lip-sync model) a
``lipstream serve`` process serves it on one CPU device and this process is its clients:

1. Raw: the model's own float ONNX interface in a plain onnxruntime session here,
   ``session.run`` back to back at the best batch of a 1/2/4/8 sweep (the server is idle).
2. Served: 1, 4 and 8 concurrent clients, each sending requests of
   ``FRAMES_PER_REQUEST`` frames back to back through one door: ``POST /v1/infer``
   (aiohttp), the Open Inference Protocol over REST (``tritonclient.http.aio``, binary
   tensors, its default) and gRPC (``tritonclient.grpc.aio``), and the seed's
   ``InferBatch`` (stubs protoc builds from ``web/inference/protos``). Every door takes
   the model's float contract (the seed's only one): ``[N,6,S,S]`` + ``[N,32,16,16]``
   float32 → ``[N,3,S,S]`` float32.

Raw and served segments alternate for ``--rounds`` rounds (which goes first alternates
too); the figure is the median of the rounds' served/raw ratios. Target: >= 0.9 of raw
on the benchmark UNet for each door at 8 clients (the clients share the machine's cores
with the server, as a compositing server on the same node would).

Per-request overhead: on the demo model, one client, one frame per request, the median
request time through each door minus the median ``session.run`` of one frame here. The
bytes each door copies per frame are counted from its code path
(``docs/design/inference-protocols.md`` §17) and printed with the figures. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import numpy as np
import onnxruntime as ort

from benchmarks.common import Result, Target, print_table, print_targets
from inference_core.adapter.spec import AdapterSpec
from inference_core.assets.benchmark_model import DEFAULT_WIDTH, build_benchmark_unet
from inference_core.assets.demo_avatar import write_demo_avatar

CLIENT_COUNTS = (1, 4, 8)
DOORS = ("v1_infer", "oip_rest", "oip_grpc", "seed_grpc")
FRAMES_PER_REQUEST = 4
TARGET_RATIO = 0.9
MODEL_ID = "bench"
PROTOS = Path(__file__).resolve().parent.parent / "web" / "inference" / "protos"
LIPSTREAM = Path(sys.executable).parent / "lipstream"

#: Bytes each door copies per frame beyond what every door shares (the scheduler's copy
#: into the batch buffer): see the module doc. Keyed by door: (input copies, output copies).
COPIES = {
    "v1_infer": (1, 0),  # the body is read into one bytes object; the answer is written from
    # the outputs' own buffer
    "oip_rest": (1, 0),  # the same, plus the JSON header (a few hundred bytes)
    "oip_grpc": (1, 1),  # grpc reads the message into one bytes object, which the tensors
    # view (web/inference/grpc_wire.py); the outputs' bytes are joined once to the small
    # fields protobuf serialises. (grpc's copy of the answer into its send buffer is the
    # transport's, uncounted as the HTTP doors' socket writes are.) Before the split:
    # (3, 3): parsed into protobuf, then each raw_input_contents read copied again;
    # tobytes, into raw_output_contents, serialised
    "seed_grpc": (1, 1),  # the same: visual_frames and audio_features viewed, each
    # RawMouthRegion written around its frame. Before: (3, 4), a RawMouthRegion per frame
    # copied again into the response
}


@dataclass
class Served:
    """A ``lipstream serve`` process: its HTTP base URL and gRPC address."""

    proc: asyncio.subprocess.Process
    http_url: str
    grpc_address: str
    log: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def serve(root: Path, batch: int, source: Path | None = None) -> AsyncIterator[Served]:
    """``lipstream serve`` on ``root``'s avatars, one CPU device, batches of ``batch``;
    the code of the source tree ``source`` when given (``benchmarks/grpc_cpu.py``)."""
    port, grpc_port = _free_port(), _free_port()
    config = root / "lipstream.yaml"
    config.write_text(
        f"server:\n  port: {port}\n  grpc_port: {grpc_port}\n  request_timeout_s: 120\n"
        f"avatars:\n  root: {root / 'avatars'}\n  data_dir: {root / 'data'}\n  demo: false\n"
        "devices:\n  kind: cpu\n  count: 1\n"
        f"batching:\n  max_batch_size: {batch}\n  max_wait_ms: 5\n  queue_size: 256\n"
        f"registry:\n  models:\n    {MODEL_ID}:\n      preload: true\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIPSTREAM_")}
    if source is not None:  # ahead of the installed (editable) lipstream on sys.path
        env["PYTHONPATH"] = str(source)
    log = root / "server.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            str(LIPSTREAM), "--config", str(config), "serve", env=env, stderr=err
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as probe, asyncio.timeout(120):
            while True:
                assert proc.returncode is None, log.read_text(errors="replace")
                with contextlib.suppress(aiohttp.ClientError):
                    async with probe.get(f"{url}/v2/models/{MODEL_ID}/ready") as response:
                        if response.status == 200:
                            break
                await asyncio.sleep(0.2)  # polling for start-up
        yield Served(proc, url, f"127.0.0.1:{grpc_port}", log)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def seed_stubs(out: Path) -> tuple[ModuleType, ModuleType]:
    """The seed's messages and stub, built by protoc from our .proto as a client would."""
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    code = protoc.main(
        [
            "protoc",
            f"-I{PROTOS}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(PROTOS / "inference_service.proto"),
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed ({code}) on {PROTOS / 'inference_service.proto'}")
    sys.path.insert(0, str(out))
    try:
        return (
            importlib.import_module("inference_service_pb2"),
            importlib.import_module("inference_service_pb2_grpc"),
        )
    finally:
        sys.path.remove(str(out))


Request = Callable[[np.ndarray, np.ndarray], Awaitable[int]]


class Doors:
    """One client of each door; ``request(door)`` sends one request, returns its frames."""

    def __init__(self, served: Served, stubs_dir: Path, names: tuple[str, str]) -> None:
        import grpc
        import tritonclient.grpc.aio as triton_grpc
        import tritonclient.http.aio as triton_http

        self._grpc = grpc
        self._triton_grpc = triton_grpc
        self._triton_http = triton_http
        self.served = served
        self.visual_name, self.audio_name = names
        self.seed_messages, seed_grpc = seed_stubs(stubs_dir)
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        self.rest = triton_http.InferenceServerClient(
            served.http_url.removeprefix("http://"), conn_limit=16, conn_timeout=300
        )
        self.grpc_client = triton_grpc.InferenceServerClient(served.grpc_address)
        limit = 128 * 1024 * 1024
        self.channel = grpc.aio.insecure_channel(
            served.grpc_address,
            options=[
                ("grpc.max_send_message_length", limit),
                ("grpc.max_receive_message_length", limit),
            ],
        )
        self.seed = seed_grpc.InferenceServiceStub(self.channel)

    async def close(self) -> None:
        await self.http.close()
        await self.rest.close()
        await self.grpc_client.close()
        await self.channel.close()

    def request(self, door: str) -> Request:
        return {
            "v1_infer": self._v1,
            "oip_rest": self._rest,
            "oip_grpc": self._oip_grpc,
            "seed_grpc": self._seed,
        }[door]

    async def _v1(self, visual: np.ndarray, audio: np.ndarray) -> int:
        n = len(visual)
        url = f"{self.served.http_url}/v1/infer/{MODEL_ID}?batch_size={n}"
        body = visual.tobytes() + audio.tobytes()
        headers = {"Content-Type": "application/octet-stream"}
        async with self.http.post(url, data=body, headers=headers) as response:
            data = await response.read()
            if response.status != 200:
                raise RuntimeError(f"/v1/infer: {response.status} {data[:200]!r}")
        return n

    async def _rest(self, visual: np.ndarray, audio: np.ndarray) -> int:
        inputs = self._inputs(self._triton_http, visual, audio)
        result = await self.rest.infer(MODEL_ID, inputs)
        assert result.as_numpy(result.get_response()["outputs"][0]["name"]) is not None
        return len(visual)

    async def _oip_grpc(self, visual: np.ndarray, audio: np.ndarray) -> int:
        inputs = self._inputs(self._triton_grpc, visual, audio)
        result = await self.grpc_client.infer(MODEL_ID, inputs)
        assert len(result.get_response().raw_output_contents) == 1
        return len(visual)

    async def _seed(self, visual: np.ndarray, audio: np.ndarray) -> int:
        request = self.seed_messages.InferBatchRequest(
            model_id=MODEL_ID,
            visual_frames=visual.tobytes(),
            audio_features=audio.tobytes(),
            batch_size=len(visual),
        )
        reply = await self.seed.InferBatch(request)
        assert len(reply.outputs) == len(visual)
        return len(visual)

    def _inputs(self, module: Any, visual: np.ndarray, audio: np.ndarray) -> list[Any]:
        pair = []
        for name, array in ((self.visual_name, visual), (self.audio_name, audio)):
            tensor = module.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            pair.append(tensor)
        return pair


def _inputs(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    spec = AdapterSpec()
    visual = rng.random((n, *spec.visual_shape), dtype=np.float32)
    audio = rng.normal(0, 1, (n, *spec.audio_shape)).astype(np.float32)
    return visual, audio


class RawRunner:
    """Back-to-back ``session.run`` of the model's own float interface."""

    def __init__(self, model: Path) -> None:
        self.session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        # Bound by shape, as lipstream binds them: the visual input has 6 channels.
        inputs = self.session.get_inputs()
        self.visual_name = next(i.name for i in inputs if i.shape[1] == 6)
        self.audio_name = next(i.name for i in inputs if i.name != self.visual_name)
        self.rng = np.random.default_rng(0)

    def feeds(self, n: int) -> dict[str, np.ndarray]:
        visual, audio = _inputs(n, self.rng)
        return {self.visual_name: visual, self.audio_name: audio}

    def frames_in(self, n: int, seconds: float) -> tuple[int, float]:
        feeds = self.feeds(n)
        self.session.run(None, feeds)  # warm this batch size
        frames, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            self.session.run(None, feeds)
            frames += n
        return frames, time.perf_counter() - start

    def run_ms(self, n: int, repeats: int) -> float:
        feeds = self.feeds(n)
        self.session.run(None, feeds)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            self.session.run(None, feeds)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1000


async def drive(request: Request, clients: int, seconds: float) -> tuple[int, float]:
    """``clients`` clients sending requests back to back for ``seconds``; frames served and
    the time to the last answer (work under way at the end counts, as in core_throughput)."""
    visual, audio = _inputs(FRAMES_PER_REQUEST, np.random.default_rng(1))
    stop_at = time.monotonic() + seconds
    done = 0
    start = time.perf_counter()

    async def client() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            # Not ``done += await ...``: that reads ``done`` before the await, and the
            # clients' increments would overwrite each other.
            frames = await request(visual, audio)
            done += frames

    await asyncio.gather(*(client() for _ in range(clients)))
    return done, time.perf_counter() - start


async def overhead_us(doors: Doors, raw: RawRunner, repeats: int) -> dict[str, float]:
    """Median one-frame request time through each door minus one ``session.run``."""
    visual, audio = _inputs(1, np.random.default_rng(2))
    loop = asyncio.get_running_loop()
    result: dict[str, float] = {}
    for door in DOORS:
        request = doors.request(door)
        await request(visual, audio)
        times = []
        raws = []
        for _ in range(repeats):  # alternated: both see the same machine
            start = time.perf_counter()
            await request(visual, audio)
            times.append(time.perf_counter() - start)
            raws.append(await loop.run_in_executor(None, raw.run_ms, 1, 1))
        result[door] = (statistics.median(times) * 1000 - statistics.median(raws)) * 1000
    return result


async def measure_model(root: Path, model: Path, rounds: int, seconds: float) -> Result:
    raw = RawRunner(model)
    loop = asyncio.get_running_loop()
    sweep = {
        b: await loop.run_in_executor(None, raw.frames_in, b, seconds / 2) for b in (1, 2, 4, 8)
    }
    sweep_fps = {b: f / s for b, (f, s) in sweep.items()}
    best = max(sweep_fps, key=lambda b: sweep_fps[b])
    by_door: dict[str, dict[int, Result]] = {}
    async with serve(root, best) as served:
        doors = Doors(served, root / "stubs", (raw.visual_name, raw.audio_name))
        try:
            for door in DOORS:
                request = doors.request(door)
                by_door[door] = {}
                for clients in CLIENT_COUNTS:
                    await drive(request, clients, 0.5)  # warm this door and concurrency
                    ratios, served_total, raw_total = [], [0.0, 0.0], [0.0, 0.0]
                    for i in range(rounds):
                        served_first = i % 2 == 1
                        if served_first:
                            s_frames, s_secs = await drive(request, clients, seconds)
                        r_frames, r_secs = await loop.run_in_executor(
                            None, raw.frames_in, best, seconds
                        )
                        if not served_first:
                            s_frames, s_secs = await drive(request, clients, seconds)
                        ratios.append((s_frames / s_secs) / (r_frames / r_secs))
                        served_total = [served_total[0] + s_frames, served_total[1] + s_secs]
                        raw_total = [raw_total[0] + r_frames, raw_total[1] + r_secs]
                    by_door[door][clients] = {
                        "served_fps": served_total[0] / served_total[1],
                        "raw_fps": raw_total[0] / raw_total[1],
                        "ratio": statistics.median(ratios),
                        "round_ratios": ratios,
                    }
            overhead = await overhead_us(doors, raw, repeats=30 if rounds > 2 else 15)
        finally:
            await doors.close()
    return {"sweep_fps": sweep_fps, "best_batch": best, "doors": by_door, "overhead_us": overhead}


def _bytes_copied(spec: AdapterSpec) -> dict[str, int]:
    frame_in = (int(np.prod(spec.visual_shape)) + int(np.prod(spec.audio_shape))) * 4
    frame_out = int(np.prod(spec.output_shape)) * 4
    return {door: i * frame_in + o * frame_out for door, (i, o) in COPIES.items()}


async def _measure_all(root: Path, rounds: int, seconds: float, width: int) -> dict[str, Result]:
    results: dict[str, Result] = {}
    for name in ("benchmark_unet", "demo_model"):
        model_root = root / name
        package = write_demo_avatar(model_root / "avatars" / MODEL_ID, count=2)
        model = package / "lipsync.onnx"
        if name == "benchmark_unet":
            build_benchmark_unet(model, width=width)
        results[name] = await measure_model(model_root, model, rounds, seconds)
    return results


def run(
    quick: bool = False,
    *,
    rounds: int | None = None,
    seconds: float | None = None,
    width: int = DEFAULT_WIDTH,
) -> Result:
    """Measure both models through every door, print the tables, return JSON-able results."""
    rounds = rounds or (2 if quick else 3)
    seconds = seconds or (3.0 if quick else 4.0)
    with tempfile.TemporaryDirectory() as tmp:
        models = asyncio.run(_measure_all(Path(tmp), rounds, seconds, width))
    rows = []
    targets = []
    for name, result in models.items():
        doors = result["doors"]
        for door in DOORS:
            for clients, figures in doors[door].items():
                rows.append(
                    [
                        name,
                        door,
                        clients,
                        figures["raw_fps"],
                        figures["served_fps"],
                        f"**{figures['ratio']:.3f}**",
                        f"{min(figures['round_ratios']):.3f}–{max(figures['round_ratios']):.3f}",
                    ]
                )
            if name == "benchmark_unet":
                targets.append(
                    Target(
                        f"{door} served/raw at 8 clients (benchmark UNet)",
                        doors[door][8]["ratio"],
                        TARGET_RATIO,
                        higher_is_better=True,
                    )
                )
    print_table(
        f"Raw inference through each door ({rounds} rounds x {seconds:g} s per segment, "
        f"{FRAMES_PER_REQUEST} float32 frames per request, benchmark UNet width {width})",
        ["model", "door", "clients", "raw frames/s", "served frames/s", "served / raw", "rounds"],
        rows,
    )
    copied = _bytes_copied(AdapterSpec())
    overhead = models["demo_model"]["overhead_us"]
    print_table(
        "What one request costs beyond the model (demo model, 1 client, 1 frame)",
        ["door", "overhead per request (µs)", "bytes copied per frame (beyond the batch copy)"],
        [[door, round(overhead[door]), copied[door]] for door in DOORS],
    )
    print_targets(targets)
    return {
        "models": models,
        "rounds": rounds,
        "seconds": seconds,
        "width": width,
        "frames_per_request": FRAMES_PER_REQUEST,
        "bytes_copied_per_frame": copied,
        "targets": [t.as_json() for t in targets],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--width", type=int, default=DEFAULT_WIDTH)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(rounds=args.rounds, seconds=args.seconds, width=args.width)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
