"""The typed settings object: every option lipstream reads, with its default and limits.

``Settings`` is built once at start-up (see ``config.loader.load_settings``), validated
as a whole, frozen, and handed to constructors. Every section has defaults, so an empty
file (or no file) is valid and serves the built-in demo avatar on 127.0.0.1:8080.

Models forbid unknown keys so a typo (``prot: 9000``) stops start-up instead of being
silently ignored.

Every field has a docstring: pydantic makes it the field's description
(``use_attribute_docstrings``), and the documentation site's configuration reference is
generated from those descriptions (``tests/test_settings_docs.py`` checks none is missing).

Why one module of about 800 lines: it is the one place an operator's file is checked
against, read top to bottom in the order of ``config/lipstream.example.yaml``, and its
field docs are the configuration reference; the sections share their field types (byte
sizes, paths, ICE URLs) and the cross-section checks of :class:`Settings`, which a split
would scatter.
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

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: Any) -> Any:
        return {} if data is None else data


class IceServer(_Section):
    """One STUN/TURN server handed to aiortc's ``RTCIceServer``."""

    urls: Annotated[list[IceUrl], BeforeValidator(_one_or_many)] = Field(min_length=1)
    """The server's URLs (``stun:``, ``turn:`` or ``turns:``); one string or a list."""
    username: str | None = None
    """The TURN username, if the server needs one."""
    credential: SecretStr | None = None
    """The TURN password; never shown in logs or errors."""


class TurnSettings(_Section):
    """A TURN server (coturn's ``use-auth-secret``) whose credentials lipstream mints.

    Each client (``/webrtc-config``) and each of the server's own peer connections gets
    a username ``<expiry>:<id>`` and the base64 HMAC-SHA1 of it under ``secret``, valid
    ``ttl_s`` seconds: the TURN REST form coturn checks, so no password is shared.
    """

    urls: Annotated[list[IceUrl], BeforeValidator(_one_or_many)] = Field(default_factory=list)
    """The TURN server's ``turn:`` or ``turns:`` URLs, e.g.
    ``["turn:turn.example.org:3478?transport=udp", "turns:turn.example.org:5349"]``;
    empty: no TURN."""
    secret: SecretStr | None = None
    """The shared secret, coturn's ``static-auth-secret``; required with ``urls``."""
    ttl_s: int = Field(default=3600, ge=60, le=7 * 86400)
    """Seconds the minted credentials stay valid."""

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
    """The address to listen on; ``0.0.0.0`` accepts connections from other machines."""
    port: int = Field(default=8080, ge=1, le=65535)
    """The HTTP port."""
    ice_servers: list[IceServer] = Field(default_factory=list)
    """STUN and TURN servers offered to WebRTC peers and used by the server's own
    connections; needed when peers are behind NAT. Empty by default: aiortc's ``None``
    would mean a public Google STUN server, which a self-hosted server must not contact
    unless asked to."""
    ice_loopback_only: bool = False
    """Gather only ``127.0.0.1`` host candidates (aioice skips loopback addresses): for a
    machine with no other network, or a browser on this same machine (Chromium:
    ``--allow-loopback-in-peer-connection``); remote peers then cannot connect. Applied
    by ``web.serve.serve``."""
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """The event loop the server runs on: uvloop (libuv; a listening call costs about a
    seventh less CPU, ``docs/performance/live-calls.md``) or Python's own asyncio loop.
    uvloop is installed with lipstream on Linux and macOS; where it is missing, asyncio is
    used."""
    ice_public_address: IPvAnyAddress | None = None
    """The IP address callers reach this machine at through a 1:1 NAT that keeps ports (a
    cloud VM's public address): every host candidate of an answer gets a twin there
    (``streaming.webrtc.public_address``). null: the machine's own addresses only (a STUN
    server in ``ice_servers`` finds the public one too). A cluster worker takes its own
    node's ``LIPSTREAM_SERVER__ICE_PUBLIC_ADDRESS``."""
    trusted_proxies: list[IPvAnyNetwork] = Field(default_factory=list)
    """Reverse proxies (addresses or CIDRs, e.g. ``["127.0.0.1", "10.0.0.0/8"]``) whose
    ``Forwarded`` / ``X-Forwarded-For`` headers name the client: rate limits, logs and
    sessions then see the real client. Headers from any other peer are ignored; empty:
    trust none."""
    forwarded_header: Literal["x-forwarded-for", "forwarded"] = "x-forwarded-for"
    """The one header those proxies write the client into, and the only one read:
    ``x-forwarded-for`` (nginx, Caddy, HAProxy, Traefik) or ``forwarded`` (RFC 7239).
    Those proxies pass a client's own copy of the other header on untouched, so reading
    it would let any client name itself."""
    cors_origins: list[str] = Field(default_factory=list)
    """Web origins allowed to call the HTTP API from a browser (CORS), e.g.
    ``["https://app.example.org"]``; empty: same origin only."""
    admin_token: SecretStr | None = None
    """The bearer token the admin API takes; null: admin answers loopback peers only
    (never a proxied request). Never shown in logs or errors."""
    max_sessions: int = Field(default=16, ge=1)
    """Concurrent sessions before new offers get 503 + ``Retry-After``."""
    admission_headroom: float = Field(default=0.8, gt=0, le=1)
    """The share of capacity sessions may fill (``streaming.live.admission``): a session
    is admitted only while every device's inference (workers × 1000 ms a second) and the
    process's CPU (cores × 1000 ms a second) stay within it, counting every session as
    speaking all the time."""
    cpu_ms_per_session_frame: float | None = Field(default=None, gt=0)
    """CPU milliseconds one session needs per 1280×720 output frame (audio features,
    compositing, H.264 encoding and the WebRTC send path; scaled by pixel count for
    other sizes), used as given. null: the larger of an estimate from ``video.preset``
    (10 ms ultrafast, 11.9 superfast, 13.1 veryfast, 24 medium, plus inference on a CPU
    device) and what a frame sent has cost this process over the last ~20 s, once enough
    frames went out (``GET /admin/stats`` ``global.cpu_ms_per_frame``)."""
    inference_ms_per_frame_estimate: float = Field(default=10.0, gt=0)
    """Inference milliseconds per frame assumed for a model not measured yet, on a device
    that has run no frame yet (otherwise that device's mean is used)."""
    max_offer_bytes: ByteSize = Field(default=64 * KIB, ge=1)
    """The largest SDP offer body accepted."""
    offer_rate_limit_per_minute: int = Field(default=30, ge=0)
    """Offers accepted per minute from one client address (429 with ``Retry-After``
    beyond); 0: no limit."""
    request_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds an HTTP request may take before it is cut off; also the deadline of a raw
    inference request."""
    grpc_port: int | None = Field(default=8081, ge=1, le=65535)
    """The gRPC listener's port (on ``host``): the Open Inference Protocol v2
    (``inference.GRPCInferenceService``, what tritonclient's gRPC client calls) and the
    seed's ``inference.InferenceService``; null: no gRPC listener. Its messages are
    capped at the largest request a model takes
    (``web.inference.grpc_server.message_limit``)."""
    head_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Seconds a request head may take to arrive, from the connection opening or its
    first byte; slower connections are closed, since half-sent heads would hold sockets."""
    max_connections_per_client: int = Field(default=256, ge=1)
    """Open connections one client address may hold; more are refused at once. Trusted
    proxies are exempt: they carry everyone's connections."""
    drain_timeout_s: float = Field(default=30.0, ge=0)
    """On SIGTERM or SIGINT, seconds live sessions may go on before they are closed."""
    history_points: int = Field(default=150, ge=2, le=10_000)
    """Points each series of the admin page's charts keeps (``GET /admin/history``):
    5 minutes at the default interval."""
    history_interval_s: float = Field(default=2.0, ge=0.1, le=3600)
    """Seconds between two samples of the charts' figures."""


class DevicesSettings(_Section):
    """Which devices run inference and how much each may hold."""

    kind: Literal["auto", "cpu", "cuda"] = "auto"
    """Where inference runs: ``auto`` (CUDA when onnxruntime has its provider and a GPU is
    visible, else the CPU; the log says which and why), ``cpu`` or ``cuda`` (refuses to
    start without a GPU)."""
    count: int | None = Field(default=None, ge=1)
    """How many devices to use; null: every GPU, or one CPU device. Several CPU devices
    run the whole core on a machine without a GPU."""
    workers_per_device: int | None = Field(default=None, ge=1)
    """Inference worker threads per device; null: 2 on CUDA, 1 on CPU."""
    max_models_per_device: int = Field(default=64, ge=1)
    """Models loaded at once per device before an idle one is evicted."""
    max_memory_per_device: ByteSize | None = Field(default=None, ge=1)
    """The memory models may use on one device (e.g. ``"8GiB"``), as measured at each
    load; null: no budget (on a GPU NVML reads, its real free memory still bounds it).
    Cluster workers sharing a GPU keep within ``cluster.gpus_per_worker`` of it."""
    cpu_threads_per_session: int = Field(default=0, ge=0)
    """onnxruntime intra-op threads per CPU session; 0: the cores divided among all CPU
    workers."""
    precision: Literal["fp32", "fp16"] = "fp32"
    """Model weights on CUDA devices: ``fp32`` or ``fp16`` (inputs and outputs stay
    float32). A GPU option, off until measured better on the GPU at hand
    (``docs/performance/inference.md``)."""
    tensorrt: bool = False
    """Put onnxruntime's TensorRT provider first on CUDA devices (needs the TensorRT
    libraries; a load fails naming them when they are missing). Building an engine takes
    minutes the first time. A GPU option, off until measured better."""
    tensorrt_cache_dir: UserPath = Path("~/.cache/lipstream/tensorrt").expanduser()
    """Where TensorRT engines and timing caches are kept between starts."""

    def workers_for(self, kind: str) -> int:
        """Worker threads per device of ``kind``: the setting, or 2 on CUDA and 1 on CPU.

        On a GPU a second worker prepares the next batch while one runs; on a CPU the
        model already uses every core, and two workers measured 10% slower
        (``docs/performance/inference.md``).
        """
        if self.workers_per_device is not None:
            return self.workers_per_device
        return 2 if kind == "cuda" else 1


class ModelSettings(_Section):
    """Per-model placement hints, keyed by model id in ``registry.models``."""

    preferred_device: int | None = Field(default=None, ge=0)
    """The device index this model is placed on; null: any, by ``registry.assignment``."""
    preload: bool = False
    """Load at start-up instead of on first use; a preloaded model is never evicted for
    being idle."""


class RegistrySettings(_Section):
    """Loading, placing and evicting models on devices."""

    eviction_policy: Literal["lru", "lfu"] = "lru"
    """Which idle model goes when a device is full: ``lru`` (least recently used) or
    ``lfu`` (least frequently used). A model in use is never evicted."""
    idle_timeout_s: float = Field(default=900.0, ge=0)
    """Seconds a model may sit unused before it is unloaded; 0: never."""
    assignment: Literal["round-robin", "least-loaded"] = "least-loaded"
    """How a model is placed on a device: ``least-loaded`` (most free memory, then the
    shortest queue) or ``round-robin``."""
    load_timeout_s: float = Field(default=120.0, gt=0)
    """Seconds allowed for loading and warming one model."""
    load_on_infer: bool = True
    """A raw inference request (``/v1/infer``, ``/v2``, gRPC) for a model that is not
    loaded: true loads it on demand; false refuses it as not ready (503, gRPC
    ``UNAVAILABLE``) until preload, ``/admin`` or the repository load API loads it, as
    Triton's explicit model control."""
    models: dict[ModelId, ModelSettings] = Field(default_factory=dict)
    """Per-model placement, keyed by model id (the avatar folder's name)."""

    @field_validator("models", mode="before")
    @classmethod
    def _null_models(cls, value: Any) -> Any:
        return {} if value is None else value


class BatchingSettings(_Section):
    """Cross-session batching per model."""

    max_batch_size: int | None = Field(default=None, ge=1, le=64)
    """The most frames of one model run together; null: 8 on CUDA, 2 on CPU (larger CPU
    batches spill out of the caches and cost more per frame)."""
    max_wait_ms: float = Field(default=3.0, ge=0, le=100)
    """Milliseconds a batch may wait for more frames; it waits only for a session due
    within that window."""
    queue_size: int = Field(default=256, ge=1)
    """Frames each device's queue holds; a full queue refuses at once."""

    def size_for(self, kind: str) -> int:
        """The most frames of one model per run on a device of ``kind``: the setting, or 8
        on CUDA and 2 on CPU.

        On a GPU a batch fills the device; on a CPU a larger batch's activations spill
        out of the caches, and the demo model served 1.46x more frames/s at 8 sessions
        with batches of 2 than of 8 (a compute-bound model is level;
        ``docs/performance/inference.md``).
        """
        if self.max_batch_size is not None:
            return self.max_batch_size
        return 8 if kind == "cuda" else 2


class CacheSettings(_Section):
    """Memory bounds of the compositor's caches."""

    background_cache_bytes: ByteSize = Field(default=256 * MIB, ge=0)
    """Memory for decoded avatar frames, shared by all sessions (least recently used
    first out)."""
    idle_loop_bytes: ByteSize = Field(default=256 * MIB, ge=0)
    """Memory for the encoded idle loops listening calls share (``video.shared_idle``);
    0: build none, every call encodes its own idle frames."""


class AvatarsSettings(_Section):
    """Where avatar packages live."""

    root: UserPath = Path("./avatars")
    """The folder holding avatar packages, one sub-folder per avatar id; relative to the
    working directory, ``~`` expanded."""
    data_dir: UserPath = Field(default_factory=lambda: default_data_dir(os.environ))
    """Where generated data goes, such as the built-in demo avatar:
    ``$XDG_DATA_HOME/lipstream`` when that is set, else ``~/.local/share/lipstream``."""
    demo: bool = True
    """Register the built-in ``demo`` avatar (a package of the same id under ``root``
    wins)."""
    import_root: UserPath | None = None
    """The only directory ``POST /admin/avatars/import`` may read (folders and models to
    import are named relative to it); null turns that route off."""


class AudioSettings(_Section):
    """Audio features, voice activity and speech/silence blending."""

    right_context: int = Field(default=7, ge=0, le=7)
    """Future audio-feature rows the model sees: each costs 40 ms of delay; fewer gives
    less delay and lower lip-sync quality."""
    vad_threshold_db: float = Field(default=-45.0, ge=-100, le=0)
    """Loudness (dBFS) above which audio counts as speech and its frames are inferred."""
    hangover_frames: int = Field(default=4, ge=0)
    """Frames speech is held after the level drops below the threshold."""
    blend_frames: int = Field(default=3, ge=0)
    """Frames the face fades over between speech and silence."""
    dtx: bool = True
    """Opus DTX both ways (``streaming/webrtc/dtx.py``): the answer asks the caller to send
    no audio packets while silent (``usedtx=1``), and a caller whose offer asks for it
    (as ``lipstream.js`` does) gets the avatar's silence as two packets per 400 ms
    instead of 50 a second."""


#: libx264's presets, fastest first (NVENC maps each to one of its own).
X264Preset = Literal[
    "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow"
]


class VideoSettings(_Section):
    """H.264 encoding of the outgoing avatar video."""

    encoder: Literal["auto", "libx264", "h264_nvenc"] = "auto"
    """The H.264 encoder: ``auto`` (``h264_nvenc`` when a GPU with NVENC opens it, else
    libx264), ``libx264`` or ``h264_nvenc``."""
    preset: X264Preset = "ultrafast"
    """The libx264 preset of live frames: faster presets cost less CPU per frame
    (``docs/performance/live-calls.md``). lipstream's ultrafast keeps x264's deblocking
    filter on (x264's own turns it off)."""
    bitrate_kbps: int | None = Field(default=None, ge=100)
    """The target bitrate in kbit/s; null: chosen by resolution. The call's link lowers
    the target to what it carries."""
    keyframe_interval_s: float = Field(default=10.0, gt=0)
    """Seconds between the keyframes the live stream makes on its own. Keyframes also come
    when a caller asks (after a loss), when a call leaves a shared idle loop and when the
    link reopens the encoder, so few are needed: each is 3–4 frames' worth of bits, and a
    caller's jitter buffer grows with the largest frames it sees
    (``docs/design/link.md`` §19)."""
    vbv_s: float = Field(default=0.15, ge=0.04, le=1.0)
    """The encoder's VBV buffer in seconds at its target: the most of the link's time one
    frame (an IDR) may take, what a caller's jitter buffer is sized by on a slow link;
    smaller makes a keyframe coarser for a few frames."""
    encoder_threads: int = Field(default=1, ge=0, le=64)
    """libx264 threads per stream; 0: x264 decides (1.5 per core, for one big stream).
    Streams are the parallelism on a busy server."""
    shared_idle: bool = True
    """Share the idle frames: each avatar's idle loop is H.264-encoded once, in the
    background, and every call that is not speaking sends those frames instead of
    encoding its own (``docs/design/idle-loops.md`` §16); false: every call encodes its
    own idle frames."""
    idle_keyframe_interval_s: float = Field(default=0.48, gt=0, le=10)
    """Seconds between the keyframes of a shared (joining) idle loop: where a call may
    join it (0.48 s is 12 frames at 25 fps)."""
    idle_steady_keyframe_interval_s: float = Field(default=1.92, ge=0, le=60)
    """The steady idle loops' keyframe interval (``streaming/live/idle_sharing.py``): a
    call whose caller sends transport-cc and whose link carries the full rate moves to
    them from the joining loops (fewer keyframes: 0.70 of the packets and 0.65 of the bytes
    on the demo avatar). 0, or not more than the joining interval, sends the joining
    loops only."""
    idle_preset: X264Preset = "veryfast"
    """The libx264 preset of the shared idle loops: encoded once, so a slower, better one
    than the live preset pays."""
    idle_constant_quality: bool = True
    """Encode idle loops at constant quality (x264 CRF 26) capped at each rung's bitrate,
    so an avatar whose picture needs fewer bits sends fewer while listening; false: at the
    rung's bitrate, like live frames. libx264 only."""
    idle_bitrate_rungs: tuple[float, ...] = Field(default=(1.0, 0.5, 0.25, 0.125), min_length=1)
    """The bitrates each idle loop is encoded at, as fractions (0.05–1.0) of the bitrate
    of the call's quality-ladder step; a call sends the highest one that fits its link's
    target, each built when a call first needs it."""
    switch_fade_s: float = Field(default=0.32, ge=0, le=2)
    """Seconds a call's picture dissolves from one avatar to the next when it switches
    (``POST /sessions/{id}/avatar``); 0: a cut."""

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
    """Seconds for ICE to connect (and DTLS to finish) before the session is dropped."""
    idle_timeout_s: float = Field(default=300.0, ge=0)
    """Seconds without audio (and, for a session no caller owns, without a viewer or an
    output) after which a session ends as idle; 0: never."""
    max_audio_push_bytes: ByteSize = Field(default=16 * MIB, ge=1)
    """The largest audio body one push may carry."""
    max_say_chars: int = Field(default=2000, ge=1)
    """The longest text the say API takes, in characters."""
    max_queued_audio_s: float = Field(default=120.0, gt=0)
    """Most pushed and spoken audio queued in one session, in seconds; a push beyond it
    is refused with 429."""
    max_stream_buffer_s: float = Field(default=20.0, gt=0)
    """Most audio a WebSocket stream (``/sessions/{id}/audio/stream``) may have queued, in
    seconds: a message beyond it is refused with an ``audio_queue_full`` error, so a
    producer faster than real time is told instead of growing memory."""
    event_queue_size: int = Field(default=256, ge=8, le=100_000)
    """Events one listener (a stream, a server-sent-events reader, the data channel) may
    have unread; one further behind is disconnected."""
    pipeline_margin_ms: float = Field(default=40.0, ge=0, le=2000)
    """Milliseconds a frame has to be inferred and composited once its audio is complete,
    on top of the model's lookahead; a frame not ready by then shows the idle avatar.
    Every millisecond of it is one every caller waits: 40 is the smallest that kept
    ≥ 99 % of frames lip-synced with the 720p calls admission lets in
    (``docs/performance/live-calls.md``)."""


class BroadcastSettings(_Section):
    """Sessions watched by viewers (WHEP, ``docs/design/broadcast.md`` §21)."""

    viewers_per_session: int = Field(default=50, ge=0, le=10_000)
    """Viewers one session may have at once (each costs less than a listening call: its
    own headers and encryption of the session's packets); a viewer past it is refused
    with 503 ``too_many_viewers``."""
    rungs: bool = True
    """Viewers whose link cannot carry the session's stream watch it at a lower step of
    the quality ladder (540p, 360p, 270p, 15 fps), each step encoded once for all its
    viewers from the session's decoded frames; false: every viewer gets the one stream."""


class OutputsSettings(_Section):
    """Streams a session pushes out (RTMP, ``docs/design/broadcast.md`` §21)."""

    allow_private: bool = False
    """Whether an output may go to a loopback, private, link-local or otherwise
    non-public address. Off: a client of the API cannot make the server connect into the
    network it runs in. Turn on for an ingest on your own network."""
    max_per_session: int = Field(default=4, ge=0, le=64)
    """Outputs one session may have at once."""
    retry_max_s: float = Field(default=30.0, ge=1, le=3600)
    """The longest wait between two tries to reach an ingest that dropped or refused (the
    waits double from 1 s up to this)."""
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Seconds to connect to an ingest, and the longest a write may block, before the try
    counts as failed."""


class LiveKitSettings(_Section):
    """Avatars of LiveKit Agents voice agents, in LiveKit rooms (``POST /livekit/sessions``,
    ``docs/design/livekit.md``). Needs ``pip install 'lipstream[livekit]'``."""

    allow_private: bool = False
    """Whether a session may join a LiveKit server at a loopback, private, link-local or
    otherwise non-public address. Off: a client of the API cannot make the server connect
    into the network it runs in. Turn on when LiveKit runs on your own network (as a
    self-hosted LiveKit usually does)."""
    connect_timeout_s: float = Field(default=10.0, gt=0, le=120)
    """Seconds to join the room and publish the avatar's tracks before the request fails
    (``502 livekit_unreachable``)."""
    agent_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """Seconds the avatar waits in its room for the agent it speaks for (the token's
    ``lk.publish_on_behalf``) before the session ends; it ends too once that agent left."""
    video: Literal["encoded", "h264", "vp8"] = "encoded"
    """How the avatar's video enters the room: ``encoded``, lipstream's own H.264, each
    frame encoded once (shared idle loops included) and forwarded untouched; ``h264`` or
    ``vp8``, the composed frames handed to LiveKit's own encoder (``vp8`` with its 180p and
    360p simulcast layers). ``docs/design/livekit.md`` has what each costs."""


class TtsSettings(_Section):
    """Text-to-speech for the ``say`` API."""

    engine: Literal["auto", "espeak", "http", "none"] = "auto"
    """The text-to-speech engine: ``auto`` (espeak-ng when installed), ``espeak``,
    ``http`` (an HTTP TTS server) or ``none`` (the say API answers 503)."""
    voice: str = "en"
    """The voice passed to the engine (espeak-ng: a language code)."""
    http_url: str | None = Field(default=None, validate_default=True)
    """The HTTP TTS service's ``http://`` or ``https://`` URL; required when ``engine`` is
    ``http``."""
    http_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds to wait for the HTTP TTS service."""

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
    """The secret that signs session tokens; null: no token needed. When set, ``/offer``
    and the session endpoints need ``Authorization: Bearer <token>`` for the avatar asked
    for (``lipstream token mint --avatar ID`` makes one)."""
    jwt_algorithm: Literal["HS256", "HS384", "HS512"] = "HS256"
    """The signature algorithm, pinned: tokens signed otherwise are refused."""
    leeway_s: float = Field(default=30.0, ge=0, le=600)
    """Clock skew allowed when checking a token's expiry, in seconds."""
    max_ttl_s: float = Field(default=86_400.0, gt=0)
    """The longest lifetime a token may have (``exp`` − ``iat``), in seconds."""


class LoggingSettings(_Section):
    """Log verbosity and line format."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    """The lowest level logged."""
    format: Literal["text", "json"] = "text"
    """One line per event: ``key=value`` text or JSON."""


class ClusterSettings(_Section):
    """Worker processes on Ray behind this process's HTTP front (docs/design/cluster.md §14)."""

    workers: int = Field(default=0, ge=0, le=4096)
    """Worker processes, each a full lipstream stack (its own inference core, sessions and
    event loop); 0: this process serves everything itself and Ray is not needed. Needs
    ``pip install 'lipstream[cluster]'``."""
    ray_address: str | None = None
    """An existing Ray cluster to join (``auto``, ``host:6379``, ``ray://host:10001``);
    null: start a local Ray runtime inside the server."""
    cpus_per_worker: float = Field(default=1.0, gt=0)
    """CPU cores each worker is declared to Ray with."""
    gpus_per_worker: float = Field(default=0.0, ge=0, le=1)
    """The share of one GPU each worker is declared with (1/k for k workers per GPU; Ray
    then sets ``CUDA_VISIBLE_DEVICES`` for the worker)."""
    worker_host: str = "127.0.0.1"
    """Where workers listen for the front's HTTP requests: ``127.0.0.1`` on one machine,
    ``0.0.0.0`` across nodes (a worker then gives the front its node's address)."""
    max_restarts: int = Field(default=-1, ge=-1)
    """Times Ray restarts a dead worker; -1: always."""
    report_interval_s: float = Field(default=1.0, gt=0, le=60)
    """Seconds between two load reports of each worker."""
    report_timeout_s: float = Field(default=1.0, gt=0, le=60)
    """Seconds a report may take; a worker that does not answer in time is skipped by
    placement until it does."""


class Settings(_Section):
    """Everything lipstream can be configured with; build it with ``load_settings``."""

    server: ServerSettings = Field(default_factory=ServerSettings)
    """The HTTP listener, ICE, admission and request limits."""
    turn: TurnSettings = Field(default_factory=TurnSettings)
    """A TURN server whose credentials lipstream mints."""
    devices: DevicesSettings = Field(default_factory=DevicesSettings)
    """The inference devices."""
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    """Loading, placing and evicting models."""
    batching: BatchingSettings = Field(default_factory=BatchingSettings)
    """Cross-session batching."""
    cache: CacheSettings = Field(default_factory=CacheSettings)
    """The caches' memory bounds."""
    avatars: AvatarsSettings = Field(default_factory=AvatarsSettings)
    """Where avatar packages live."""
    audio: AudioSettings = Field(default_factory=AudioSettings)
    """Audio features, voice activity and blending."""
    video: VideoSettings = Field(default_factory=VideoSettings)
    """H.264 encoding and the shared idle loops."""
    session: SessionSettings = Field(default_factory=SessionSettings)
    """Per-session deadlines and limits."""
    broadcast: BroadcastSettings = Field(default_factory=BroadcastSettings)
    """Viewers of a session."""
    outputs: OutputsSettings = Field(default_factory=OutputsSettings)
    """Streams a session pushes out."""
    livekit: LiveKitSettings = Field(default_factory=LiveKitSettings)
    """Avatars in LiveKit rooms."""
    tts: TtsSettings = Field(default_factory=TtsSettings)
    """Text-to-speech."""
    auth: AuthSettings = Field(default_factory=AuthSettings)
    """Session tokens."""
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    """Logs."""
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    """Worker processes on Ray."""
