"""Admission control: does one more session fit, given what the live ones cost?

``docs/design/delay.md`` §9: refuse a new session (503 + Retry-After) when capacity is used; never
degrade the sessions already running. Capacity is modelled in milliseconds of work per
second of wall time, on two kinds of resource, plus a hard cap:

**Inference, per device.** A session costs its model's milliseconds per frame × its fps
× the speech duty (1.0: a session may speak all the time, and a silent one costs nothing,
so the worst case is the only safe one). A device's budget is ``workers`` × 1000 ms ×
``server.admission_headroom``. Milliseconds per frame are, in order of preference:

1. the model's own measured mean (``LoadedModel`` stats: time inside ``run_batch`` /
   frames run, so cross-session batching is already in the figure);
2. the device's measured mean over every model it ran (scheduler busy time / frames);
3. ``server.inference_ms_per_frame_estimate`` when the device has run nothing yet.

**CPU, per process.** Audio features, crop, paste-back, H.264 encoding and the WebRTC
send path (RTP, SRTP, Opus, the session's timeline on the event loop) run on this
process's cores: a session costs its CPU ms per frame × fps. The budget is the usable
cores × 1000 ms × headroom. The CPU ms per frame is, in order of preference:

1. ``server.cpu_ms_per_session_frame`` (given for a 1280×720 frame, scaled by the
   frame's pixel count), plus the inference on a CPU device (the same cores): the
   operator's figure, used as is;
2. else the larger of the estimate (:data:`STAGES_CPU_MS` plus the preset's
   :data:`ENCODE_CPU_MS`, the encode part scaled by the pixel count, plus the inference
   on a CPU device) and what a frame sent has cost this process lately, measured
   (:class:`~streaming.live.cpu_meter.CpuMeter`: all of the process's CPU over the frames
   it sent, once enough were sent). The estimate alone let in 5 live 720p calls on the
   2-core development VM where 3 fit (``docs/performance/live-calls.md``); the measurement makes
   the model hold on any machine. With NVENC the encode estimate still counts, until
   a measurement says better.

**Sessions.** Live sessions plus those being set up number at most ``server.max_sessions``.

A device (or the CPU) with no session on it always takes one: that session can only hurt
itself, and a model measured during a slow spell must not lock the server out for good.

The check runs twice. :meth:`AdmissionControl.reserve` runs before anything is loaded or
connected and reads only in-memory figures, so a full server answers at once (a refused
offer took 2-8 ms over HTTP in tests/test_admission.py); what is not known yet is
estimated (a model that is not loaded: its ``preferred_device`` or the device with the
most inference room, 25 fps at 1280×720). :meth:`Reservation.confirm` runs again once the
model is held, with its real device, fps and frame size, before a peer connection exists.
A reservation counts as a session until it is released, so concurrent offers cannot
both take the last place.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from config.settings import Settings
from inference_core.serving.core import InferenceCore
from inference_core.serving.handle import ModelHandle
from inference_core.serving.loaded_model import LoadedModel
from streaming.exceptions import SessionLimitError

logger = logging.getLogger(__name__)

#: A session may speak all the time; a lower duty would overbook the devices.
SPEECH_DUTY = 1.0
REFERENCE_PIXELS = 1280 * 720
#: Assumed for an avatar whose package has not been read yet (the manifest defaults).
DEFAULT_FPS = 25
DEFAULT_FRAME_SIZE = (1280, 720)
#: CPU ms per output frame outside encoding and inference, one live 1280×720 demo call
#: speaking all the time (2-core EPYC VM, per-thread CPU from /proc, docs/changelog.md,
#: the first build): ≈11.8 ms per frame with superfast, less the 4.9 ms its encode costs. Audio
#: features, crop and paste-back are ≈1.9 ms of it; the rest is the WebRTC send path,
#: audio and the executor hand-offs, which do not shrink with the frame.
STAGES_CPU_MS = 7.0
#: libx264 (tune zerolatency) CPU time per 1280×720 frame, ``VideoFrame.from_ndarray``
#: included: process time over 100 demo frames (40 for slow..veryslow), best of 3 runs,
#: on the same VM. CPU time, not wall time: x264's threads all use the cores.
ENCODE_CPU_MS: dict[str, float] = {
    "ultrafast": 3.0,
    "superfast": 4.9,
    "veryfast": 6.1,
    "faster": 9.1,
    "fast": 13.6,
    "medium": 17.0,
    "slow": 32.0,
    "slower": 40.0,
    "veryslow": 72.0,
}


class HoldsModel(Protocol):
    """What admission reads from a live session: the model it holds."""

    @property
    def model(self) -> ModelHandle: ...


@dataclass(frozen=True)
class SessionLoad:
    """What one session costs per second of wall time."""

    device: int  # index of the device its model runs on
    inference_ms: float  # on that device
    cpu_ms: float  # in this process (inference included for a CPU device)
    measured: bool = True  # False when the model's cost is an estimate
    cpu_measured: bool = False  # True when cpu_ms is the process's measured cost


@dataclass(frozen=True)
class DeviceBudget:
    name: str
    workers: int
    ms: float  # inference milliseconds per second this device may be given


@dataclass(frozen=True)
class Budget:
    """The capacity being shared out: per device, for the process's CPU, in sessions."""

    devices: tuple[DeviceBudget, ...]
    cpu_ms: float
    cpus: int
    headroom: float
    max_sessions: int


@dataclass(frozen=True)
class Room:
    """What is left for new sessions, for a cluster front choosing a worker."""

    places: int  # places left under ``server.max_sessions``
    share: float  # the least-used-up resource's share left, 0..1 (CPU, a device, places)


def cpu_ms_per_frame(
    frame_size: tuple[int, int], preset: str, configured: float | None = None
) -> float:
    """CPU milliseconds to compose and encode one frame of ``frame_size`` (see module doc)."""
    scale = frame_size[0] * frame_size[1] / REFERENCE_PIXELS
    if configured is not None:
        return configured * scale
    return STAGES_CPU_MS + ENCODE_CPU_MS[preset] * scale


def refusal(budget: Budget, running: Sequence[SessionLoad], new: SessionLoad) -> str | None:
    """Why ``new`` does not fit next to ``running`` (naming what is full), or None if it fits."""
    if len(running) + 1 > budget.max_sessions:
        return f"the server is at its limit of {budget.max_sessions} sessions"
    device = budget.devices[new.device]
    here = [s for s in running if s.device == new.device]
    inference = sum(s.inference_ms for s in here) + new.inference_ms
    if here and inference > device.ms:
        return (
            f"device {device.name} is full: {len(here) + 1} sessions would need "
            f"{inference:.0f} ms of inference per second, over its budget of {device.ms:.0f} "
            f"({device.workers} worker(s) × 1000 ms × headroom {budget.headroom:g})"
        )
    cpu = sum(s.cpu_ms for s in running) + new.cpu_ms
    if running and cpu > budget.cpu_ms:
        how = "as measured" if new.cpu_measured else "as estimated"
        return (
            f"the server's CPU is full: {len(running) + 1} sessions would need {cpu:.0f} ms "
            f"of CPU per second ({how}: {new.cpu_ms:.0f} for the new one), over its budget "
            f"of {budget.cpu_ms:.0f} ({budget.cpus} cores × 1000 ms × headroom "
            f"{budget.headroom:g})"
        )
    return None


def usable_cpus() -> int:
    """Cores this process may run on (its affinity where the OS tells, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


class Reservation:
    """A place taken by a session being set up; :meth:`release` it once live or failed."""

    def __init__(self, control: AdmissionControl, load: SessionLoad) -> None:
        self._control = control
        self.load = load

    def confirm(self, model: ModelHandle, sessions: Sequence[HoldsModel]) -> None:
        """Check again with the held model's real device, fps and frame size.

        Raises :class:`SessionLimitError`, the place then given back.
        """
        self._control._confirm(self, model, sessions)

    def release(self) -> None:
        """Give the place back (idempotent)."""
        self._control._release(self)


class AdmissionControl:
    """Decides whether a new session fits, from the live sessions and measured model costs.

    ``cpus`` defaults to :func:`usable_cpus` (tests pass it). ``measured_cpu_ms`` gives
    the process's measured CPU ms per frame sent, or None while it has no figure (the
    session manager's :class:`~streaming.live.cpu_meter.CpuMeter`); without it, or with
    ``server.cpu_ms_per_session_frame`` set, only the configured or estimated figure counts.
    """

    def __init__(
        self,
        settings: Settings,
        core: InferenceCore,
        *,
        cpus: int | None = None,
        measured_cpu_ms: Callable[[], float | None] | None = None,
    ) -> None:
        self._settings = settings
        self._core = core
        self._cpus = cpus if cpus is not None else usable_cpus()
        self._measured_cpu_ms = measured_cpu_ms
        self._pending: list[Reservation] = []

    def budget(self) -> Budget:
        server = self._settings.server
        headroom = server.admission_headroom
        devices = []
        for device in self._core.devices:
            workers = self._settings.devices.workers_for(device.kind)
            devices.append(DeviceBudget(device.name, workers, workers * 1000.0 * headroom))
        return Budget(
            devices=tuple(devices),
            cpu_ms=self._cpus * 1000.0 * headroom,
            cpus=self._cpus,
            headroom=headroom,
            max_sessions=server.max_sessions,
        )

    def room(self, sessions: Sequence[HoldsModel]) -> Room:
        """What is left next to the live ``sessions`` and the places being set up."""
        budget = self.budget()
        running = self._running(sessions, self._measured())
        places = budget.max_sessions - len(running)
        shares = [places / budget.max_sessions, 1 - sum(s.cpu_ms for s in running) / budget.cpu_ms]
        for index, device in enumerate(budget.devices):
            used = sum(s.inference_ms for s in running if s.device == index)
            shares.append(1 - used / device.ms)
        return Room(max(0, places), max(0.0, min(shares)))

    def reserve(self, avatar_id: str, sessions: Sequence[HoldsModel]) -> Reservation:
        """Take a place for a session of ``avatar_id``, or raise :class:`SessionLimitError`.

        ``sessions`` are the live ones. Reads only in-memory figures (no file, no load);
        raises the registry's errors for an id that is not registered.
        """
        measured = self._measured()
        running = self._running(sessions, measured)
        new = self._estimate(avatar_id, running, measured)
        reservation = Reservation(self, self._check(new, running))
        self._pending.append(reservation)
        return reservation

    def load_of(
        self, model: ModelHandle | LoadedModel, measured_cpu_ms: float | None = None
    ) -> SessionLoad:
        """What a session on a held ``model`` costs per second (``measured_cpu_ms``: the
        process's measured CPU ms per frame, when there is one)."""
        manifest = model.package.manifest
        return self._load(
            model.model_id, model.device.index, manifest.fps, manifest.frame_size, measured_cpu_ms
        )

    def _confirm(
        self, reservation: Reservation, model: ModelHandle, sessions: Sequence[HoldsModel]
    ) -> None:
        self._release(reservation)
        measured = self._measured()
        running = self._running(sessions, measured)
        reservation.load = self._check(self.load_of(model, measured), running)
        self._pending.append(reservation)

    def _release(self, reservation: Reservation) -> None:
        if reservation in self._pending:
            self._pending.remove(reservation)

    def _running(self, sessions: Sequence[HoldsModel], measured: float | None) -> list[SessionLoad]:
        """The live sessions' loads and the places reserved by sessions being set up."""
        return [self.load_of(s.model, measured) for s in sessions] + [r.load for r in self._pending]

    def _measured(self) -> float | None:
        """The measured CPU ms per frame, when it counts (see the module doc)."""
        configured = self._settings.server.cpu_ms_per_session_frame
        if self._measured_cpu_ms is None or configured is not None:
            return None
        return self._measured_cpu_ms()

    def _check(self, new: SessionLoad, running: Sequence[SessionLoad]) -> SessionLoad:
        reason = refusal(self.budget(), running, new)
        if reason is not None:
            logger.info("session refused: %s", reason)
            raise SessionLimitError(f"no room for another session: {reason}; try again later")
        return new

    def _estimate(
        self, avatar_id: str, running: Sequence[SessionLoad], measured_cpu_ms: float | None
    ) -> SessionLoad:
        """The cost of a session of ``avatar_id`` before its model is held."""
        model = self._core.registry.entry(avatar_id).model
        if model is not None:
            return self.load_of(model, measured_cpu_ms)
        device = self._placement(avatar_id, running)
        return self._load(avatar_id, device, DEFAULT_FPS, DEFAULT_FRAME_SIZE, measured_cpu_ms)

    def _load(
        self,
        model_id: str,
        device: int,
        fps: int,
        frame_size: tuple[int, int],
        measured_cpu_ms: float | None,
    ) -> SessionLoad:
        ms, measured = self._ms_per_frame(model_id, device)
        inference = ms * fps * SPEECH_DUTY
        cpu = self._cpu_ms(frame_size) * fps
        if self._core.devices[device].kind == "cpu":
            cpu += inference  # the same cores
        if measured_cpu_ms is not None and measured_cpu_ms * fps > cpu:
            return SessionLoad(device, inference, measured_cpu_ms * fps, measured, True)
        return SessionLoad(device, inference, cpu, measured)

    def _placement(self, avatar_id: str, running: Sequence[SessionLoad]) -> int:
        """Where a model that is not loaded will probably go (confirm checks the truth)."""
        configured = self._settings.registry.models.get(avatar_id)
        devices = self.budget().devices
        preferred = configured.preferred_device if configured is not None else None
        if preferred is not None and preferred < len(devices):
            return preferred
        used = [0.0] * len(devices)
        for load in running:
            used[load.device] += load.inference_ms
        return max(range(len(devices)), key=lambda i: devices[i].ms - used[i])

    def _ms_per_frame(self, model_id: str, device: int) -> tuple[float, bool]:
        """The model's measured ms per frame, else an estimate (second item False)."""
        model = self._core.registry.entry(model_id).model
        if model is not None and model.device.index == device:
            stats = model.stats()
            if stats.frames:
                return stats.mean_ms_per_frame, True
        ran = self._core.schedulers[device].stats()
        frames = sum(size * count for size, count in ran.batch_sizes.items())
        if frames:
            return ran.busy_seconds * 1000.0 / frames, False
        return self._settings.server.inference_ms_per_frame_estimate, False

    def _cpu_ms(self, frame_size: tuple[int, int]) -> float:
        server = self._settings.server
        return cpu_ms_per_frame(
            frame_size, self._settings.video.preset, server.cpu_ms_per_session_frame
        )
