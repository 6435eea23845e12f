"""The Open Inference Protocol v2 over gRPC: ``inference.GRPCInferenceService``.

What ``tritonclient.grpc`` (and grpcurl with ``protos/grpc_service.proto``) calls, each
through the inference door (``web/inference/door.py``), so requests share the registry,
placement, deadlines, queues and batches of live sessions and ``/v1/infer``:

* ``ServerLive``: the process has not given up. ``ServerReady``: the inference core runs,
  every device has live workers, and the server is not draining.
* ``ModelReady``: the model is loaded; an unknown model (or version) is not ready, which
  is an answer, not an error (``tritonclient``'s ``is_model_ready`` returns it).
* ``ServerMetadata``, ``ModelMetadata`` (versions ``float`` and ``uint8``, the model's own
  tensor names, ``-1`` for the batch axis), ``ModelConfig`` (Triton's: dims per frame,
  ``max_batch_size`` the most frames a request may carry).
* ``ModelInfer``: inputs as ``raw_input_contents`` (one per input, in input order: what
  tritonclient sends) or as typed ``contents`` (FP32 in ``fp32_contents``, UINT8 in
  ``uint_contents``); the output always as ``raw_output_contents``. A request names its
  version, or gets the one its visual input's datatype names. Its ``id`` is echoed;
  ``parameters`` (priority, timeout, sequences) are not used: the door's deadline
  (``server.request_timeout_s``) and queues apply to every request alike.
* ``ModelStreamInfer``: up to :data:`STREAM_IN_FLIGHT` requests of one call run at once,
  so they batch together; each is answered when done (so possibly out of order: match
  answers by ``id``), a failed one with ``error_message``, and the stream goes on.
* ``ModelStatistics``: ``inference_count`` frames and ``execution_count`` batches run
  (live sessions' included), ``success``/``fail`` the protocol requests; ``queue``,
  ``compute_input``, ``compute_infer`` and ``compute_output`` count the frames run, each
  with its own queue wait and its batch's time for each part of the run.
* ``RepositoryIndex``, ``RepositoryModelLoad`` (parameter ``device``, an ``int64_param``:
  the index of the device to load on), ``RepositoryModelUnload``: the admin API's rule
  applies to load and unload (``authorization: Bearer <server.admin_token>`` metadata).

``ModelInfer`` and ``ModelStreamInfer`` take and give the bytes on the wire: a request's
``raw_input_contents`` are views of the bytes grpc received and a response's
``raw_output_contents`` are the output array's own bytes, joined once to the small
fields protobuf serialises (``web/inference/grpc_wire.py``). Errors are status codes
(``web/inference/grpc_status.py``); a request that does not parse is INVALID_ARGUMENT.

Why one module of about 440 lines: it is the protocol's twelve calls, a small handler
each, registered together with the messages they take.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import math
from collections.abc import AsyncIterator, Mapping, Sequence

import numpy as np
from aiohttp import web
from pydantic import SecretStr

from web.app_keys import DOOR, DRAINING, LIVENESS, SETTINGS, DrainState, Liveness
from web.errors import RequestError
from web.inference.contract import (
    DEFAULT_VERSION,
    VERSIONS,
    Contract,
    DeclaredTensor,
    TensorInfo,
    frames,
    parse_version,
)
from web.inference.door import Duration, InferenceDoor
from web.inference.grpc_status import (
    Context,
    GrpcService,
    check_admin,
    described,
    raw_bidi,
    raw_unary,
    unary,
)
from web.inference.grpc_wire import Buffer, Split, Splitter, array_bytes, delimited
from web.inference.protos import grpc_service_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
SERVER_NAME = "lipstream"
PLATFORM = "onnxruntime_onnx"
BACKEND = "onnxruntime"
#: The protocol extensions lipstream serves (over REST, binary tensors too).
EXTENSIONS = ("binary_tensor_data", "model_repository", "model_configuration", "statistics")
#: Requests of one ModelStreamInfer call that run at once; the call reads no further
#: request until one is answered (each may be as large as the message limit).
STREAM_IN_FLIGHT = 4

_DATA_TYPES = {"FP32": pb.TYPE_FP32, "UINT8": pb.TYPE_UINT8}
#: ModelInferRequest with its raw_input_contents as views of the wire bytes.
_INFER_REQUEST = Splitter(pb.ModelInferRequest, "raw_input_contents")
_RAW_OUTPUT = pb.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number
_STREAM_RESPONSE = pb.ModelStreamInferResponse.DESCRIPTOR.fields_by_name["infer_response"].number
_INDEX_STATES = {
    "loaded": "READY",
    "loading": "LOADING",
    "registered": "UNAVAILABLE",
    "failed": "UNAVAILABLE",
}


class OipServicer:
    """The service's methods, over one app's inference door."""

    def __init__(
        self,
        door: InferenceDoor,
        draining: DrainState,
        liveness: Liveness,
        admin_token: SecretStr | None,
    ) -> None:
        self._door = door
        self._draining = draining
        self._liveness = liveness
        self._admin_token = admin_token

    # -- health --------------------------------------------------------------------------

    async def server_live(
        self, request: pb.ServerLiveRequest, context: Context
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._liveness.failure is None)

    async def server_ready(
        self, request: pb.ServerReadyRequest, context: Context
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await ready(self._door, self._draining))

    async def model_ready(
        self, request: pb.ModelReadyRequest, context: Context
    ) -> pb.ModelReadyResponse:
        known_version = request.version in ("", *VERSIONS)
        return pb.ModelReadyResponse(ready=known_version and self._door.is_ready(request.name))

    # -- metadata ------------------------------------------------------------------------

    async def server_metadata(
        self, request: pb.ServerMetadataRequest, context: Context
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=server_version(), extensions=EXTENSIONS
        )

    async def model_metadata(
        self, request: pb.ModelMetadataRequest, context: Context
    ) -> pb.ModelMetadataResponse:
        contract = await self._contract(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=contract.model_id,
            versions=VERSIONS,
            platform=PLATFORM,
            inputs=[_tensor_metadata(t) for t in contract.inputs],
            outputs=[_tensor_metadata(contract.output)],
        )

    async def model_config(
        self, request: pb.ModelConfigRequest, context: Context
    ) -> pb.ModelConfigResponse:
        contract = await self._contract(request.name, request.version)
        visual, audio, output = contract.visual, contract.audio, contract.output
        layout = pb.ModelInput.FORMAT_NHWC if contract.uint8 else pb.ModelInput.FORMAT_NCHW
        config = pb.ModelConfig(
            name=contract.model_id,
            platform=PLATFORM,
            backend=BACKEND,
            max_batch_size=contract.max_frames,
            input=[
                pb.ModelInput(
                    name=visual.name,
                    data_type=_DATA_TYPES[visual.datatype],
                    format=layout,
                    dims=visual.frame_shape,
                ),
                pb.ModelInput(
                    name=audio.name, data_type=_DATA_TYPES[audio.datatype], dims=audio.frame_shape
                ),
            ],
            output=[
                pb.ModelOutput(
                    name=output.name,
                    data_type=_DATA_TYPES[output.datatype],
                    dims=output.frame_shape,
                )
            ],
        )
        return pb.ModelConfigResponse(config=config)

    async def _contract(self, model_id: str, version: str) -> Contract:
        chosen = parse_version(model_id, version) or DEFAULT_VERSION
        return await self._door.contract(model_id, chosen)

    # -- inference -----------------------------------------------------------------------

    async def model_infer(self, request: bytes, context: Context) -> bytes:
        """A ModelInferRequest's wire bytes → its ModelInferResponse's (module doc)."""
        return b"".join(await self._infer(_INFER_REQUEST(request)))

    async def model_stream_infer(self, requests: AsyncIterator[bytes], context: Context) -> None:
        slots = asyncio.Semaphore(STREAM_IN_FLIGHT)
        writing = asyncio.Lock()  # one write at a time on a call

        async def answer(wire: bytes) -> None:
            request = pb.ModelInferRequest()  # what a request that does not parse echoes
            try:
                try:
                    split = _INFER_REQUEST(wire)
                    request = split.message
                    reply = b"".join(delimited(_STREAM_RESPONSE, await self._infer(split)))
                except Exception as exc:  # this request's failure, not the stream's
                    _, error = described(exc)
                    reply = pb.ModelStreamInferResponse(
                        error_message=str(error),
                        infer_response=pb.ModelInferResponse(
                            model_name=request.model_name,
                            model_version=request.model_version,
                            id=request.id,
                        ),
                    ).SerializeToString()
                async with writing:
                    await context.write(reply)
            finally:
                slots.release()

        async with asyncio.TaskGroup() as answers:
            count = 0
            async for wire in requests:
                await slots.acquire()
                count += 1
                answers.create_task(answer(wire), name=f"oip-stream-infer-{count}")

    async def _infer(self, split: Split[pb.ModelInferRequest]) -> Sequence[Buffer]:
        """The ModelInferResponse to ``split``, as parts to join: the small fields
        serialised, then the output's bytes as raw_output_contents (module doc)."""
        request = split.message
        model_id = request.model_name
        declared = [DeclaredTensor(t.name, t.datatype, tuple(t.shape)) for t in request.inputs]
        contract, n = await self._door.request_contract(
            model_id, parse_version(model_id, request.model_version), declared
        )
        _check_requested_outputs(request, contract)
        raw = split.repeated("raw_input_contents")
        arrays = frames(contract, n, _input_data(request, raw, contract, n))
        result = await self._door.infer(contract, *arrays)
        output = contract.output
        response = pb.ModelInferResponse(
            model_name=model_id, model_version=contract.version, id=request.id
        )
        response.outputs.add(
            name=output.name, datatype=output.datatype, shape=contract.output_shape(n)
        )
        return infer_response(response, result.outputs)

    # -- statistics and the repository ---------------------------------------------------

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest, context: Context
    ) -> pb.ModelStatisticsResponse:
        if request.name:
            parse_version(request.name, request.version)
        figures = await self._door.statistics(request.name or None)
        return pb.ModelStatisticsResponse(
            model_stats=[
                pb.ModelStatistics(
                    name=s.model_id,
                    version=request.version,
                    last_inference=s.requests.last_inference_ms,
                    inference_count=s.frames,
                    execution_count=s.batches,
                    inference_stats=pb.InferStatistics(
                        success=pb.StatisticDuration(
                            count=s.requests.success_count, ns=s.requests.success_ns
                        ),
                        fail=pb.StatisticDuration(
                            count=s.requests.fail_count, ns=s.requests.fail_ns
                        ),
                        queue=_duration(s.queue),
                        compute_input=_duration(s.compute_input),
                        compute_infer=_duration(s.compute_infer),
                        compute_output=_duration(s.compute_output),
                    ),
                )
                for s in figures
            ]
        )

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, context: Context
    ) -> pb.RepositoryIndexResponse:
        snapshot = await self._door.core.snapshot()
        index = pb.RepositoryIndexResponse()
        for model in snapshot.models:
            state = _INDEX_STATES[model.state]
            if request.ready and state != "READY":
                continue
            if model.state == "failed":
                reason = model.last_error or "its last load failed"
            else:
                reason = "not loaded" if model.state == "registered" else ""
            index.models.add(name=model.model_id, state=state, reason=reason)
        return index

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> pb.RepositoryModelLoadResponse:
        check_admin(context, self._admin_token)
        device = _load_device(request.parameters, len(self._door.core.devices))
        await self._door.load(request.model_name, device)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> pb.RepositoryModelUnloadResponse:
        check_admin(context, self._admin_token)
        await self._door.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()


def oip_service(app: web.Application) -> GrpcService:
    """The service over a started app's inference door."""
    servicer = OipServicer(
        app[DOOR], app[DRAINING], app[LIVENESS], app[SETTINGS].server.admin_token
    )
    s = servicer
    return GrpcService(
        SERVICE,
        {
            "ServerLive": unary(s.server_live, pb.ServerLiveRequest.FromString),
            "ServerReady": unary(s.server_ready, pb.ServerReadyRequest.FromString),
            "ModelReady": unary(s.model_ready, pb.ModelReadyRequest.FromString),
            "ServerMetadata": unary(s.server_metadata, pb.ServerMetadataRequest.FromString),
            "ModelMetadata": unary(s.model_metadata, pb.ModelMetadataRequest.FromString),
            "ModelConfig": unary(s.model_config, pb.ModelConfigRequest.FromString),
            "ModelInfer": raw_unary(s.model_infer),
            "ModelStreamInfer": raw_bidi(s.model_stream_infer),
            "ModelStatistics": unary(s.model_statistics, pb.ModelStatisticsRequest.FromString),
            "RepositoryIndex": unary(s.repository_index, pb.RepositoryIndexRequest.FromString),
            "RepositoryModelLoad": unary(
                s.repository_model_load, pb.RepositoryModelLoadRequest.FromString
            ),
            "RepositoryModelUnload": unary(
                s.repository_model_unload, pb.RepositoryModelUnloadRequest.FromString
            ),
        },
    )


async def ready(door: InferenceDoor, draining: DrainState) -> bool:
    """Takes inference work now: the core runs, every device has live workers, no drain."""
    if draining.draining:
        return False
    snapshot = await door.core.snapshot()
    return snapshot.running and all(d.workers_alive > 0 for d in snapshot.devices)


def server_version() -> str:
    try:
        return importlib.metadata.version("lipstream")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown"


def infer_response(response: pb.ModelInferResponse, outputs: np.ndarray) -> list[Buffer]:
    """``response`` with ``outputs`` as its raw_output_contents, as parts to join (the
    tensor's own bytes, not copied). raw_output_contents is the message's last field, so
    joined they are the bytes ``SerializeToString`` would write, without protobuf's
    copies of the tensor."""
    return [response.SerializeToString(), *delimited(_RAW_OUTPUT, [array_bytes(outputs)])]


def _duration(measured: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=measured.count, ns=measured.ns)


def _tensor_metadata(tensor: TensorInfo) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=tensor.name, datatype=tensor.datatype, shape=tensor.shape
    )


def _check_requested_outputs(request: pb.ModelInferRequest, contract: Contract) -> None:
    """Every output a request names must be the model's one output (none: all outputs)."""
    name = contract.output.name
    for wanted in request.outputs:
        if wanted.name != name:
            raise _bad(
                f"model {contract.model_id!r} has one output, {name!r}; the request asks "
                f"for {wanted.name[:64]!r}"
            )
        if "classification" in wanted.parameters:
            raise _bad("the classification extension is not served: outputs are images")


def _input_data(
    request: pb.ModelInferRequest, raw: Sequence[memoryview], contract: Contract, n: int
) -> dict[str, bytes | memoryview]:
    """Each input's bytes by name: its ``raw`` (raw_input_contents) entry, or its typed
    contents made into bytes (checked for count and range; :func:`frames` checks raw
    sizes)."""
    inputs = request.inputs
    if not raw:
        return {t.name: _typed_contents(t, contract, n) for t in inputs}
    if len(raw) != len(inputs):
        raise _bad(
            f"raw_input_contents holds {len(raw)} entries for {len(inputs)} inputs: one per "
            "input, in the order of inputs"
        )
    if any(t.HasField("contents") for t in inputs):
        raise _bad("a request carries its inputs as raw_input_contents or as contents, not both")
    return {t.name: data for t, data in zip(inputs, raw, strict=True)}


def _typed_contents(
    tensor: pb.ModelInferRequest.InferInputTensor, contract: Contract, n: int
) -> memoryview:
    info = contract.visual if tensor.name == contract.visual.name else contract.audio
    expected = n * math.prod(info.frame_shape)
    field = "fp32_contents" if info.datatype == "FP32" else "uint_contents"
    contents = tensor.contents
    values = contents.fp32_contents if info.datatype == "FP32" else contents.uint_contents
    if len(values) != expected:
        raise _bad(
            f"input {tensor.name!r} needs {expected} values in contents.{field} for {n} "
            f"frame(s) ({info.datatype} [{n},{','.join(map(str, info.frame_shape))}]), got "
            f"{len(values)}; raw_input_contents carries the same as bytes"
        )
    if info.datatype == "FP32":
        return np.array(values, dtype="<f4").data
    wide = np.array(values, dtype=np.uint32)
    if wide.size and int(wide.max()) > 255:
        raise _bad(f"input {tensor.name!r} is UINT8: its uint_contents must be 0..255")
    return wide.astype(np.uint8).data


def _load_device(parameters: Mapping[str, pb.ModelRepositoryParameter], devices: int) -> int | None:
    """The ``device`` parameter of a load (an index into the server's devices), if any."""
    for key in parameters:
        if key == "config" or key.startswith("file:"):
            raise _bad(
                f"load parameter {key!r} is not supported: a lipstream model is its avatar "
                "package under avatars.root, loaded as it is"
            )
    if "device" not in parameters:
        return None
    value = parameters["device"]
    if value.WhichOneof("parameter_choice") != "int64_param":
        raise _bad("load parameter 'device' must be an int64_param (a device index)")
    device = value.int64_param
    if not 0 <= device < devices:
        raise RequestError(
            400, "bad_device", f"device {device} does not exist: devices are 0..{devices - 1}"
        )
    return device


def _bad(message: str) -> RequestError:
    return RequestError(400, "bad_input", message)
