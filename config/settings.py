"""The typed settings object: every option lipstream reads, with its default and limits.

``Settings`` is built once at start-up (see ``config.loader.load_settings``), validated
as a whole, frozen, and handed to constructors. Every section has defaults, so an empty
file (or no file) is valid and serves the built-in demo avatar on 127.0.0.1:8080.

Models forbid unknown keys so a typo (``prot: 9000``) stops start-up instead of being
silently ignored.

Why one module of about 400 lines: it is the one place an operator's file is checked
against, read top to bottom in the order of ``config/lipstream.example.yaml``; the
sections share their field types (byte sizes, paths, ICE URLs) and the cross-section
checks of :class:`Settings`, which a split would scatter.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    IPvAnyAddress,
    IPvAnyNetwork,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

_BYTE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": 1024 * GIB,
}
_BYTE_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_BYTE_SIZE_FORMS = (
    "expected a byte size: a whole number of bytes (65536) or a number with a unit, "
    "B, KB, MB, GB, TB (1000-based) or KiB, MiB, GiB, TiB (1024-based), "
    'e.g. "512MiB", "8GiB", "1.5GB"'
)

MODEL_ID_PATTERN = r"^[a-z0-9_-]{1,64}$"
_MODEL_ID_RE = re.compile(MODEL_ID_PATTERN)

#: Keys whose values are secrets: never shown in errors, reprs or dumps.
SECRET_KEYS: frozenset[str] = frozenset({"admin_token", "credential", "jwt_secret"})


def parse_byte_size(value: object) -> int:
    """Turn ``65536``, ``"65536"``, ``"64KiB"``, ``"1.5GB"`` into a number of bytes.

    KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024 (units are
    case-insensitive). Anything else raises ``ValueError`` listing the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError(_BYTE_SIZE_FORMS)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative; {_BYTE_SIZE_FORMS}")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if not isinstance(value, str):
        raise ValueError(_BYTE_SIZE_FORMS)
    match = _BYTE_SIZE_RE.match(value)
    if match is None:
        raise ValueError(_BYTE_SIZE_FORMS)
    number, unit = match.group(1), match.group(2).lower() or "b"
    if unit not in _BYTE_UNITS:
        raise ValueError(f"unknown unit {match.group(2)!r}; {_BYTE_SIZE_FORMS}")
    try:
        size = Decimal(number) * _BYTE_UNITS[unit]
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(_BYTE_SIZE_FORMS) from exc
    if size != size.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes; {_BYTE_SIZE_FORMS}")
    return int(size)


def _check_model_id(value: str) -> str:
    if not _MODEL_ID_RE.match(value):
        raise ValueError(
            f"model id must match {MODEL_ID_PATTERN} "
            "(1-64 characters: lowercase letters, digits, '_' and '-')"
        )
    return value


def _check_ice_url(value: str) -> str:
    if not value.startswith(("stun:", "turn:", "turns:")):
        raise ValueError("an ICE server URL must start with stun:, turn: or turns:")
    return value


def _one_or_many(value: object) -> object:
    return [value] if isinstance(value, str) else value


def default_data_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_DATA_HOME/lipstream`` when XDG_DATA_HOME is an absolute path, else
    ``~/.local/share/lipstream`` (the XDG base-directory rule)."""
    xdg = environ.get("XDG_DATA_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "lipstream"
    home = environ.get("HOME")
    return (Path(home) if home else Path.home()) / ".local" / "share" / "lipstream"


#: A size in bytes: an int, or a string such as "512MiB", "8GiB", "1.5GB".
ByteSize = Annotated[int, BeforeValidator(parse_byte_size)]
#: An avatar / model id: ``^[a-z0-9_-]{1,64}$``; it names a folder under ``avatars.root``.
ModelId = Annotated[str, AfterValidator(_check_model_id)]
#: A filesystem path; a leading ``~`` is expanded.
UserPath = Annotated[Path, AfterValidator(lambda p: p.expanduser())]
IceUrl = Annotated[str, AfterValidator(_check_ice_url)]


class _Section(BaseModel):
    """Common behaviour: frozen, unknown keys rejected, a null section means defaults.

    ``server:`` with every key commented out parses as null in YAML; treating that as
    "all defaults" is what the person editing the file means.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: Any) -> Any:
        return {} if data is None else data


class IceServer(_Section):
    """One STUN/TURN server handed to aiortc's ``RTCIceServer``."""

    urls: Annotated[list[IceUrl], BeforeValidator(_one_or_many)] = Field(min_length=1)
    username: str | None = None
    credential: SecretStr | None = None


class TurnSettings(_Section):
    """A TURN server (coturn's ``use-auth-secret``) whose credentials lipstream mints.

    Each client (``/webrtc-config``) and each of the server's own peer connections gets
    a username ``<expiry>:<id>`` and the base64 HMAC-SHA1 of it under ``secret``, valid
    ``ttl_s`` seconds: the TURN REST form coturn checks, so no password is shared.
    """

    urls: Annotated[list[IceUrl], BeforeValidator(_one_or_many)] = Field(default_factory=list)
    secret: SecretStr | None = None
    ttl_s: int = Field(default=3600, ge=60, le=7 * 86400)

    @model_validator(mode="after")
    def _both_or_neither(self) -> TurnSettings:
        if self.urls and self.secret is None:
            raise ValueError(
                "turn.secret is required when turn.urls is set (coturn's static-auth-secret)"
            )
        if self.secret is not None and not self.urls:
            raise ValueError("turn.urls is required when turn.secret is set")
        if any(not url.startswith(("turn:", "turns:")) for url in self.urls):
            raise ValueError("turn.urls must be turn: or turns: URLs")
        return self


class ServerSettings(_Section):
    """HTTP listener, WebRTC ICE configuration, admission and request limits."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    # Empty by default: aiortc's None means a public Google STUN server, which a
    # self-hosted server must not contact unless asked to.
    ice_servers: list[IceServer] = Field(default_factory=list)
    # Gather only 127.0.0.1 host candidates (aioice skips loopback addresses): for
    # loopback-only sandboxes and same-machine tests. Applied by ``web.serve.serve``.
    ice_loopback_only: bool = False
    # The event loop the server runs on: uvloop (libuv; a listening call costs about a
    # seventh less CPU, docs/benchmarks.md §17) or Python's own asyncio loop. uvloop is
    # installed with lipstream on Linux and macOS; where it is missing, asyncio is used.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # The address callers reach this machine at through a 1:1 NAT (same ports): every
    # host candidate of an answer gets a twin there (streaming.webrtc.public_address).
    # A cluster worker takes its own node's LIPSTREAM_SERVER__ICE_PUBLIC_ADDRESS.
    ice_public_address: IPvAnyAddress | None = None
    # Reverse proxies whose Forwarded / X-Forwarded-For headers name the client
    # (addresses or CIDRs, e.g. ["127.0.0.1", "10.0.0.0/8"]); empty: trust none.
    trusted_proxies: list[IPvAnyNetwork] = Field(default_factory=list)
    # The one header those proxies write: nginx, Caddy, HAProxy and Traefik append to
    # X-Forwarded-For and pass a client's own Forwarded on untouched, so reading the
    # other header would let any client name itself.
    forwarded_header: Literal["x-forwarded-for", "forwarded"] = "x-forwarded-for"
    cors_origins: list[str] = Field(default_factory=list)
    admin_token: SecretStr | None = None
    max_sessions: int = Field(default=16, ge=1)
    # Admission (streaming.live.admission): the share of each device's workers and of the
    # process's cores that sessions may be given; CPU ms per 1280x720 frame (composing +
    # encoding; null = the larger of an estimate from video.preset and the process's
    # measured CPU per frame sent); inference ms per frame assumed for a
    # model on a device that has run nothing yet.
    admission_headroom: float = Field(default=0.8, gt=0, le=1)
    cpu_ms_per_session_frame: float | None = Field(default=None, gt=0)
    inference_ms_per_frame_estimate: float = Field(default=10.0, gt=0)
    max_offer_bytes: ByteSize = Field(default=64 * KIB, ge=1)
    offer_rate_limit_per_minute: int = Field(default=30, ge=0)
    request_timeout_s: float = Field(default=30.0, gt=0)
    # The gRPC listener (on ``host``): the Open Inference Protocol v2
    # (inference.GRPCInferenceService) and the seed's inference.InferenceService;
    # null turns it off. Its messages are capped at the largest request a model takes
    # (web.inference.grpc_server.message_limit).
    grpc_port: int | None = Field(default=8081, ge=1, le=65535)
    # A request head must arrive within this many seconds of the connection opening (or
    # of its first byte), else the connection is closed: half-sent heads hold sockets.
    head_timeout_s: float = Field(default=10.0, gt=0, le=300)
    # Open connections one address may hold (trusted proxies are exempt).
    max_connections_per_client: int = Field(default=256, ge=1)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    # The admin page's charts (GET /admin/history): points kept per series, and seconds
    # between two samples of the snapshots.
    history_points: int = Field(default=150, ge=2, le=10_000)
    history_interval_s: float = Field(default=2.0, ge=0.1, le=3600)


class DevicesSettings(_Section):
    """Which devices run inference and how much each may hold."""

    kind: Literal["auto", "cpu", "cuda"] = "auto"
    count: int | None = Field(default=None, ge=1)
    workers_per_device: int | None = Field(default=None, ge=1)
    max_models_per_device: int = Field(default=64, ge=1)
    max_memory_per_device: ByteSize | None = Field(default=None, ge=1)
    cpu_threads_per_session: int = Field(default=0, ge=0)
    # GPU options, each off until measured better on the GPU at hand (docs/performance.md).
    precision: Literal["fp32", "fp16"] = "fp32"
    tensorrt: bool = False
    tensorrt_cache_dir: UserPath = Path("~/.cache/lipstream/tensorrt").expanduser()

    def workers_for(self, kind: str) -> int:
        """Worker threads per device of ``kind``: the setting, or 2 on CUDA and 1 on CPU.

        On a GPU a second worker prepares the next batch while one runs; on a CPU the
        model already uses every core, and two workers measured 10% slower (docs/).
        """
        if self.workers_per_device is not None:
            return self.workers_per_device
        return 2 if kind == "cuda" else 1


class ModelSettings(_Section):
    """Per-model placement hints, keyed by model id in ``registry.models``."""

    preferred_device: int | None = Field(default=None, ge=0)
    preload: bool = False


class RegistrySettings(_Section):
    """Loading, placing and evicting models on devices."""

    eviction_policy: Literal["lru", "lfu"] = "lru"
    idle_timeout_s: float = Field(default=900.0, ge=0)
    assignment: Literal["round-robin", "least-loaded"] = "least-loaded"
    load_timeout_s: float = Field(default=120.0, gt=0)
    # A raw inference request (/v1/infer, /v2, gRPC) for a model that is not loaded
    # loads it (true) or is refused as not ready (false: models are loaded only by
    # preload, /admin or the repository API, as Triton's explicit model control).
    load_on_infer: bool = True
    models: dict[ModelId, ModelSettings] = Field(default_factory=dict)

    @field_validator("models", mode="before")
    @classmethod
    def _null_models(cls, value: Any) -> Any:
        return {} if value is None else value


class BatchingSettings(_Section):
    """Cross-session batching per model."""

    max_batch_size: int | None = Field(default=None, ge=1, le=64)
    max_wait_ms: float = Field(default=3.0, ge=0, le=100)
    queue_size: int = Field(default=256, ge=1)

    def size_for(self, kind: str) -> int:
        """The most frames of one model per run on a device of ``kind``: the setting, or 8
        on CUDA and 2 on CPU.

        On a GPU a batch fills the device; on a CPU a larger batch's activations spill
        out of the caches, and the demo model served 1.46x more frames/s at 8 sessions
        with batches of 2 than of 8 (a compute-bound model is level; docs/performance.md).
        """
        if self.max_batch_size is not None:
            return self.max_batch_size
        return 8 if kind == "cuda" else 2


class CacheSettings(_Section):
    """Memory bounds of the compositor's caches."""

    background_cache_bytes: ByteSize = Field(default=256 * MIB, ge=0)
    idle_loop_bytes: ByteSize = Field(default=256 * MIB, ge=0)


class AvatarsSettings(_Section):
    """Where avatar packages live."""

    root: UserPath = Path("./avatars")
    data_dir: UserPath = Field(default_factory=lambda: default_data_dir(os.environ))
    demo: bool = True
    # The only directory POST /admin/avatars/import may read; null turns that route off.
    import_root: UserPath | None = None


class AudioSettings(_Section):
    """Audio features, voice activity and speech/silence blending."""

    right_context: int = Field(default=7, ge=0, le=7)
    vad_threshold_db: float = Field(default=-45.0, ge=-100, le=0)
    hangover_frames: int = Field(default=4, ge=0)
    blend_frames: int = Field(default=3, ge=0)
    #: Opus DTX both ways (``streaming/webrtc/dtx.py``): the answer asks the caller to
    #: send no packets while silent (``usedtx=1``), and a caller whose offer asks for it
    #: gets the avatar's silence as DTX.
    dtx: bool = True


#: libx264's presets, fastest first (NVENC maps each to one of its own).
X264Preset = Literal[
    "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow"
]


class VideoSettings(_Section):
    """H.264 encoding of the outgoing avatar video."""

    encoder: Literal["auto", "libx264", "h264_nvenc"] = "auto"
    preset: X264Preset = "ultrafast"
    bitrate_kbps: int | None = Field(default=None, ge=100)
    keyframe_interval_s: float = Field(default=10.0, gt=0)
    #: The encoder's VBV buffer in seconds at its target: the most of the link's time one
    #: frame (an IDR) may take, what a caller's jitter buffer is sized by on a slow link.
    vbv_s: float = Field(default=0.15, ge=0.04, le=1.0)
    encoder_threads: int = Field(default=1, ge=0, le=64)
    shared_idle: bool = True
    idle_keyframe_interval_s: float = Field(default=0.48, gt=0, le=10)
    #: The steady idle loops' keyframe interval (``streaming/live/idle_sharing.py``): a
    #: call whose caller sends transport-cc and whose link carries the full rate moves to
    #: them from the joining loops above. 0 (or not more than the joining interval) sends
    #: the joining loops only.
    idle_steady_keyframe_interval_s: float = Field(default=1.92, ge=0, le=60)
    idle_preset: X264Preset = "veryfast"
    idle_constant_quality: bool = True
    idle_bitrate_rungs: tuple[float, ...] = Field(default=(1.0, 0.5, 0.25, 0.125), min_length=1)
    switch_fade_s: float = Field(default=0.32, ge=0, le=2)

    @field_validator("idle_bitrate_rungs")
    @classmethod
    def _rungs_in_range(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        for rung in value:
            if not 0.05 <= rung <= 1.0:
                raise ValueError(
                    f"each rung is a fraction of the ladder step's bitrate in 0.05..1.0, got {rung}"
                )
        return tuple(sorted(set(value), reverse=True))


class SessionSettings(_Section):
    """Per-session deadlines and input limits."""

    ice_timeout_s: float = Field(default=20.0, gt=0)
    idle_timeout_s: float = Field(default=300.0, ge=0)
    max_audio_push_bytes: ByteSize = Field(default=16 * MIB, ge=1)
    max_say_chars: int = Field(default=2000, ge=1)
    max_queued_audio_s: float = Field(default=120.0, gt=0)
    max_stream_buffer_s: float = Field(default=20.0, gt=0)
    event_queue_size: int = Field(default=256, ge=8, le=100_000)
    pipeline_margin_ms: float = Field(default=40.0, ge=0, le=2000)


class BroadcastSettings(_Section):
    """Sessions watched by viewers (WHEP, ``docs/architecture.md`` §21)."""

    # Viewers one session may have at once (each costs about what a listening call
    # does: its own headers and encryption of the session's packets). A viewer past it
    # is refused with 503 too_many_viewers.
    viewers_per_session: int = Field(default=50, ge=0, le=10_000)
    # Viewers whose link cannot carry the session's stream watch it at a lower step of
    # the quality ladder (540p, 360p, 270p, 15 fps), each step encoded once for all its
    # viewers from the session's decoded frames. Off: every viewer gets the one stream.
    rungs: bool = True


class OutputsSettings(_Section):
    """Streams a session pushes out (RTMP, ``docs/architecture.md`` §21)."""

    # Whether an output may go to a loopback, private, link-local or otherwise
    # non-public address. Off: a client of the API cannot make the server connect into
    # the network it runs in. Turn on for an ingest on your own network.
    allow_private: bool = False
    # Outputs one session may have at once.
    max_per_session: int = Field(default=4, ge=0, le=64)
    # The longest wait between two tries to reach an ingest that dropped or refused
    # (the waits double from 1 s up to this).
    retry_max_s: float = Field(default=30.0, ge=1, le=3600)
    # Seconds to connect to an ingest, and the longest a write may block, before the
    # try counts as failed.
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300)


class TtsSettings(_Section):
    """Text-to-speech for the ``say`` API."""

    engine: Literal["auto", "espeak", "http", "none"] = "auto"
    voice: str = "en"
    http_url: str | None = Field(default=None, validate_default=True)
    http_timeout_s: float = Field(default=10.0, gt=0)

    @field_validator("http_url")
    @classmethod
    def _url_when_http(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A field validator (not a model validator) so the error is reported at
        # tts.http_url, the key the user has to fix.
        if value is None:
            if info.data.get("engine") == "http":
                raise ValueError('required when tts.engine is "http"')
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


class AuthSettings(_Section):
    """Signed session tokens (JWT) for /offer and the session endpoints."""

    jwt_secret: SecretStr | None = None
    jwt_algorithm: Literal["HS256", "HS384", "HS512"] = "HS256"
    leeway_s: float = Field(default=30.0, ge=0, le=600)
    max_ttl_s: float = Field(default=86_400.0, gt=0)


class LoggingSettings(_Section):
    """Log verbosity and line format."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"


class ClusterSettings(_Section):
    """Worker processes on Ray behind this process's HTTP front (docs/architecture.md §14)."""

    # Worker processes, each a full lipstream stack (its own inference core, sessions and
    # event loop); 0 = this process serves everything itself and Ray is not needed.
    workers: int = Field(default=0, ge=0, le=4096)
    # An existing Ray cluster to join ("auto", "host:6379", "ray://host:10001"); null =
    # start a local Ray runtime inside the server.
    ray_address: str | None = None
    # Resources each worker is declared to Ray with: CPU cores, and a share of one GPU
    # (1/k for k workers per GPU; Ray then sets CUDA_VISIBLE_DEVICES for the worker).
    cpus_per_worker: float = Field(default=1.0, gt=0)
    gpus_per_worker: float = Field(default=0.0, ge=0, le=1)
    # Where workers listen for the front's HTTP requests: 127.0.0.1 on one machine;
    # 0.0.0.0 across nodes (a worker then gives the front its node's address).
    worker_host: str = "127.0.0.1"
    # A dead worker is restarted by Ray this many times (-1: always).
    max_restarts: int = Field(default=-1, ge=-1)
    # Each worker reports its load this often; one that does not answer within the
    # timeout is skipped by placement until it does.
    report_interval_s: float = Field(default=1.0, gt=0, le=60)
    report_timeout_s: float = Field(default=1.0, gt=0, le=60)


class Settings(_Section):
    """Everything lipstream can be configured with; build it with ``load_settings``."""

    server: ServerSettings = Field(default_factory=ServerSettings)
    turn: TurnSettings = Field(default_factory=TurnSettings)
    devices: DevicesSettings = Field(default_factory=DevicesSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    batching: BatchingSettings = Field(default_factory=BatchingSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    avatars: AvatarsSettings = Field(default_factory=AvatarsSettings)
    audio: AudioSettings = Field(default_factory=AudioSettings)
    video: VideoSettings = Field(default_factory=VideoSettings)
    session: SessionSettings = Field(default_factory=SessionSettings)
    broadcast: BroadcastSettings = Field(default_factory=BroadcastSettings)
    outputs: OutputsSettings = Field(default_factory=OutputsSettings)
    tts: TtsSettings = Field(default_factory=TtsSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
