"""The one way in for raw inference, whichever protocol a request came by.

``POST /v1/infer``, the Open Inference Protocol over REST and gRPC and the seed's
``InferenceService`` all end here (``docs/design/inference-protocols.md`` §17): the same registry
(load on demand, or refuse a model not loaded when ``registry.load_on_infer`` is false),
the same placement, deadlines (``server.request_timeout_s``) and bounded per-device
queues, and the same batches as live sessions' frames. The door also keeps, per model,
the protocol's request counters (successes and failures with their times), which the
core does not: it counts frames and batches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from config.settings import Settings
from inference_core.avatars.exceptions import AvatarNotFoundError, InvalidAvatarIdError
from inference_core.serving.core import InferenceCore, ModelIo
from inference_core.serving.snapshot import CoreSnapshot, ModelSnapshot
from web.errors import RequestError
from web.inference.contract import (
    Contract,
    DeclaredTensor,
    Version,
    contract,
    version_for,
)


@dataclass(frozen=True)
class InferResult:
    """A batch's outputs (float32 ``[N,3,S,S]`` or uint8 ``[N,S,S,3]``) and where it ran."""

    outputs: np.ndarray
    device: str
    elapsed_ms: float  # queue + compute, as the caller waited for it


@dataclass
class RequestCounts:
    """One model's protocol requests: successes and failures, their count and total time."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    last_inference_ms: int = 0  # wall clock, ms since the epoch; 0 = never


@dataclass(frozen=True)
class Duration:
    """Triton's ``{count, ns}``: how many requests, and their time in all."""

    count: int
    ns: int


@dataclass(frozen=True)
class ModelStatistics:
    """What the protocols' statistics report of one model (the core's figures and ours).

    ``queue`` and the ``compute_*`` durations are the core's, in Triton's sense with a
    frame as the core's request: each frame that ran counted once, with its own wait in
    the device's queue and its batch's time for each part of the batch's run (inputs
    bound, the model run, outputs handed back). Live sessions' frames are included.
    """

    model_id: str
    requests: RequestCounts
    frames: int  # every frame the model ran, live sessions' included
    batches: int
    failed_frames: int
    inference_ns: int  # time inside run_batch (all batches)
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


class InferenceDoor:
    """Contracts, readiness, loads and runs for the raw inference front doors."""

    def __init__(self, core: InferenceCore, settings: Settings) -> None:
        self.core = core
        self._timeout_s = settings.server.request_timeout_s
        self._load_on_infer = settings.registry.load_on_infer
        self._counts: dict[str, RequestCounts] = {}  # registered model ids only

    def check_model(self, model_id: str) -> None:
        """:class:`RequestError`-mapped errors for a malformed (400) or unknown (404) id."""
        self.core.check_registered(model_id)

    def is_registered(self, model_id: str) -> bool:
        try:
            self.core.check_registered(model_id)
        except (InvalidAvatarIdError, AvatarNotFoundError):  # both: "no such model" here
            return False
        return True

    def is_ready(self, model_id: str) -> bool:
        """Registered and loaded now (a loading model is not ready yet)."""
        if not self.is_registered(model_id):
            return False
        return self.core.model_state(model_id) == "loaded"

    async def model_io(self, model_id: str) -> ModelIo:
        """The model's spec and tensor names (see :meth:`InferenceCore.model_io`)."""
        self.check_model(model_id)
        return await self.core.model_io(model_id)

    async def contract(self, model_id: str, version: Version) -> Contract:
        """Version ``version`` of ``model_id`` (400/404 for a bad or unknown id), for
        metadata: a model not loaded is not loaded for it."""
        return contract(model_id, await self.model_io(model_id), version)

    async def infer_contract(self, model_id: str, version: Version) -> Contract:
        """Version ``version`` of ``model_id``, for a request about to run: the model is
        loaded first (or refused, see :meth:`infer`), so a model that cannot load fails
        here as a load, counted as one, not as unreadable metadata."""
        await self._ready_for_infer(model_id)
        return await self.contract(model_id, version)

    async def request_contract(
        self, model_id: str, version: Version | None, declared: Sequence[DeclaredTensor]
    ) -> tuple[Contract, int]:
        """The contract a request is served by (its version, or its visual datatype's) and
        its batch size, once its declared tensors passed :meth:`Contract.check`. Loads
        the model as :meth:`infer_contract` does."""
        await self._ready_for_infer(model_id)
        io = await self.model_io(model_id)
        chosen = contract(model_id, io, version_for(version, io, declared))
        return chosen, chosen.check(declared)

    async def infer(self, contract: Contract, visual: np.ndarray, audio: np.ndarray) -> InferResult:
        """Run ``N`` frames through ``contract``'s model, as one request.

        Raises what the core raises (``QueueFullError``, ``DeadlineExceededError``…),
        :class:`RequestError` 503 ``model_not_ready`` when the model is not loaded and
        ``registry.load_on_infer`` is false.
        """
        model_id = contract.model_id
        counts = self._counts.setdefault(model_id, RequestCounts())
        started = time.perf_counter_ns()
        try:
            self._check_loaded(model_id)
            async with await self.core.open(model_id) as model:
                outputs = await model.infer(
                    visual,
                    audio.astype(np.float32, copy=False),
                    timeout_s=self._timeout_s,
                    raw=not contract.uint8,
                )
                device = model.device.name
        except (Exception, asyncio.CancelledError):
            counts.fail_count += 1
            counts.fail_ns += time.perf_counter_ns() - started
            raise
        elapsed = time.perf_counter_ns() - started
        counts.success_count += 1
        counts.success_ns += elapsed
        counts.last_inference_ms = time.time_ns() // 1_000_000
        if not contract.uint8:
            outputs = outputs.astype(np.float32, copy=False)
        return InferResult(outputs, device, elapsed / 1e6)

    async def _ready_for_infer(self, model_id: str) -> None:
        self.check_model(model_id)
        if self._load_on_infer:
            await self.core.load(model_id)
        else:
            self._check_loaded(model_id)

    def _check_loaded(self, model_id: str) -> None:
        """:class:`RequestError` 503 for a model not loaded when requests may not load it."""
        if not self._load_on_infer and not self.core.is_loaded(model_id):
            raise RequestError(
                503,
                "model_not_ready",
                f"model {model_id!r} is not loaded and registry.load_on_infer is false: "
                f"load it first (POST /v2/repository/models/{model_id}/load, "
                f"POST /admin/models/{model_id}/load, gRPC RepositoryModelLoad)",
            )

    async def load(self, model_id: str, device: int | None = None) -> None:
        """Load ``model_id`` (on ``device`` if given) through the registry."""
        self.check_model(model_id)
        await self.core.load(model_id, device)

    async def unload(self, model_id: str) -> None:
        """Unload ``model_id`` (``ModelInUseError`` while calls hold it)."""
        self.check_model(model_id)
        await self.core.unload(model_id)

    async def statistics(
        self, model_id: str | None = None, snapshot: CoreSnapshot | None = None
    ) -> list[ModelStatistics]:
        """Every registered model's figures (or ``model_id``'s alone), sorted by id, from
        ``snapshot`` when the caller took one already (else a new one)."""
        if model_id is not None:
            self.check_model(model_id)
        snapshot = snapshot or await self.core.snapshot()
        models: Sequence[ModelSnapshot] = snapshot.models
        if model_id is not None:
            models = [m for m in models if m.model_id == model_id]
        return [
            ModelStatistics(
                model_id=m.model_id,
                requests=self._counts.get(m.model_id, RequestCounts()),
                frames=m.frames,
                batches=m.batches,
                failed_frames=m.failures,
                inference_ns=round(m.inference_ms_total * 1e6),
                queue=Duration(m.queue_frames, m.queue_ns),
                compute_input=Duration(m.frames, m.compute_input_ns),
                compute_infer=Duration(m.frames, m.compute_infer_ns),
                compute_output=Duration(m.frames, m.compute_output_ns),
            )
            for m in models
        ]
