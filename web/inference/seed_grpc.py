"""The seed's raw inference service over gRPC: ``inference.InferenceService``.

The service the seed's compositing servers call (``protos/inference_service.proto``
says which fields are the seed's and which are ours), through the same inference door
as the Open Inference Protocol and ``/v1/infer`` (``web/inference/door.py``):

* ``InferBatch``: ``batch_size`` frames of the model's float contract (the visual inputs
  then the audio windows, float32, in two byte fields) → one ``RawMouthRegion`` per
  frame (float32 ``[3,S,S]``, channel-planar), bit for bit what ``/v1/infer`` answers.
* ``ListModels``: every registered model with its state, device, memory and figures.
* ``LoadModel``: load now (on ``device_index`` if given), with the admin API's rule.
* ``GetModelStats``: one model's figures or every model's, with totals.
* ``Health``: whether the server takes work, each device's memory and queue, totals.

``InferBatch`` takes and gives the bytes on the wire (``web/inference/grpc_wire.py``):
``visual_frames`` and ``audio_features`` are views of the bytes grpc received, and each
``RawMouthRegion`` is written around its frame of the output array, joined once to the
small fields protobuf serialises. Failures are gRPC status codes, not ``success=false``
(``web/inference/grpc_status.py``); ``gpu_id`` is the CUDA ordinal of a GPU and -1 for
the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from aiohttp import web
from pydantic import SecretStr

from inference_core.serving.snapshot import DeviceSnapshot, ModelSnapshot
from streaming.live.manager import SessionManager
from web.app_keys import DOOR, DRAINING, SESSIONS, SETTINGS, DrainState
from web.errors import RequestError
from web.inference.contract import TensorInfo, frames
from web.inference.door import InferenceDoor, ModelStatistics
from web.inference.grpc_status import Context, GrpcService, check_admin, raw_unary, unary
from web.inference.grpc_wire import Buffer, Splitter, array_bytes, delimited
from web.inference.oip_grpc import ready, server_version
from web.inference.protos import inference_service_pb2 as pb
from web.schemas.inference import MAX_REQUEST_FRAMES

SERVICE = "inference.InferenceService"

#: InferBatchRequest with its tensors as views of the wire bytes.
_INFER_BATCH = Splitter(pb.InferBatchRequest, "visual_frames", "audio_features")
_OUTPUTS = pb.InferBatchResponse.DESCRIPTOR.fields_by_name["outputs"].number
_REGION_DATA = pb.RawMouthRegion.DESCRIPTOR.fields_by_name["data"].number


class SeedServicer:
    """The service's methods, over one app's inference door."""

    def __init__(
        self,
        door: InferenceDoor,
        draining: DrainState,
        sessions: SessionManager,
        admin_token: SecretStr | None,
    ) -> None:
        self._door = door
        self._draining = draining
        self._sessions = sessions
        self._admin_token = admin_token

    async def infer_batch(self, wire: bytes, context: Context) -> bytes:
        """An InferBatchRequest's wire bytes → its InferBatchResponse's (module doc)."""
        split = _INFER_BATCH(wire)
        request = split.message
        model_id, n = request.model_id, request.batch_size
        self._door.check_model(model_id)
        if not 1 <= n <= MAX_REQUEST_FRAMES:
            raise _bad(
                f"batch_size must be 1 to {MAX_REQUEST_FRAMES} frames, got {n} "
                "(larger batches: split them)"
            )
        contract = await self._door.infer_contract(model_id, "float")
        visual, audio = split.last("visual_frames"), split.last("audio_features")
        _check_size("visual_frames", visual.nbytes, contract.visual, n)
        _check_size("audio_features", audio.nbytes, contract.audio, n)
        arrays = frames(contract, n, {contract.visual.name: visual, contract.audio.name: audio})
        result = await self._door.infer(contract, *arrays)
        rest = pb.InferBatchResponse(
            inference_time_ms=result.elapsed_ms,
            success=True,
            gpu_id=gpu_id(result.device),
            device=result.device,
        )
        return batch_response(rest, result.outputs)

    async def list_models(
        self, request: pb.ListModelsRequest, context: Context
    ) -> pb.ListModelsResponse:
        snapshot = await self._door.core.snapshot()
        figures = {s.model_id: s for s in await self._door.statistics(snapshot=snapshot)}
        return pb.ListModelsResponse(
            models=[_model_info(m, figures.get(m.model_id)) for m in snapshot.models]
        )

    async def load_model(
        self, request: pb.LoadModelRequest, context: Context
    ) -> pb.LoadModelResponse:
        check_admin(context, self._admin_token)
        model_id = request.model_id
        self._door.check_model(model_id)
        device = request.device_index if request.HasField("device_index") else None
        devices = self._door.core.devices
        if device is not None and not 0 <= device < len(devices):
            names = ", ".join(f"{d.index}={d.name}" for d in devices)
            raise RequestError(
                400, "bad_device", f"device_index {device} does not exist (devices: {names})"
            )
        started = time.perf_counter()
        await self._door.load(model_id, device)
        load_ms = (time.perf_counter() - started) * 1000
        snapshot = await self._door.core.snapshot()
        model = snapshot.model(model_id)
        figures = await self._door.statistics(model_id, snapshot)
        assert model is not None  # registered: check_model said so
        return pb.LoadModelResponse(
            success=True, model=_model_info(model, figures[0]), load_ms=load_ms
        )

    async def get_model_stats(
        self, request: pb.GetModelStatsRequest, context: Context
    ) -> pb.GetModelStatsResponse:
        if request.model_id:
            self._door.check_model(request.model_id)
        snapshot = await self._door.core.snapshot()
        figures = {s.model_id: s for s in await self._door.statistics(snapshot=snapshot)}
        every = [_model_stats(m, figures.get(m.model_id)) for m in snapshot.models]
        listed = [s for s in every if s.model_id == request.model_id] if request.model_id else every
        return pb.GetModelStatsResponse(models=listed, totals=_totals(snapshot.models, every))

    async def health(self, request: pb.HealthRequest, context: Context) -> pb.HealthResponse:
        healthy = await ready(self._door, self._draining)
        snapshot = await self._door.core.snapshot()
        figures = {s.model_id: s for s in await self._door.statistics(snapshot=snapshot)}
        stats = [_model_stats(m, figures.get(m.model_id)) for m in snapshot.models]
        if self._draining.draining:
            status = "draining"
        else:
            status = "serving" if healthy else "unavailable"
        return pb.HealthResponse(
            healthy=healthy,
            status=status,
            version=server_version(),
            devices=[_device_health(d) for d in snapshot.devices],
            totals=_totals(snapshot.models, stats),
            live_sessions=self._sessions.live_count,
        )


def seed_service(app: web.Application) -> GrpcService:
    """The service over a started app's inference door."""
    s = SeedServicer(app[DOOR], app[DRAINING], app[SESSIONS], app[SETTINGS].server.admin_token)
    return GrpcService(
        SERVICE,
        {
            "InferBatch": raw_unary(s.infer_batch),
            "ListModels": unary(s.list_models, pb.ListModelsRequest.FromString),
            "LoadModel": unary(s.load_model, pb.LoadModelRequest.FromString),
            "GetModelStats": unary(s.get_model_stats, pb.GetModelStatsRequest.FromString),
            "Health": unary(s.health, pb.HealthRequest.FromString),
        },
    )


def batch_response(rest: pb.InferBatchResponse, outputs: np.ndarray) -> bytes:
    """``rest`` with one ``RawMouthRegion`` per frame of ``outputs`` as its outputs,
    serialised with each frame's bytes copied once. outputs is the message's first field,
    so these are the bytes ``SerializeToString`` would write."""
    parts: list[Buffer] = []
    for frame in outputs:
        parts += delimited(_OUTPUTS, delimited(_REGION_DATA, [array_bytes(frame)]))
    parts.append(rest.SerializeToString())
    return b"".join(parts)


def gpu_id(device: str) -> int:
    """The seed's device number: the CUDA ordinal of ``cuda:N``, -1 for anything else."""
    kind, _, number = device.partition(":")
    return int(number) if kind == "cuda" and number.isdigit() else -1


def _check_size(field: str, size: int, tensor: TensorInfo, n: int) -> None:
    expected = n * tensor.frame_bytes
    if size != expected:
        shape = "x".join(map(str, tensor.frame_shape))
        raise _bad(
            f"{field} must be {expected} bytes for batch_size={n} ({n} x {shape} float32), "
            f"got {size}"
        )


def _model_info(model: ModelSnapshot, figures: ModelStatistics | None) -> pb.ModelInfo:
    return pb.ModelInfo(
        model_id=model.model_id,
        loaded=model.state == "loaded",
        state=model.state,
        device=model.device or "",
        gpu_id=gpu_id(model.device or ""),
        memory_bytes=model.memory_bytes,
        last_error=model.last_error or "",
        stats=_model_stats(model, figures),
    )


def _model_stats(model: ModelSnapshot, figures: ModelStatistics | None) -> pb.ModelStats:
    stats = pb.ModelStats(
        model_id=model.model_id,
        frames=model.frames,
        batches=model.batches,
        failed_frames=model.failures,
        inference_ms=model.inference_ms_total,
        mean_ms_per_frame=model.mean_ms_per_frame,
        in_use=model.refcount,
    )
    if figures is not None:  # a model registered since the figures were read has none
        stats.requests = figures.requests.success_count
        stats.failed_requests = figures.requests.fail_count
        stats.last_inference_ms = figures.requests.last_inference_ms
    return stats


def _totals(models: Sequence[ModelSnapshot], stats: Sequence[pb.ModelStats]) -> pb.Totals:
    return pb.Totals(
        models_registered=len(models),
        models_loaded=sum(1 for m in models if m.state == "loaded"),
        requests=sum(s.requests for s in stats),
        failed_requests=sum(s.failed_requests for s in stats),
        frames=sum(s.frames for s in stats),
        batches=sum(s.batches for s in stats),
        model_memory_bytes=sum(m.memory_bytes for m in models),
    )


def _device_health(device: DeviceSnapshot) -> pb.DeviceHealth:
    return pb.DeviceHealth(
        name=device.name,
        kind=device.kind,
        gpu_id=gpu_id(device.name),
        memory_used_bytes=device.memory_used_bytes,
        memory_total_bytes=device.memory_total_bytes or 0,
        model_memory_bytes=device.model_memory_bytes,
        models_loaded=device.models_loaded,
        queue_depth=device.scheduler.queue_depth,
        queue_size=device.scheduler.queue_size,
        workers_alive=device.workers_alive,
    )


def _bad(message: str) -> RequestError:
    return RequestError(400, "bad_input", message)
