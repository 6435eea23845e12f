"""Typed, validated settings, built once at start-up and passed down.

``load_settings`` reads a YAML file (``--config`` / ``$LIPSTREAM_CONFIG``) and
``LIPSTREAM_<SECTION>__<KEY>`` environment overrides; any bad value raises
``ConfigError`` naming the key, the value and what is allowed.
"""

from config.loader import (
    ConfigError,
    apply_cli_overrides,
    describe_errors,
    dump_settings,
    load_settings,
)
from config.settings import (
    AudioSettings,
    AvatarsSettings,
    BatchingSettings,
    ByteSize,
    CacheSettings,
    DevicesSettings,
    IceServer,
    LoggingSettings,
    ModelSettings,
    RegistrySettings,
    ServerSettings,
    SessionSettings,
    Settings,
    TtsSettings,
    VideoSettings,
    parse_byte_size,
)

__all__ = [
    "AudioSettings",
    "AvatarsSettings",
    "BatchingSettings",
    "ByteSize",
    "CacheSettings",
    "ConfigError",
    "DevicesSettings",
    "IceServer",
    "LoggingSettings",
    "ModelSettings",
    "RegistrySettings",
    "ServerSettings",
    "SessionSettings",
    "Settings",
    "TtsSettings",
    "VideoSettings",
    "apply_cli_overrides",
    "describe_errors",
    "dump_settings",
    "load_settings",
    "parse_byte_size",
]
