"""Build ``Settings`` from a YAML file, environment overrides and CLI flags.

Precedence, lowest first: built-in defaults, the YAML file, ``LIPSTREAM_*`` environment
variables, ``--host``/``--port`` flags. Everything is validated at once and every
problem is reported together, so one start-up attempt shows all there is to fix.

Errors::

    ConfigError      root of the config package: the file or an override is unusable;
                     ``problems`` holds one line per problem,
                     ``key.path: got VALUE — what is allowed``
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from config.settings import SECRET_KEYS, Settings, default_data_dir

ENV_PREFIX = "LIPSTREAM_"
CONFIG_ENV = "LIPSTREAM_CONFIG"
_MASK = "'***'"
_MAX_SHOWN = 80

Loc = tuple[str | int, ...]


class ConfigError(Exception):
    """The configuration cannot be used; the message lists every problem, one a line."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        self.problems: list[str] = list(problems)
        lines = [message, *(f"  {problem}" for problem in self.problems)]
        super().__init__("\n".join(lines))


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: YAML keeps the last one silently, so a
    second ``server:`` block would quietly discard the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key!r}",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Load, merge and validate the settings; raise ``ConfigError`` listing every problem.

    The file is ``path``, else ``$LIPSTREAM_CONFIG``, else none (all defaults). Each
    ``LIPSTREAM_<SECTION>__<KEY>[__<KEY>...]=value`` variable overrides one key; its
    value is read as YAML (``9000``, ``true``, ``null``, ``[a, b]``), and a setting that
    is a string keeps the text as written (``LIPSTREAM_TTS__VOICE=no`` stays ``"no"``).
    ``environ`` defaults to ``os.environ``.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    if path is None and env.get(CONFIG_ENV):
        path = Path(env[CONFIG_ENV])
    data: dict[Any, Any] = _read_file(path) if path is not None else {}

    problems, sources = _apply_env(data, env)
    _default_data_dir(data, env)
    settings: Settings | None = None
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        problems.extend(describe_errors(exc, sources))
    if problems or settings is None:
        where = f"config file {path}" if path is not None else "built-in defaults"
        raise ConfigError(f"invalid configuration ({where} + {ENV_PREFIX}* environment):", problems)
    return settings


def apply_cli_overrides(
    settings: Settings,
    host: str | None = None,
    port: int | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
) -> Settings:
    """Return ``settings`` with the CLI's ``serve`` options applied and re-validated."""
    server: dict[str, Any] = {}
    if host is not None:
        server["host"] = host
    if port is not None:
        server["port"] = port
    cluster: dict[str, Any] = {}
    if workers is not None:
        cluster["workers"] = workers
    if ray_address is not None:
        cluster["ray_address"] = ray_address
    if not server and not cluster:
        return settings
    data = settings.model_dump()
    data["server"].update(server)
    data["cluster"].update(cluster)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        sources: dict[Loc, str] = {
            ("server", "host"): "--host",
            ("server", "port"): "--port",
            ("cluster", "workers"): "--workers",
            ("cluster", "ray_address"): "--ray-address",
        }
        raise ConfigError("invalid command-line option:", describe_errors(exc, sources)) from None


def dump_settings(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain JSON-able data with secrets masked, for logging."""
    return settings.model_dump(mode="json")


def describe_errors(exc: ValidationError, sources: Mapping[Loc, str] | None = None) -> list[str]:
    """One ``key.path: got VALUE — what is allowed`` line per pydantic error.

    ``sources`` maps a key path to where its value came from (an environment variable,
    a CLI flag), which is added after the key. Secret values are never shown.
    """
    lines = []
    for error in exc.errors(include_url=False):
        loc = tuple(part for part in error["loc"] if part != "[key]")
        key = _dotted(loc)
        source = _source_of(loc, sources or {})
        if source:
            key = f"{key} (from {source})"
        lines.append(f"{key}: got {_show(loc, error['input'])} — {_allowed(loc, error)}")
    return lines


def _read_file(path: Path) -> dict[Any, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        full = "" if path.is_absolute() else f" (looked at {path.absolute()})"
        raise ConfigError(f"config file {path} not found{full}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(f"config file {where}: invalid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path}: the top level must be a mapping of sections "
            f"({', '.join(Settings.model_fields)}), got {type(data).__name__}"
        )
    return data


def _apply_env(data: dict[Any, Any], env: Mapping[str, str]) -> tuple[list[str], dict[Loc, str]]:
    """Merge ``LIPSTREAM_*`` overrides into ``data``; return problems and value sources."""
    problems: list[str] = []
    sources: dict[Loc, str] = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV:
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        if len(parts) < 2 or not all(parts):
            problems.append(
                f"{name}: not a settings override; use {ENV_PREFIX}<SECTION>__<KEY>=value, "
                f"e.g. {ENV_PREFIX}SERVER__PORT=9000"
            )
            continue
        leaf, why = _locate(tuple(parts))
        if why is not None:
            problems.append(f"{name}: {why}")
            continue
        cursor = data
        for part in parts[:-1]:
            child = cursor.get(part)
            if not isinstance(child, dict):
                child = cursor[part] = {}
            cursor = child
        cursor[parts[-1]] = _parse_env_value(env[name], leaf)
        sources[tuple(parts)] = name
    return problems, sources


def _parse_env_value(raw: str, leaf: Any) -> Any:
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if _takes_text(leaf) and value is not None and not isinstance(value, str):
        return raw
    return value


def _default_data_dir(data: dict[Any, Any], env: Mapping[str, str]) -> None:
    # The model's own default reads os.environ; a caller-supplied environ must win.
    avatars = data.get("avatars")
    if avatars is None:
        data["avatars"] = avatars = {}
    if isinstance(avatars, dict) and "data_dir" not in avatars:
        avatars["data_dir"] = default_data_dir(env)


def _unwrap(tp: Any) -> Any:
    """``Annotated[X, ...]`` → X and ``X | None`` → X; anything else unchanged."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [arg for arg in typing.get_args(tp) if arg is not type(None)]
            if len(rest) != 1:
                return tp
            tp = rest[0]
        else:
            return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _takes_text(tp: Any) -> bool:
    tp = _unwrap(tp)
    if typing.get_origin(tp) is Literal:
        return all(isinstance(arg, str) for arg in typing.get_args(tp))
    return tp in (str, Path, SecretStr)


def _locate(parts: Loc) -> tuple[Any, str | None]:
    """The type at key path ``parts``, or ``(None, why)`` when it names no setting."""
    current: Any = Settings
    for depth, part in enumerate(parts):
        current = _unwrap(current)
        origin = typing.get_origin(current)
        if _is_model(current):
            fields: dict[str, FieldInfo] = current.model_fields
            if not isinstance(part, str) or part not in fields:
                return None, f"{_dotted(parts[: depth + 1])} — " + _unknown_key(
                    parts[: depth + 1], fields
                )
            current = fields[part].annotation
        elif origin is dict:
            current = typing.get_args(current)[1]
        elif origin is list and isinstance(part, int):
            current = typing.get_args(current)[0]
        else:
            return None, f"{_dotted(parts[:depth])} is a single value, it has no key {part!r}"
    return current, None


def _unknown_key(loc: Loc, fields: Mapping[str, FieldInfo]) -> str:
    parent = _dotted(loc[:-1]) or "the top level"
    hint = ""
    if isinstance(loc[-1], str):
        close = difflib.get_close_matches(loc[-1], list(fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key{hint}; allowed keys in {parent}: {', '.join(fields)}"


def _field_at(loc: Loc) -> FieldInfo | None:
    if not loc or not isinstance(loc[-1], str):
        return None
    parent, _ = _locate(loc[:-1])
    parent = _unwrap(parent)
    if _is_model(parent):
        field: FieldInfo | None = parent.model_fields.get(loc[-1])
        return field
    return None


def _allowed(loc: Loc, error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = _unwrap(_locate(loc[:-1])[0])
        return _unknown_key(loc, parent.model_fields) if _is_model(parent) else "unknown key"
    if kind == "literal_error" and "expected" in ctx:
        return f"allowed: {ctx['expected']}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        field = _field_at(loc)
        if field is not None:
            return _bounds(field)
    if kind == "string_type":
        return "expected text (put the value in quotes in YAML)"
    msg = error["msg"]
    return msg.removeprefix("Value error, ")


def _bounds(field: FieldInfo) -> str:
    limits: dict[str, Any] = {}
    for item in field.metadata:
        for name in ("ge", "gt", "le", "lt"):
            if getattr(item, name, None) is not None:
                limits[name] = getattr(item, name)
    words = []
    if "ge" in limits and "le" in limits:
        words.append(f"from {limits['ge']} to {limits['le']}")
    else:
        for name, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if name in limits:
                words.append(f"{sign} {limits[name]}")
    nullable = type(None) in typing.get_args(field.annotation)
    return "allowed: a number " + " and ".join(words) + (" or null" if nullable else "")


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _source_of(loc: Loc, sources: Mapping[Loc, str]) -> str | None:
    for end in range(len(loc), 0, -1):
        if loc[:end] in sources:
            return sources[loc[:end]]
    return None


def _mask(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: ("***" if k in SECRET_KEYS else _mask(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(item) for item in value]
    return value


def _show(loc: Loc, value: Any) -> str:
    if value is not None and any(part in SECRET_KEYS for part in loc):
        return _MASK
    text = "null" if value is None else repr(_mask(value))
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
