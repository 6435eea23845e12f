"""The Open Inference Protocol v2 over REST, on the HTTP port: what ``tritonclient.http`` calls.

    GET  /v2/health/live                        200 while the process can serve
    GET  /v2/health/ready                       200 when ready (``GET /ready``'s rule), else 503
    GET  /v2                                    name, version, the extensions implemented
    GET  /v2/models/{m}[/versions/{v}]          the version's tensors, the model's own names
    GET  /v2/models/{m}[/versions/{v}]/ready    200 loaded; 400 not loaded; 404 unknown
    GET  /v2/models/{m}[/versions/{v}]/config   Triton's model configuration
    POST /v2/models/{m}[/versions/{v}]/infer    JSON tensors and the binary tensor extension
    POST /v2/repository/index                   every registered model and its state
    POST /v2/repository/models/{m}/load|unload  through the registry; the admin rule
    GET  /v2/models[/{m}[/versions/{v}]]/stats  the core's counts and times per model

Every model is an avatar's lip-sync model with two versions, ``float`` and ``uint8``
(``web/inference/contract.py``); a request that names none is served by its visual
input's datatype. Everything goes through the :class:`~web.inference.door.InferenceDoor`,
as ``/v1/infer`` does, under the same auth (none today), except the repository's load
and unload: they change what the server holds, so they take the admin rule of
``/admin/models/{id}/load`` (``web/admin_auth.py``). Errors are the protocol's
``{"error": "message"}``, statuses as :func:`web.errors.classify` gives them, with
``Retry-After`` when it has one (a full queue).

An infer request is checked before it is read past its JSON (``binary_tensors.py``): the
header length, the JSON (bounded), the declared tensors against the contract, each
``binary_data_size`` against the contract and the body; only then are exactly the
blobs' bytes read, and the arrays are views on them. Outputs asked for as bytes are
written from the array's own buffer.

Why one module of about 400 lines: the protocol's routes, a small handler each, share
one error wrapper and the admin rule.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any, Final, Literal

from aiohttp import web

from inference_core.exceptions import LoadTimeoutError
from web.admin_auth import FORBIDDEN_MESSAGE, UNAUTHORIZED_MESSAGE, admin_denial
from web.app_keys import DOOR, LIVENESS, SETTINGS
from web.errors import LIBRARY_ERRORS, RequestError, classify
from web.health import readiness
from web.inference.binary_tensors import (
    check_outputs,
    json_limit,
    parse_json,
    read_header,
    read_tensors,
    send_response,
)
from web.inference.contract import (
    DEFAULT_VERSION,
    VERSIONS,
    Contract,
    TensorInfo,
    Version,
    contract,
    frames,
    parse_version,
)
from web.inference.door import Duration, ModelStatistics
from web.request_body import read_limited, validate
from web.schemas.base import ResponseModel
from web.schemas.inference_protocol import (
    OipConfigTensor,
    OipDuration,
    OipIndexRequest,
    OipInferenceStats,
    OipLive,
    OipLoadRequest,
    OipModelConfig,
    OipModelMetadata,
    OipModelReady,
    OipModelStats,
    OipParameter,
    OipReady,
    OipRepositoryIndex,
    OipRepositoryModel,
    OipServerMetadata,
    OipStatistics,
    OipTensor,
)

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PLATFORM: Final = "onnxruntime_onnx"
#: The protocol extensions served here (Triton's names, as ``tritonclient`` knows them).
EXTENSIONS = ("binary_tensor_data", "model_configuration", "model_repository", "statistics")
#: A repository request's JSON: a flag or a device index, and tritonclient's parameters.
MAX_REPOSITORY_BODY = 64 * 1024
RepositoryState = Literal["READY", "LOADING", "UNAVAILABLE"]
_STATES: dict[str, RepositoryState] = {"loaded": "READY", "loading": "LOADING"}


def protocol_error(error: RequestError) -> web.Response:
    """``error`` as the protocol answers it: ``{"error": "message"}``."""
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    if error.status == 401:  # RFC 7235: a 401 names the scheme to use
        headers["WWW-Authenticate"] = "Bearer"
    return web.json_response({"error": str(error)}, status=error.status, headers=headers)


def protocol_errors(handler: Handler) -> Handler:
    """Wrap ``handler`` so that whatever it raises leaves in the protocol's error shape
    (the app's own middleware would answer lipstream's). A client gone mid-answer is not
    answered."""

    @functools.wraps(handler)
    async def answered(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ConnectionError:
            raise
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            # The protocol's body carries the message alone; the code is aiohttp's reason.
            code = re.sub(r"[^a-z0-9]+", "_", exc.reason.lower())
            return protocol_error(RequestError(exc.status, code, exc.text or exc.reason))
        except (RequestError, *LIBRARY_ERRORS) as exc:  # type: ignore[misc]
            error = classify(exc)
            if error.status >= 500:
                logger.warning("%s %s failed: %s", request.method, request.path, exc)
            return protocol_error(error)
        except Exception as exc:
            logger.exception("unhandled error in %s %s", request.method, request.path)
            return protocol_error(classify(exc))

    return answered


def server_version() -> str:
    try:
        return package_version("lipstream")
    except PackageNotFoundError:
        return "0+unknown"


def _json(body: ResponseModel | OipRepositoryIndex) -> web.Response:
    return web.json_response(body.model_dump(mode="json"))


# --- the server -------------------------------------------------------------------------


async def live(request: web.Request) -> web.Response:
    """Live while the process has not given up (``GET /health``'s rule)."""
    failure = request.app[LIVENESS].failure
    if failure is not None:
        raise RequestError(503, "server_failed", failure)
    return _json(OipLive(live=True))


async def ready(request: web.Request) -> web.Response:
    """Ready by ``GET /ready``'s rule: the core running, workers alive, not draining."""
    reasons = (await readiness(request.app)).reasons
    if reasons:
        raise RequestError(503, "not_ready", "; ".join(reasons))
    return _json(OipReady(ready=True))


async def server_metadata(request: web.Request) -> web.Response:
    return _json(
        OipServerMetadata(name="lipstream", version=server_version(), extensions=[*EXTENSIONS])
    )


# --- one model --------------------------------------------------------------------------


def _tensor(tensor: TensorInfo) -> OipTensor:
    return OipTensor(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)


async def _contracts(request: web.Request) -> tuple[Contract, dict[Version, Contract]]:
    """The version the path names (default ``float``) and every version of its model."""
    model_id = request.match_info["model_id"]
    chosen = parse_version(model_id, request.match_info.get("version", "")) or DEFAULT_VERSION
    io = await request.app[DOOR].model_io(model_id)
    every = {v: contract(model_id, io, v) for v in VERSIONS}
    return every[chosen], every


async def model_metadata(request: web.Request) -> web.Response:
    """The version's tensors, named as the ONNX model names them (read without a load)."""
    chosen, _ = await _contracts(request)
    return _json(
        OipModelMetadata(
            name=chosen.model_id,
            versions=[*VERSIONS],
            platform=PLATFORM,
            inputs=[_tensor(t) for t in chosen.inputs],
            outputs=[_tensor(chosen.output)],
        )
    )


async def model_ready(request: web.Request) -> web.Response:
    """200 while loaded (both versions are then), 400 when not, 404 for an unknown model:
    ``tritonclient``'s ``is_model_ready`` reads any status but 200 as false."""
    model_id = request.match_info["model_id"]
    parse_version(model_id, request.match_info.get("version", ""))
    door = request.app[DOOR]
    door.check_model(model_id)
    if not door.is_ready(model_id):
        raise RequestError(400, "not_ready", f"model {model_id!r} is not loaded")
    return _json(OipModelReady(name=model_id, ready=True))


def _config_tensor(tensor: TensorInfo) -> OipConfigTensor:
    return OipConfigTensor(
        name=tensor.name,
        data_type="TYPE_UINT8" if tensor.datatype == "UINT8" else "TYPE_FP32",
        dims=list(tensor.frame_shape),
    )


async def model_config(request: web.Request) -> web.Response:
    """Triton's configuration of the version the path names; ``parameters`` describe both."""
    chosen, every = await _contracts(request)
    parameters = {
        "versions": ",".join(VERSIONS),
        "default_version": DEFAULT_VERSION,
        **{
            f"version.{v}": ", ".join(t.describe() for t in c.inputs) + f" -> {c.output.describe()}"
            for v, c in every.items()
        },
    }
    return _json(
        OipModelConfig(
            name=chosen.model_id,
            platform=PLATFORM,
            backend="onnxruntime",
            max_batch_size=chosen.max_frames,
            input=[_config_tensor(t) for t in chosen.inputs],
            output=[_config_tensor(chosen.output)],
            parameters={k: OipParameter(string_value=v) for k, v in parameters.items()},
        )
    )


# --- inference --------------------------------------------------------------------------


async def infer(request: web.Request) -> web.StreamResponse:
    """Run one request (JSON tensors and/or the binary extension; see the module doc)."""
    model_id = request.match_info["model_id"]
    version = parse_version(model_id, request.match_info.get("version", ""))
    door = request.app[DOOR]
    door.check_model(model_id)
    io = await door.model_io(model_id)
    limit = json_limit([contract(model_id, io, v) for v in ([version] if version else VERSIONS)])
    header = await read_header(request, limit)
    chosen, n = await door.request_contract(model_id, version, header.request.declared)
    check_outputs(header.request, chosen)
    tensors = await read_tensors(request, header, chosen, n)
    result = await door.infer(chosen, *frames(chosen, n, tensors))
    return await send_response(request, chosen, header.request, result.outputs)


# --- the repository and statistics --------------------------------------------------------


async def _repository_body(request: web.Request) -> dict[str, Any]:
    raw = await read_limited(request, MAX_REPOSITORY_BODY)
    return parse_json(raw, "the body") if raw.strip() else {}


async def repository_index(request: web.Request) -> web.Response:
    """Every registered model (``{"ready": true}``: the loaded ones), sorted by name."""
    wanted = validate(OipIndexRequest, await _repository_body(request))
    snapshot = await request.app[DOOR].core.snapshot()
    listed = []
    for model in sorted(snapshot.models, key=lambda m: m.model_id):
        state: RepositoryState = _STATES.get(model.state, "UNAVAILABLE")
        if wanted.ready and state != "READY":
            continue
        reason = "" if state != "UNAVAILABLE" else (model.last_error or "not loaded")
        listed.append(OipRepositoryModel(name=model.model_id, state=state, reason=reason))
    return _json(OipRepositoryIndex(listed))


def check_admin(request: web.Request) -> None:
    """The admin rule of ``/admin/models/{id}/load``, answered in the protocol's shape."""
    denial = admin_denial(request, request.app[SETTINGS].server.admin_token)
    if denial is not None:
        unauthorized = denial.status == 401
        raise RequestError(
            denial.status,
            "unauthorized" if unauthorized else "forbidden",
            UNAUTHORIZED_MESSAGE if unauthorized else FORBIDDEN_MESSAGE,
        )


async def repository_load(request: web.Request) -> web.Response:
    """Load a model and wait for it, on ``{"parameters": {"device": N}}`` if given (a
    device index as ``GET /admin/stats`` lists them); a loaded model stays where it is."""
    check_admin(request)
    model_id = request.match_info["model_id"]
    door = request.app[DOOR]
    door.check_model(model_id)
    body = await _repository_body(request)
    parameters = body.get("parameters")
    if isinstance(parameters, dict) and parameters.keys() - {"device"}:
        unknown = ", ".join(sorted(parameters.keys() - {"device"}))[:200]
        raise RequestError(
            400,
            "bad_parameter",
            f"load takes only the parameter 'device'; got {unknown} (models load from their "
            "avatar packages: a configuration or files cannot be sent)",
        )
    devices = door.core.devices
    names = "devices: " + ", ".join(f"{d.index}={d.name}" for d in devices)
    loaded = validate(OipLoadRequest, body, hint=names).parameters
    device = loaded.device if loaded is not None else None
    if device is not None and device >= len(devices):
        raise RequestError(400, "bad_device", f"device {device} does not exist ({names})")
    try:
        await door.load(model_id, device)
    except LoadTimeoutError as exc:  # the load goes on in the background
        raise RequestError(504, "load_timeout", str(exc)) from None
    return web.Response(status=200)


async def repository_unload(request: web.Request) -> web.Response:
    """Unload a model nobody holds (409 while live sessions use it); parameters such as
    ``unload_dependents`` mean nothing here (a model has no dependents)."""
    check_admin(request)
    model_id = request.match_info["model_id"]
    request.app[DOOR].check_model(model_id)
    await _repository_body(request)
    await request.app[DOOR].unload(model_id)
    return web.Response(status=200)


def model_stats(figures: ModelStatistics) -> OipModelStats:
    """Triton's statistics of one model from the door's figures.

    ``inference_count`` is frames run and ``execution_count`` batches run, live sessions'
    included (they share the batches); ``success`` and ``fail`` are the protocols'
    requests that reached the core, with the time callers waited; ``queue`` and the
    ``compute_*`` durations count frames, each with its own queue wait and its batch's
    time for each part of the run (:class:`~web.inference.door.ModelStatistics`).
    """

    def duration(measured: Duration) -> OipDuration:
        return OipDuration(count=measured.count, ns=measured.ns)

    requests = figures.requests
    return OipModelStats(
        name=figures.model_id,
        version="",
        last_inference=requests.last_inference_ms,
        inference_count=figures.frames,
        execution_count=figures.batches,
        inference_stats=OipInferenceStats(
            success=OipDuration(count=requests.success_count, ns=requests.success_ns),
            fail=OipDuration(count=requests.fail_count, ns=requests.fail_ns),
            queue=duration(figures.queue),
            compute_input=duration(figures.compute_input),
            compute_infer=duration(figures.compute_infer),
            compute_output=duration(figures.compute_output),
        ),
    )


async def statistics(request: web.Request) -> web.Response:
    """Every registered model's statistics, or the one the path names."""
    model_id = request.match_info.get("model_id")
    if model_id is not None:
        parse_version(model_id, request.match_info.get("version", ""))
    figures = await request.app[DOOR].statistics(model_id)
    return _json(OipStatistics(model_stats=[model_stats(f) for f in figures]))


def add_inference_protocol_routes(app: web.Application) -> None:
    """Serve ``/v2`` (module doc), every route answering errors in the protocol's shape."""
    router = app.router

    def get(path: str, handler: Handler) -> None:
        router.add_get(path, protocol_errors(handler))

    def post(path: str, handler: Handler) -> None:
        router.add_post(path, protocol_errors(handler))

    get("/v2/health/live", live)
    get("/v2/health/ready", ready)
    get("/v2", server_metadata)
    get("/v2/models/stats", statistics)
    for model in ("/v2/models/{model_id}", "/v2/models/{model_id}/versions/{version}"):
        get(model, model_metadata)
        get(f"{model}/ready", model_ready)
        get(f"{model}/config", model_config)
        get(f"{model}/stats", statistics)
        post(f"{model}/infer", infer)
    post("/v2/repository/index", repository_index)
    post("/v2/repository/models/{model_id}/load", repository_load)
    post("/v2/repository/models/{model_id}/unload", repository_unload)
