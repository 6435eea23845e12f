"""The front's gRPC listener: one process's two inference services, served by the workers.

``lipstream serve`` with ``cluster.workers: N`` opens it on ``server.grpc_port`` (null:
none) with the services, methods and message limits one process serves
(``web/inference/grpc_server.py``), so a client cannot tell a front from one process
(``docs/design/cluster.md`` §14). It is a proxy to the workers' own gRPC listeners
(``WorkerReport.grpc_port``):

- A model's calls (the Open Inference Protocol's ``ModelReady``, ``ModelMetadata``,
  ``ModelConfig`` and ``ModelInfer``; the seed's ``InferBatch``) go to a worker holding
  the model, else to the one with most room (:func:`~web.cluster.placement.candidates`,
  as ``/v1/infer`` goes). Their messages pass through as bytes: the front reads only
  the model's name from the request's wire bytes (``web/cluster/grpc_wire.py``) and
  never parses the tensors; the answer, its status, details and metadata come back as
  the worker sent them.
- ``ModelStreamInfer`` goes, for the whole stream, to the worker of its first request's
  model: **one stream's requests all go to one worker**, whatever model a later one
  names (a client spreads its models over the workers with a stream per model). Both
  directions are relayed message by message, with no total timeout.
- Loads and unloads (``RepositoryModelLoad``/``Unload``, the seed's ``LoadModel``): the
  operator's admin rule is applied here (``authorization: Bearer <server.admin_token>``,
  or a loopback caller when none is set) and the worker is called with the workers'
  admin token (:attr:`ClusterFront.worker_admin_token`, the operator's when set). A load
  goes where placement says, or with a device (``parameters["device"]``, the seed's
  ``device_index``) to the worker whose device that is, counted over the front's device
  list (``/admin/stats``, the seed's ``Health``: each answering worker's devices in
  turn). An unload goes to every worker holding the model.
- ``ServerLive`` and ``ServerMetadata`` are the front's own; ``ServerReady`` is the
  front's ``/ready`` rule (a worker answering, the Ray runtime there, not draining).
- ``RepositoryIndex``, ``ModelStatistics`` (of one model or all: a model loaded on two
  workers ran on both) and the seed's ``ListModels``, ``GetModelStats`` and ``Health``
  ask every answering worker at once, each within ``cluster.report_timeout_s``, and merge
  the answers (``web/cluster/grpc_merge.py``); when none answers, a worker's own refusal
  (an unknown model's NOT_FOUND) comes back as it sent it.

The caller's metadata (``authorization`` among it) goes on to the worker; how calls are
carried (one channel per worker, the worker's status and metadata back, UNAVAILABLE
naming a worker that fails) is ``web/cluster/grpc_relay.py``. No worker to ask is
UNAVAILABLE saying why, with ``retry-after``. A call is never retried on another worker:
at most once, as over HTTP.

Why one module of about 400 lines: which worker a call goes to is one decision per
call of both services, read best as one table.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import aiohttp
import grpc
from aiohttp import web
from google.protobuf.message import DecodeError, Message

from config.settings import Settings
from web.app_keys import DRAINING, LIVENESS, SETTINGS, DrainState, Liveness
from web.cluster import grpc_merge
from web.cluster.aggregate import device_index
from web.cluster.app import FRONT, HTTP, unready_reasons
from web.cluster.front import ClusterFront
from web.cluster.grpc_relay import (
    RETRY_AFTER_S,
    Metadata,
    Relay,
    WorkerChannels,
    grpc_target,
    relayed_metadata,
)
from web.cluster.grpc_wire import model_name
from web.cluster.placement import WorkerState, candidates
from web.errors import RequestError
from web.inference import oip_grpc, seed_grpc
from web.inference.grpc_server import GrpcListener, message_limits, start_grpc
from web.inference.grpc_status import (
    Context,
    GrpcService,
    RawUnary,
    check_admin,
    raw_bidi,
    raw_unary,
    unary,
)
from web.inference.grpc_wire import not_valid
from web.inference.protos import grpc_service_pb2 as oip
from web.inference.protos import inference_service_pb2 as seed

_M = TypeVar("_M", bound=Message)


class FrontServicer:
    """Both services' methods over the workers of one front (module doc)."""

    def __init__(
        self,
        front: ClusterFront,
        http: aiohttp.ClientSession,
        relay: Relay,
        *,
        settings: Settings,
        liveness: Liveness,
        draining: DrainState,
        unready: Callable[[], list[str]],
    ) -> None:
        self._front = front
        self._http = http  # to the workers' HTTP admin API: the device list
        self._relay = relay
        self._settings = settings
        self._liveness = liveness
        self._draining = draining
        self._unready = unready

    # -- the front's own -----------------------------------------------------------------

    async def server_live(
        self, request: oip.ServerLiveRequest, context: Context
    ) -> oip.ServerLiveResponse:
        return oip.ServerLiveResponse(live=self._liveness.failure is None)

    async def server_ready(
        self, request: oip.ServerReadyRequest, context: Context
    ) -> oip.ServerReadyResponse:
        return oip.ServerReadyResponse(ready=not self._unready())

    async def server_metadata(
        self, request: oip.ServerMetadataRequest, context: Context
    ) -> oip.ServerMetadataResponse:
        return oip.ServerMetadataResponse(
            name=oip_grpc.SERVER_NAME,
            version=oip_grpc.server_version(),
            extensions=oip_grpc.EXTENSIONS,
        )

    # -- a model's calls: to one worker --------------------------------------------------

    def model_call(self, path: str, message: type[Message], field: str) -> RawUnary:
        """The method at ``path``, whose request names its model in ``field``: relayed to
        that model's worker as bytes."""

        async def call(request: bytes, context: Context) -> bytes:
            worker = self._placed(model_name(request, message, field))
            return await self._forward(worker, path, request, context)

        return call

    async def model_stream_infer(self, requests: AsyncIterator[bytes], context: Context) -> None:
        """The stream, to the worker of its first request's model (module doc)."""
        incoming = aiter(requests)
        first = await anext(incoming, None)
        if first is None:  # the caller closed at once: nothing to route
            return
        worker = self._placed(model_name(first, oip.ModelInferRequest, "model_name"))

        async def relayed() -> AsyncIterator[bytes]:
            yield first
            async for message in incoming:
                yield message

        path = f"/{oip_grpc.SERVICE}/ModelStreamInfer"
        await self._relay.stream(
            worker, path, relayed(), context, metadata=relayed_metadata(context)
        )

    # -- loads and unloads ---------------------------------------------------------------

    async def repository_model_load(self, request: bytes, context: Context) -> bytes:
        check_admin(context, self._settings.server.admin_token)
        load = _parsed(oip.RepositoryModelLoadRequest, request)
        device = load.parameters.get("device")
        if device is not None and device.WhichOneof("parameter_choice") == "int64_param":
            worker, device.int64_param = await self._device_worker(device.int64_param)
            request = load.SerializeToString()
        else:  # placement's choice (a device of another kind: the worker says what is wrong)
            worker = self._placed(load.model_name)
        path = f"/{oip_grpc.SERVICE}/RepositoryModelLoad"
        answer = await self._forward(worker, path, request, context, admin=True)
        self._front.report_soon(worker.name)
        return answer

    async def repository_model_unload(self, request: bytes, context: Context) -> bytes:
        check_admin(context, self._settings.server.admin_token)
        model = model_name(request, oip.RepositoryModelUnloadRequest, "model_name")
        answering = self._answering()
        held = [w for w in answering if w.report is not None and model in w.report.models]
        targets = held or answering[:1]  # held nowhere: one worker says what it says
        if not targets:
            raise self._unavailable()
        path, answer = f"/{oip_grpc.SERVICE}/RepositoryModelUnload", b""
        for worker in targets:
            answer = await self._forward(worker, path, request, context, admin=True)
            self._front.report_soon(worker.name)
        return answer

    async def load_model(self, request: bytes, context: Context) -> bytes:
        """The seed's load; the model in the answer has its device named by its worker."""
        check_admin(context, self._settings.server.admin_token)
        load = _parsed(seed.LoadModelRequest, request)
        if load.HasField("device_index"):
            worker, load.device_index = await self._device_worker(load.device_index)
            request = load.SerializeToString()
        else:
            worker = self._placed(load.model_id)
        path = f"/{seed_grpc.SERVICE}/LoadModel"
        raw = await self._forward(worker, path, request, context, admin=True)
        self._front.report_soon(worker.name)
        answer = seed.LoadModelResponse.FromString(raw)
        if answer.model.device:
            answer.model.device = f"{worker.name}/{answer.model.device}"
        return answer.SerializeToString()

    async def _device_worker(self, index: int) -> tuple[WorkerState, int]:
        """The worker whose device is ``index`` in the front's device list, and its own
        index for it (``web/cluster/aggregate.py``)."""
        name, local = await device_index(self._front, self._http, index)
        return self._front.workers[name], local

    # -- over every worker ---------------------------------------------------------------

    async def model_statistics(
        self, request: oip.ModelStatisticsRequest, context: Context
    ) -> oip.ModelStatisticsResponse:
        answers = await self._ask_all(oip_grpc.SERVICE, "ModelStatistics", request, context)
        return grpc_merge.statistics(map(oip.ModelStatisticsResponse.FromString, answers.values()))

    async def repository_index(
        self, request: oip.RepositoryIndexRequest, context: Context
    ) -> oip.RepositoryIndexResponse:
        # Every model's state on every worker: READY on one wins over the others.
        every = oip.RepositoryIndexRequest(repository_name=request.repository_name)
        answers = await self._ask_all(oip_grpc.SERVICE, "RepositoryIndex", every, context)
        return grpc_merge.repository_index(
            map(oip.RepositoryIndexResponse.FromString, answers.values()), ready=request.ready
        )

    async def list_models(
        self, request: seed.ListModelsRequest, context: Context
    ) -> seed.ListModelsResponse:
        answers = await self._ask_all(seed_grpc.SERVICE, "ListModels", request, context)
        return grpc_merge.list_models(
            {name: seed.ListModelsResponse.FromString(a) for name, a in answers.items()}
        )

    async def get_model_stats(
        self, request: seed.GetModelStatsRequest, context: Context
    ) -> seed.GetModelStatsResponse:
        answers = await self._ask_all(seed_grpc.SERVICE, "GetModelStats", request, context)
        return grpc_merge.model_stats(
            {name: seed.GetModelStatsResponse.FromString(a) for name, a in answers.items()}
        )

    async def health(self, request: seed.HealthRequest, context: Context) -> seed.HealthResponse:
        raw = await self._ask_all(seed_grpc.SERVICE, "Health", request, context)
        answers = {name: seed.HealthResponse.FromString(a) for name, a in raw.items()}
        healthy = not self._unready() and any(a.healthy for a in answers.values())
        if self._draining.draining:
            status = "draining"
        else:
            status = "serving" if healthy else "unavailable"
        return grpc_merge.health(
            answers, healthy=healthy, status=status, version=oip_grpc.server_version()
        )

    # -- the workers ---------------------------------------------------------------------

    def _answering(self) -> list[WorkerState]:
        """The workers answering their reports that have a gRPC listener."""
        workers = self._front.workers.values()
        return [w for w in workers if w.answering and grpc_target(w.report) is not None]

    def _placed(self, model_id: str) -> WorkerState:
        """The worker for ``model_id``'s call: placement's first with a gRPC listener."""
        for worker in candidates(model_id, list(self._front.workers.values())):
            if grpc_target(worker.report) is not None:
                return worker
        raise self._unavailable()

    def _unavailable(self) -> RequestError:
        """Why no worker can take a call, as the caller gets it."""
        workers = self._front.workers.values()
        up = sum(w.usable for w in workers)
        if up:
            why = f"none of the {up} answering workers has room for more work"
        else:
            why = f"no worker is answering (0 of {len(workers)})"
        if self._front.problem is not None:
            why = f"{why}: {self._front.problem}"
        return RequestError(503, "worker_unavailable", why, retry_after=RETRY_AFTER_S)

    def _deadline(self, context: Context, most_s: float) -> float:
        """The caller's time left, at most ``most_s``."""
        left = context.time_remaining()
        return most_s if left is None else min(left, most_s)

    async def _forward(
        self,
        worker: WorkerState,
        path: str,
        request: bytes,
        context: Context,
        *,
        admin: bool = False,
    ) -> bytes:
        """``request`` to ``worker`` within the caller's deadline (at most
        ``server.request_timeout_s``, as over HTTP); an admin call carries the workers'
        token instead of the caller's (the front checked the caller's)."""
        metadata: Metadata = relayed_metadata(context)
        if admin:
            token = self._front.worker_admin_token.get_secret_value()
            metadata = [
                *relayed_metadata(context, dropped="authorization"),
                ("authorization", f"Bearer {token}"),
            ]
        timeout_s = self._deadline(context, self._settings.server.request_timeout_s)
        return await self._relay.unary(
            worker, path, request, context, metadata=metadata, timeout_s=timeout_s
        )

    async def _ask_all(
        self, service: str, method: str, request: Message, context: Context
    ) -> dict[str, bytes]:
        """``request`` to every answering worker at once, each within
        ``cluster.report_timeout_s``: their answers by worker."""
        asked = self._answering()
        if not asked:
            raise self._unavailable()
        return await self._relay.ask_all(
            asked,
            f"/{service}/{method}",
            request.SerializeToString(),
            context,
            metadata=relayed_metadata(context),
            timeout_s=self._deadline(context, self._settings.cluster.report_timeout_s),
        )


def _parsed(message: type[_M], request: bytes) -> _M:
    """A small request (a load) parsed, to read or change more than its model."""
    try:
        return message.FromString(request)
    except DecodeError as exc:
        raise not_valid(message, exc) from None


def front_services(servicer: FrontServicer) -> list[GrpcService]:
    """The two services one process serves, over the front's workers."""
    s = servicer

    def model(
        service: str, method: str, message: type[Message], field: str
    ) -> grpc.RpcMethodHandler[bytes, bytes]:
        return raw_unary(s.model_call(f"/{service}/{method}", message, field))

    def oip_model(
        method: str, message: type[Message], field: str = "name"
    ) -> grpc.RpcMethodHandler[bytes, bytes]:
        return model(oip_grpc.SERVICE, method, message, field)

    return [
        GrpcService(
            oip_grpc.SERVICE,
            {
                "ServerLive": unary(s.server_live, oip.ServerLiveRequest.FromString),
                "ServerReady": unary(s.server_ready, oip.ServerReadyRequest.FromString),
                "ServerMetadata": unary(s.server_metadata, oip.ServerMetadataRequest.FromString),
                "ModelReady": oip_model("ModelReady", oip.ModelReadyRequest),
                "ModelMetadata": oip_model("ModelMetadata", oip.ModelMetadataRequest),
                "ModelConfig": oip_model("ModelConfig", oip.ModelConfigRequest),
                "ModelInfer": oip_model("ModelInfer", oip.ModelInferRequest, "model_name"),
                "ModelStreamInfer": raw_bidi(s.model_stream_infer),
                "ModelStatistics": unary(s.model_statistics, oip.ModelStatisticsRequest.FromString),
                "RepositoryIndex": unary(s.repository_index, oip.RepositoryIndexRequest.FromString),
                "RepositoryModelLoad": raw_unary(s.repository_model_load),
                "RepositoryModelUnload": raw_unary(s.repository_model_unload),
            },
        ),
        GrpcService(
            seed_grpc.SERVICE,
            {
                "InferBatch": model(
                    seed_grpc.SERVICE, "InferBatch", seed.InferBatchRequest, "model_id"
                ),
                "ListModels": unary(s.list_models, seed.ListModelsRequest.FromString),
                "LoadModel": raw_unary(s.load_model),
                "GetModelStats": unary(s.get_model_stats, seed.GetModelStatsRequest.FromString),
                "Health": unary(s.health, seed.HealthRequest.FromString),
            },
        ),
    ]


async def start_front_grpc(app: web.Application, host: str, port: int) -> GrpcListener:
    """The front doors of a started front ``app`` (``web.cluster.app.build_front_app``:
    its startup started the workers) on ``host:port``; closing the listener closes the
    channels to the workers."""
    limits = message_limits()
    channels = WorkerChannels(limits)
    servicer = FrontServicer(
        app[FRONT],
        app[HTTP],
        Relay(app[FRONT], channels),
        settings=app[SETTINGS],
        liveness=app[LIVENESS],
        draining=app[DRAINING],
        unready=lambda: unready_reasons(app),
    )
    return await start_grpc(
        front_services(servicer), host, port, limits, after_close=channels.close
    )
