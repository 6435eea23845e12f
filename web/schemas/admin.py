"""The admin API: models, devices, the background cache, totals and live sessions.

Built by :mod:`web.admin` from the operators' snapshots only
(:class:`inference_core.serving.snapshot.CoreSnapshot`,
:class:`streaming.live.snapshot.SessionsSnapshot`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from inference_core.serving.snapshot import ModelState
from web.schemas.base import (
    AvatarId,
    Count,
    Counts,
    NonNegative,
    RequestModel,
    ResponseModel,
    SessionKind,
    SessionStateName,
    UtcTime,
)
from web.schemas.session_state import AddedDelay, AppAudio


class LoadRequest(RequestModel):
    """Optional: an empty body loads where placement puts the model."""

    wrong_type_code = "bad_device"
    value_codes: ClassVar[Mapping[str, str]] = {"device": "bad_device"}

    device: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="Device index (see `GET /admin/stats`); default: placement by "
        "`registry.assignment`.",
    )


class Model(ResponseModel):
    id: AvatarId = Field(description="The model's avatar id.")
    state: ModelState
    device: str | None = Field(description="Where it is loaded.")
    memory_bytes: Count
    usage_count: Count
    frames: Count
    total_inference_ms: NonNegative
    mean_inference_ms: NonNegative
    last_used: UtcTime | None
    loaded_at: UtcTime | None
    load_seconds: NonNegative | None
    last_error: str | None
    refcount: Count = Field(description="Sessions and requests holding it.")


class Models(ResponseModel):
    models: list[Model]


class Worker(ResponseModel):
    name: str
    batches: Count
    frames: Count
    busy_seconds: NonNegative


DeviceKind = Literal["cpu", "cuda"]


class Device(ResponseModel):
    name: str = Field(description="e.g. `cuda:0`, `cpu:0`.")
    kind: DeviceKind
    models_loaded: Count
    memory_used_bytes: Count = Field(description="Measured memory of its models.")
    memory_total_bytes: Count | None
    queue_depth: Count
    batches: Count
    frames: Count
    busy_fraction: NonNegative
    mean_batch_size: NonNegative
    expired: Count = Field(description="Frames dropped at their deadline.")
    rejected: Count = Field(description="Frames refused by a full queue.")
    workers_restarted: Count = Field(description="Worker threads that died and were replaced.")
    workers: list[Worker]


class Cache(ResponseModel):
    """The background-frame cache."""

    hits: Count
    misses: Count
    hit_rate: float = Field(ge=0, le=1)
    evictions: Count
    bytes: Count
    max_bytes: Count
    entries: Count


class IdleLoops(ResponseModel):
    """The shared encoded idle loops (``video.shared_idle``) and the frames sent from them."""

    bytes: Count
    max_bytes: Count = Field(description="`cache.idle_loop_bytes`.")
    loops: Count = Field(description="Loops kept: one per avatar, encoder and bitrate rung.")
    building: Count = Field(description="Loops queued or being encoded in the background.")
    built: Count
    evicted: Count
    failed: Count
    frames_shared: Count = Field(description="Video frames sent from shared loops.")
    frames_encoded: Count = Field(description="Video frames the calls encoded themselves.")


class Global(ResponseModel):
    """Server-wide totals since start-up."""

    models_registered: Count
    models_loaded: Count
    live_sessions: Count
    sessions_started: Count
    sessions_ended: Count
    sessions_rejected: Count
    frames_served: Count
    frames_dropped: Counts = Field(description="Frames not served, by reason.")
    cpu_ms_per_frame: NonNegative | None = Field(
        description="The process's CPU ms per frame sent over the last ~20 s, what "
        "admission prices a session's frames at; null until enough frames were sent."
    )
    evictions: Counts = Field(description="Model evictions: `capacity`, `idle`, `admin`.")
    uptime_s: NonNegative
    version: str


class Stats(ResponseModel):
    models: list[Model]
    devices: list[Device]
    cache: Cache
    idle_loops: IdleLoops
    # "global" is a Python keyword: the attribute has another name, the key is "global".
    totals: Global = Field(serialization_alias="global")


class SessionInfo(ResponseModel):
    """One live session."""

    # Read from the session's SessionSnapshot: its `session_id` is this `id`.
    id: str = Field(validation_alias="session_id", description="The session id.")
    avatar: AvatarId = Field(description="The avatar this session shows.")
    state: SessionStateName
    uptime_s: NonNegative
    output_fps: NonNegative
    added_delay_ms: AddedDelay
    av_offset_ms: float | None
    frames_dropped: Counts = Field(
        description="Frames shown idle instead of lip-synced, by reason."
    )
    bitrate_bps: int | None
    remote: str | None
    app_audio: AppAudio
    caller: bool = Field(description="False for a session made by `POST /sessions`.")
    kind: SessionKind = Field(
        description="`call` (`/offer`), `callerless` (`POST /sessions`), `whip` "
        "(`POST /whip/{avatar}`) or `livekit` (a LiveKit agent's avatar, "
        "`POST /livekit/sessions`)."
    )
    viewers: Count = Field(description="WHEP viewers watching it now.")
    outputs: Count = Field(description="Streams it pushes out now (RTMP).")


class Sessions(ResponseModel):
    sessions: list[SessionInfo]


class AvatarImportRequest(RequestModel):
    """Import another project's avatar folder (paths relative to ``avatars.import_root``)."""

    missing_code = "bad_import"
    wrong_type_code = "bad_import"
    value_codes: ClassVar[Mapping[str, str]] = {"id": "invalid_model_id"}

    source: Literal["synctalk2d", "livetalking"] = Field(
        description="The folder's layout: a SyncTalk_2D dataset folder or a LiveTalking avatar."
    )
    directory: str = Field(min_length=1, description="The folder, under the import root.")
    lipsync: str = Field(min_length=1, description="The lip-sync ONNX, under the import root.")
    audio_encoder: str | None = Field(
        default=None, description="The audio encoder ONNX (SyncTalk_2D), under the import root."
    )
    kind: Literal["wav2lip", "ultralight"] = Field(
        default="wav2lip", description="LiveTalking only: which model the avatar was made for."
    )
    id: AvatarId = Field(description="The new avatar's id.")
    replace: bool = Field(default=False, description="Overwrite an avatar of that id.")
    link: bool = Field(default=False, description="Hard-link frames instead of copying.")
    clips: dict[str, Annotated[list[int], Field(min_length=2, max_length=2)]] | None = Field(
        default=None,
        description="Named [start, stop) frame ranges written as avatar.json's clips "
        '(e.g. {"idle": [0, 60], "thinking": [120, 180]}); checked like the manifest.',
    )


class WorkerImport(ResponseModel):
    """What one worker of a cluster did with an import the front sent it."""

    outcome: Literal["imported", "registered"] = Field(
        description="`imported`: it wrote the package into its avatar root; `registered`: "
        "its avatar root already held the package another worker had just written (a root "
        "the workers share), and it registered it."
    )


class RegisteredAvatar(ResponseModel):
    id: AvatarId = Field(
        description="The avatar, registered from the package already in the avatar root."
    )


class ImportedAvatar(ResponseModel):
    id: AvatarId = Field(description="The new avatar's id, registered and ready to load.")
    source: str = Field(description="What it was imported from.")
    frames: Count = Field(description="Frames written.")
    frame_size: tuple[int, int] = Field(description="Width and height of the frames.")
    model_io: str = Field(description="The lip-sync model's inputs and output as bound.")
    dynamic_batch: bool = Field(
        description="False for a fixed batch of 1: it works, without cross-session batching."
    )
    notes: list[str] = Field(description="What the operator should know about the import.")


class ClusterImportedAvatar(ImportedAvatar):
    """A cluster front's answer: the first worker's import, and what every worker did."""

    workers: dict[str, WorkerImport] = Field(description="Each worker's outcome, by name.")


class HistorySeries(ResponseModel):
    """One figure over time: ``t`` and ``v`` are parallel, oldest first."""

    scope: Literal["device", "session", "server"]
    subject: str = Field(description="The device name, the session id, or `server`.")
    name: str = Field(
        description="device: `busy_share`, `queue_depth`, `mean_batch`; session: `fps`, "
        "`delay_p95_ms`, `dropped`, `dropped:<reason>`; server: `live_sessions`, "
        "`speaking_sessions`, `cpu_ms_per_frame`, `shared_fps`, `encoded_fps`."
    )
    t: list[float] = Field(description="Sample times, Unix seconds.")
    v: list[float] = Field(description="The values at those times.")


class History(ResponseModel):
    """The admin page's charts: a bounded in-process history sampled every `interval_s`."""

    interval_s: NonNegative
    points: Count = Field(description="The most points a series keeps.")
    max_series: Count = Field(description="The most series kept.")
    series: list[HistorySeries]
