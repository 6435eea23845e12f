"""Settings loading: defaults, the example file, env overrides and error messages."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from config.loader import ConfigError, apply_cli_overrides, dump_settings, load_settings
from config.settings import GIB, MIB, Settings, parse_byte_size

EXAMPLE = Path(__file__).resolve().parent.parent / "config" / "lipstream.example.yaml"
HOME_ENV = {"HOME": "/home/tester"}


def write(tmp_path: Path, text: str, name: str = "lipstream.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_yaml(tmp_path: Path, text: str, **env: str) -> Settings:
    return load_settings(write(tmp_path, text), {**HOME_ENV, **env})


def config_error(tmp_path: Path, text: str, **env: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_yaml(tmp_path, text, **env)
    return str(caught.value)


def without_data_dir(settings: Settings) -> dict[str, Any]:
    dumped = dump_settings(settings)
    del dumped["avatars"]["data_dir"]
    return dumped


# --- defaults and the example file -------------------------------------------------


def test_no_file_gives_defaults() -> None:
    settings = load_settings(None, HOME_ENV)
    assert settings.server.host == "127.0.0.1"
    assert settings.server.port == 8080
    assert settings.server.ice_servers == []
    assert settings.server.admin_token is None
    assert settings.devices.kind == "auto"
    assert settings.devices.count is None
    assert settings.registry.eviction_policy == "lru"
    assert settings.registry.assignment == "least-loaded"
    assert settings.registry.models == {}
    assert settings.batching.max_batch_size is None  # per device kind:
    assert (settings.batching.size_for("cuda"), settings.batching.size_for("cpu")) == (8, 2)
    assert settings.cache.background_cache_bytes == 256 * MIB
    assert settings.session.max_audio_push_bytes == 16 * MIB
    assert settings.audio.right_context == 7
    assert settings.avatars.demo is True
    assert settings.avatars.root == Path("avatars")
    assert settings.avatars.data_dir == Path("/home/tester/.local/share/lipstream")
    assert without_data_dir(settings) == without_data_dir(Settings())


def test_data_dir_follows_absolute_xdg_data_home() -> None:
    settings = load_settings(None, {**HOME_ENV, "XDG_DATA_HOME": "/srv/data"})
    assert settings.avatars.data_dir == Path("/srv/data/lipstream")
    relative = load_settings(None, {**HOME_ENV, "XDG_DATA_HOME": "rel"})
    assert relative.avatars.data_dir == Path("/home/tester/.local/share/lipstream")


def test_empty_file_and_null_sections_give_defaults(tmp_path: Path) -> None:
    assert load_yaml(tmp_path, "") == load_settings(None, HOME_ENV)
    nulls = load_yaml(tmp_path, "server:\nregistry:\n  models:\n")
    assert nulls == load_settings(None, HOME_ENV)


def test_example_yaml_loads_to_defaults() -> None:
    settings = load_settings(EXAMPLE, HOME_ENV)
    assert settings == load_settings(None, HOME_ENV)


def test_example_yaml_documents_every_option() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    assert set(raw) == set(Settings.model_fields)
    for section, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type)
        assert issubclass(model, pydantic.BaseModel)
        written = set(raw[section])
        commented = {key for key in model.model_fields if f"# {key}:" in text}
        assert written | commented == set(model.model_fields), section
    # every written option has a comment line right above it (or above its examples)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^  [a-z_]+:", line):
            assert lines[i - 1].lstrip().startswith("#"), line


def test_config_path_from_lipstream_config(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  port: 9001\n")
    settings = load_settings(None, {**HOME_ENV, "LIPSTREAM_CONFIG": str(path)})
    assert settings.server.port == 9001


# --- environment overrides -----------------------------------------------------------


def test_env_overrides_beat_the_file(tmp_path: Path) -> None:
    text = (
        "server:\n  port: 9000\n  host: 0.0.0.0\n"
        "batching:\n  max_batch_size: 16\n"
        "registry:\n  models:\n    demo:\n      preferred_device: 1\n"
    )
    settings = load_yaml(
        tmp_path,
        text,
        LIPSTREAM_SERVER__PORT="9100",
        LIPSTREAM_BATCHING__MAX_BATCH_SIZE="4",
        LIPSTREAM_REGISTRY__MODELS__DEMO__PRELOAD="true",
        LIPSTREAM_REGISTRY__MODELS__ALICE__PREFERRED_DEVICE="2",
    )
    assert settings.server.port == 9100
    assert settings.server.host == "0.0.0.0"  # untouched file value survives
    assert settings.batching.max_batch_size == 4
    assert settings.registry.models["demo"].preferred_device == 1
    assert settings.registry.models["demo"].preload is True
    assert settings.registry.models["alice"].preferred_device == 2
    assert settings.registry.models["alice"].preload is False


def test_env_values_are_yaml_but_text_settings_keep_text() -> None:
    settings = load_settings(
        None,
        {
            **HOME_ENV,
            "LIPSTREAM_TTS__VOICE": "no",
            "LIPSTREAM_SERVER__ADMIN_TOKEN": "12345",
            "LIPSTREAM_SERVER__CORS_ORIGINS": "[https://a.example, https://b.example]",
            "LIPSTREAM_DEVICES__COUNT": "null",
            "LIPSTREAM_DEVICES__MAX_MEMORY_PER_DEVICE": "8GiB",
            "LIPSTREAM_AVATARS__DEMO": "false",
        },
    )
    assert settings.tts.voice == "no"
    assert settings.server.admin_token is not None
    assert settings.server.admin_token.get_secret_value() == "12345"
    assert settings.server.cors_origins == ["https://a.example", "https://b.example"]
    assert settings.devices.count is None
    assert settings.devices.max_memory_per_device == 8 * GIB
    assert settings.avatars.demo is False


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("LIPSTREAM_SERVER__PROT", "did you mean 'port'"),
        ("LIPSTREAM_SERVR__PORT", "allowed keys in the top level: server"),
        ("LIPSTREAM_PORT", "LIPSTREAM_<SECTION>__<KEY>"),
        ("LIPSTREAM_SERVER__PORT__VALUE", "server.port is a single value"),
        ("LIPSTREAM_REGISTRY__MODELS__DEMO__PRELAOD", "did you mean 'preload'"),
    ],
)
def test_unknown_env_override_is_named(name: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {**HOME_ENV, name: "1"})
    assert name in str(caught.value)
    assert expected in str(caught.value)


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {**HOME_ENV, "LIPSTREAM_SERVER__PORT": "70000"})
    message = str(caught.value)
    assert "server.port (from LIPSTREAM_SERVER__PORT): got 70000" in message
    assert "from 1 to 65535" in message


def test_lipstream_config_is_not_an_override(tmp_path: Path) -> None:
    env = {**HOME_ENV, "LIPSTREAM_CONFIG": ""}
    assert load_settings(None, env) == load_settings(None, HOME_ENV)


# --- byte sizes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (65536, 65536),
        ("123", 123),
        ("64KiB", 64 * 1024),
        ("512MiB", 512 * MIB),
        ("8GiB", 8 * GIB),
        ("1.5GB", 1_500_000_000),
        ("10 MB", 10_000_000),
        ("2kb", 2000),
        ("1.5KiB", 1536),
        ("7B", 7),
    ],
)
def test_byte_sizes_parse(tmp_path: Path, raw: object, expected: int) -> None:
    assert parse_byte_size(raw) == expected
    settings = load_yaml(tmp_path, f"devices:\n  max_memory_per_device: {raw}\n")
    assert settings.devices.max_memory_per_device == expected


@pytest.mark.parametrize("raw", ["8 gigs", "-1", "-5", "1.5B", "true", "MiB", "[1]", "0.1KiB"])
def test_bad_byte_size_names_key_and_forms(tmp_path: Path, raw: str) -> None:
    message = config_error(tmp_path, f"cache:\n  background_cache_bytes: {raw}\n")
    assert "cache.background_cache_bytes: got " in message
    assert "KiB, MiB, GiB" in message
    assert '"1.5GB"' in message


# --- bad values and unknown keys ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "value", "allowed"),
    [
        ("server:\n  port: 70000\n", "server.port", "70000", "from 1 to 65535"),
        ("registry:\n  eviction_policy: fifo\n", "registry.eviction_policy", "'fifo'",
         "'lru' or 'lfu'"),
        ("batching:\n  max_batch_size: 0\n", "batching.max_batch_size", "0", "from 1 to 64"),
        ("video:\n  preset: superslow\n", "video.preset", "'superslow'", "'veryfast'"),
        ("devices:\n  count: 0\n", "devices.count", "0", "≥ 1 or null"),
        ("audio:\n  right_context: 8\n", "audio.right_context", "8", "from 0 to 7"),
        ("session:\n  ice_timeout_s: 0\n", "session.ice_timeout_s", "0", "> 0"),
        ("devices:\n  kind: tpu\n", "devices.kind", "'tpu'", "'auto', 'cpu' or 'cuda'"),
    ],
)  # fmt: skip
def test_bad_value_names_key_value_and_allowed(
    tmp_path: Path, text: str, key: str, value: str, allowed: str
) -> None:
    message = config_error(tmp_path, text)
    line = next(line for line in message.splitlines() if line.strip().startswith(key))
    assert f"{key}: got {value} — " in line
    assert allowed in line


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    message = config_error(
        tmp_path, "server:\n  port: 0\nbatching:\n  max_batch_size: 65\n", LIPSTREAM_SERVER__X="1"
    )
    assert "server.port: got 0" in message
    assert "batching.max_batch_size: got 65" in message
    assert "LIPSTREAM_SERVER__X" in message


def test_unknown_key_is_named(tmp_path: Path) -> None:
    message = config_error(tmp_path, "server:\n  prot: 9000\nvidoe:\n  preset: fast\n")
    assert "server.prot: got 9000 — unknown key (did you mean 'port'?)" in message
    assert "vidoe: got {'preset': 'fast'} — unknown key (did you mean 'video'?)" in message


@pytest.mark.parametrize("model_id", ["Demo", "../escape", "a" * 65, "has space", ""])
def test_bad_model_id_is_named(tmp_path: Path, model_id: str) -> None:
    message = config_error(
        tmp_path, f"registry:\n  models:\n    '{model_id}':\n      preload: true\n"
    )
    assert f"registry.models.{model_id}: got {model_id!r}" in message
    assert "^[a-z0-9_-]{1,64}$" in message


def test_tts_http_needs_url(tmp_path: Path) -> None:
    message = config_error(tmp_path, "tts:\n  engine: http\n")
    assert 'tts.http_url: got null — required when tts.engine is "http"' in message
    settings = load_yaml(tmp_path, "tts:\n  engine: http\n  http_url: http://tts:5002/api\n")
    assert settings.tts.http_url == "http://tts:5002/api"
    assert "tts.http_url: got 'ftp://x'" in config_error(tmp_path, "tts:\n  http_url: ftp://x\n")


def test_ice_servers(tmp_path: Path) -> None:
    settings = load_yaml(
        tmp_path,
        "server:\n  ice_servers:\n    - urls: stun:stun.example.org:3478\n"
        "    - urls: [turn:turn.example.org, turns:turn.example.org]\n"
        "      username: u\n      credential: c\n",
    )
    first, second = settings.server.ice_servers
    assert first.urls == ["stun:stun.example.org:3478"]
    assert second.credential is not None
    assert second.credential.get_secret_value() == "c"
    message = config_error(tmp_path, "server:\n  ice_servers:\n    - urls: [http://x]\n")
    assert "server.ice_servers[0].urls[0]: got 'http://x'" in message
    assert "stun:, turn: or turns:" in message


def test_settings_are_frozen() -> None:
    settings = load_settings(None, HOME_ENV)
    with pytest.raises(pydantic.ValidationError):
        settings.server.port = 1


# --- files -------------------------------------------------------------------------


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  port: 8080\n  host: [unclosed\nvideo: {}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, HOME_ENV)
    message = str(caught.value)
    assert str(path) in message
    assert re.search(rf"{re.escape(str(path))}:4:\d+: invalid YAML", message), message


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    message = config_error(tmp_path, "server:\n  port: 1\nserver:\n  port: 2\n")
    assert "lipstream.yaml:3:1" in message
    assert "duplicate key 'server'" in message


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"config file {missing} not found")):
        load_settings(missing, HOME_ENV)
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_settings(None, {**HOME_ENV, "LIPSTREAM_CONFIG": str(missing)})


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"config file {tmp_path} cannot be read")):
        load_settings(tmp_path, HOME_ENV)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "- server\n- port\n")
    with pytest.raises(ConfigError, match=re.escape(f"config file {path}: the top level")):
        load_settings(path, HOME_ENV)


# --- secrets, dumping, CLI ---------------------------------------------------------


def test_secrets_never_shown(tmp_path: Path) -> None:
    token, credential = "s3cret-admin-token", "turn-pass-xyz"
    text = (
        f"server:\n  admin_token: {token}\n"
        f"  ice_servers:\n    - urls: [turn:t.example]\n      credential: {credential}\n"
    )
    settings = load_yaml(tmp_path, text)
    assert settings.server.admin_token is not None
    assert settings.server.admin_token.get_secret_value() == token
    for shown in (str(settings), repr(settings), str(dump_settings(settings))):
        assert token not in shown
        assert credential not in shown
    # an error elsewhere in the section shows the section's input without secrets
    bad = config_error(
        tmp_path,
        f"server:\n  admin_token: [{token}]\n  ice_servers:\n    - {{credential: {credential}}}\n",
    )
    assert "server.admin_token: got '***'" in bad
    assert "server.ice_servers[0].urls" in bad
    assert token not in bad
    assert credential not in bad


def test_dump_settings_is_plain_data() -> None:
    dumped = dump_settings(load_settings(None, HOME_ENV))
    assert dumped["server"]["port"] == 8080
    assert dumped["avatars"]["root"] == "avatars"
    yaml.safe_dump(dumped)  # only plain types


def test_apply_cli_overrides() -> None:
    settings = load_settings(None, HOME_ENV)
    assert apply_cli_overrides(settings) is settings
    changed = apply_cli_overrides(settings, host="0.0.0.0", port=9000)
    assert (changed.server.host, changed.server.port) == ("0.0.0.0", 9000)
    assert changed.batching == settings.batching
    with pytest.raises(ConfigError, match=r"server\.port \(from --port\): got 0"):
        apply_cli_overrides(settings, port=0)
