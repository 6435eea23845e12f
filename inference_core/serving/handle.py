"""A held model: what a session or a request submits frames to.

``InferenceCore.open(id)`` hands one out; while it is open the model cannot be evicted
(``docs/design/serving.md`` §4). Frames go to the scheduler of the model's device, which
batches them with every other session's frames for the same model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self

import numpy as np

from inference_core.adapter.spec import AdapterSpec
from inference_core.avatars.package import AvatarPackage
from inference_core.exceptions import ModelInputError, ShuttingDownError
from inference_core.serving.devices import Device
from inference_core.serving.frame_request import FrameRequest
from inference_core.serving.loaded_model import LoadedModel
from inference_core.serving.scheduler import DeviceScheduler


class ModelHandle:
    """A held, loaded model: submit frames to it; close (or ``async with``) to let it go."""

    def __init__(
        self, model: LoadedModel, scheduler: DeviceScheduler, release: Callable[[LoadedModel], None]
    ) -> None:
        self._model = model
        self._scheduler = scheduler
        self._release = release
        self._closed = False

    @property
    def model_id(self) -> str:
        return self._model.model_id

    @property
    def device(self) -> Device:
        return self._model.device

    @property
    def spec(self) -> AdapterSpec:
        return self._model.package.manifest.adapter

    @property
    def package(self) -> AvatarPackage:
        return self._model.package

    def submit(
        self,
        visual: np.ndarray,
        audio: np.ndarray,
        *,
        deadline: float,
        session_id: str | None = None,
        raw: bool = False,
    ) -> asyncio.Future[np.ndarray]:
        """Queue one frame; the future gets a uint8 BGR face (or float32 ``[3,S,S]`` if raw).

        Never blocks: a full queue raises ``QueueFullError`` at once, a frame of the wrong
        shape or type ``ModelInputError`` (it joins no batch). ``deadline`` is on
        the ``time.monotonic()`` clock; a frame not started by then fails with
        ``DeadlineExceededError``.
        """
        if self._closed:
            raise ShuttingDownError(f"handle on model {self.model_id!r} was closed")
        self._model.check_frame(visual, audio, raw=raw)
        loop = asyncio.get_running_loop()
        request = FrameRequest(
            model_id=self.model_id,
            visual=visual,
            audio=audio,
            deadline=deadline,
            future=loop.create_future(),
            loop=loop,
            session_id=session_id,
            raw=raw,
        )
        self._scheduler.submit(request, self._model)
        return request.future

    async def infer(
        self, visual: np.ndarray, audio: np.ndarray, *, timeout_s: float, raw: bool = True
    ) -> np.ndarray:
        """Run a batch of ``N`` frames (split into the model's batch size by the scheduler).

        Returns the ``N`` outputs stacked. All frames share one deadline ``timeout_s`` ahead.
        """
        if visual.shape[0] != audio.shape[0]:
            raise ModelInputError(
                f"{visual.shape[0]} visual frames but {audio.shape[0]} audio windows"
            )
        deadline = time.monotonic() + timeout_s
        futures = [
            self.submit(visual[i], audio[i], deadline=deadline, raw=raw)
            for i in range(visual.shape[0])
        ]
        try:
            outputs = await asyncio.gather(*futures)
        finally:
            for future in futures:
                future.cancel()  # no-op for finished ones; stops waiting for the rest
        return np.stack(outputs)

    def close(self) -> None:
        """Let the model go (it may be evicted once no one holds it). Idempotent."""
        if not self._closed:
            self._closed = True
            self._release(self._model)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
