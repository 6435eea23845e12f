"""The Open Inference Protocol v2 over REST: the bodies of ``/v2`` (``web/inference/rest.py``).

Shapes as the protocol and Triton's extensions define them (the KServe v2 REST spec,
Triton's ``model_configuration``, ``model_repository`` and ``statistics`` extensions), so
``tritonclient`` and other v2 clients read them as they read Triton's. Errors are the
protocol's ``{"error": "message"}`` (:class:`OipError`), not lipstream's own
``{"error": {"code", "message"}}``. Names carry an ``Oip`` prefix: the OpenAPI document
has one namespace for every model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, RootModel

from web.schemas.base import Count, RequestModel, ResponseModel

Datatype = Annotated[str, Field(description="`FP32` or `UINT8` for lip-sync models.")]
Shape = Annotated[list[int], Field(description="`-1` where the dimension is free (the batch).")]


class OipError(ResponseModel):
    """Every error of the ``/v2`` routes, with any 4xx or 5xx status (the protocol's)."""

    error: str = Field(description="For people: what is wrong and what to do.")


class OipLive(ResponseModel):
    live: Literal[True]


class OipReady(ResponseModel):
    ready: Literal[True]


class OipServerMetadata(ResponseModel):
    name: Literal["lipstream"]
    version: str
    extensions: list[str] = Field(description="The protocol extensions this server implements.")


class OipTensor(ResponseModel):
    name: str = Field(description="The ONNX model's own tensor name.")
    datatype: Datatype
    shape: Shape


class OipModelMetadata(ResponseModel):
    name: str = Field(description="The avatar id.")
    versions: list[str] = Field(description="`float` (the model's own interface) and `uint8`.")
    platform: Literal["onnxruntime_onnx"]
    inputs: list[OipTensor]
    outputs: list[OipTensor]


class OipModelReady(ResponseModel):
    name: str
    ready: Literal[True]


class OipConfigTensor(ResponseModel):
    name: str
    data_type: Literal["TYPE_FP32", "TYPE_UINT8"]
    dims: list[int] = Field(description="Without the batch axis (`max_batch_size` bounds it).")


class OipParameter(ResponseModel):
    string_value: str


class OipModelConfig(ResponseModel):
    """Triton's model configuration, as far as it describes a lip-sync model."""

    name: str
    platform: Literal["onnxruntime_onnx"]
    backend: Literal["onnxruntime"]
    max_batch_size: int = Field(ge=1, description="The most frames one request may carry.")
    input: list[OipConfigTensor]
    output: list[OipConfigTensor]
    parameters: dict[str, OipParameter] = Field(
        description="`versions` (comma-separated), `default_version`, and `version.<v>`: "
        "each version's tensors."
    )


class OipRepositoryModel(ResponseModel):
    name: str
    state: Literal["READY", "LOADING", "UNAVAILABLE"]
    reason: str = Field(description="Why it is not ready (empty when it is).")


class OipRepositoryIndex(RootModel[list[OipRepositoryModel]]):
    """Every registered model (or only the ready ones), sorted by name."""

    model_config = ConfigDict(frozen=True)


class OipDuration(ResponseModel):
    count: Count
    ns: Count


class OipInferenceStats(ResponseModel):
    """Triton's durations, each a count and a total in nanoseconds.

    ``success`` and ``fail`` count the protocols' requests; the four others count frames
    run (a frame is the inference core's request; live sessions' frames included), each
    frame with its own wait and its batch's time for each part of the batch's run.
    """

    success: OipDuration = Field(
        description="The protocols' requests that ran, and the time their callers waited."
    )
    fail: OipDuration = Field(
        description="The protocols' requests that reached the core and failed, and their time."
    )
    queue: OipDuration = Field(
        description="Frames run, and the time each waited in its device's queue for a batch."
    )
    compute_input: OipDuration = Field(
        description="Frames run, and their batches' time copying and binding the inputs."
    )
    compute_infer: OipDuration = Field(
        description="Frames run, and their batches' time in the model run."
    )
    compute_output: OipDuration = Field(
        description="Frames run, and their batches' time handing the outputs back."
    )


class OipModelStats(ResponseModel):
    name: str
    version: str = Field(description="Empty: the figures cover both versions.")
    last_inference: Count = Field(description="Milliseconds since the epoch; 0 = never.")
    inference_count: Count = Field(description="Frames run, live sessions' included.")
    execution_count: Count = Field(description="Batches run.")
    inference_stats: OipInferenceStats


class OipStatistics(ResponseModel):
    model_stats: list[OipModelStats]


class OipOutputParameters(ResponseModel):
    binary_data_size: Count


class OipOutput(ResponseModel):
    name: str
    datatype: Datatype
    shape: list[int]
    data: list[float] | None = Field(
        default=None, description="Row-major and flat, when asked for as JSON."
    )
    parameters: OipOutputParameters | None = Field(
        default=None, description="When asked for as binary: its bytes follow the JSON."
    )


class OipInferResponse(ResponseModel):
    model_name: str
    model_version: Literal["float", "uint8"]
    id: str | None = Field(default=None, description="The request's `id`, when it had one.")
    outputs: list[OipOutput]


class OipIndexRequest(RequestModel):
    """Optional: an empty body lists every registered model."""

    ready: bool | None = Field(default=None, description="`true`: only the ready models.")


class OipLoadParameters(RequestModel):
    wrong_type_code = "bad_device"
    value_codes: ClassVar[Mapping[str, str]] = {"device": "bad_device"}

    device: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="Device index (see `GET /admin/stats`); default: placement by "
        "`registry.assignment`. A loaded model stays where it is.",
    )


class OipLoadRequest(RequestModel):
    """Optional: an empty body (or tritonclient's ``{}``) loads where placement puts it."""

    value_codes: ClassVar[Mapping[str, str]] = {"parameters": "bad_device"}

    parameters: OipLoadParameters | None = None
