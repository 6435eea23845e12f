"""The configuration page, written from the settings' own field docs.

Every field of ``config.settings.Settings`` carries its docstring as its description
(pydantic's ``use_attribute_docstrings``; ``tests/test_settings_docs.py`` checks that
none is missing): each section becomes a table of key, type, default and description.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
from md_writer import code, table
from pydantic import BaseModel, BeforeValidator, SecretStr
from pydantic.fields import FieldInfo

from config.settings import Settings, parse_byte_size

_HOME = str(Path.home())


def page() -> str:
    parts = [
        "# Configuration\n",
        "Generated from the settings' own field docs (`config/settings.py`). Every key is "
        "optional: an empty file, or none, serves the built-in demo avatar on "
        "`http://127.0.0.1:8080`.\n",
        "- **The file**: one YAML file, `lipstream serve --config FILE` or "
        "`LIPSTREAM_CONFIG=FILE`. `config/lipstream.example.yaml` holds every key at its "
        "default.",
        "- **Environment variables** override the file: `LIPSTREAM_<SECTION>__<KEY>`, e.g. "
        "`LIPSTREAM_SERVER__PORT=9000`; per model, "
        "`LIPSTREAM_REGISTRY__MODELS__<ID>__<KEY>`. Values are read as YAML "
        "(`9000`, `true`, `null`, `[a, b]`).",
        "- **Checked at start-up**: an unknown key or a bad value stops the server with a "
        "message naming the key, the value and what is allowed; `lipstream config check` "
        "prints the effective settings, secrets masked.",
        "- **Byte sizes** take a number of bytes (`65536`) or a number with a unit: B, KB, "
        'MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. `"512MiB"`.\n',
    ]
    for section, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type)
        assert issubclass(model, BaseModel)
        parts.append(f"## `{section}`\n\n{inspect.getdoc(model)}\n")
        parts.append(_fields(section, model))
        for name, sub in model.model_fields.items():
            nested = _nested_model(sub.annotation)
            if nested is not None:
                parts.append(f"### `{section}.{name}` entries\n\n{inspect.getdoc(nested)}\n")
                parts.append(_fields(None, nested))
    return "\n".join(parts)


def _fields(section: str | None, model: type[BaseModel]) -> str:
    rows = []
    for name, field in model.model_fields.items():
        key = code(name)
        if section is not None:
            key += f"<br>`LIPSTREAM_{section.upper()}__{name.upper()}`"
        rows.append((key, _type(field), _default(field), field.description or ""))
    return table(("key", "type", "default", "description"), rows)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def _type(field: FieldInfo) -> str:
    text = _annotation(field.annotation)
    if any(isinstance(m, BeforeValidator) and m.func is parse_byte_size for m in field.metadata):
        text = text.replace("integer", "byte size")
    limits = []
    for meta in field.metadata:
        for attribute, form in (("ge", "≥ {}"), ("gt", "> {}"), ("le", "≤ {}"), ("lt", "< {}")):
            if isinstance(meta, getattr(annotated_types, attribute.capitalize())):
                limits.append(form.format(getattr(meta, attribute)))
        if isinstance(meta, annotated_types.MinLen):
            limits.append("not empty" if meta.min_length == 1 else f"at least {meta.min_length}")
    return f"{text} ({', '.join(limits)})" if limits else text


def _annotation(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _annotation(args[0])
    if origin is Literal:
        return "one of " + ", ".join(code(value) for value in args)
    if origin in (types.UnionType, typing.Union):
        return " or ".join("null" if a is type(None) else _annotation(a) for a in args)
    if origin in (list, tuple):
        return "list of " + _annotation(args[0])
    if origin is dict:
        return f"map of {_annotation(args[0])} to {_annotation(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "entries below"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    if annotation in names:
        return names[annotation]
    if annotation is SecretStr:
        return "secret string"
    return getattr(annotation, "__name__", str(annotation)).replace("IPvAny", "IP ").lower()


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, Path):
        text = str(value)
        return code(("~" + text[len(_HOME) :]) if text.startswith(_HOME) else text)
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, SecretStr):
        return "set"
    if isinstance(value, tuple):
        value = list(value)
    return code(json.dumps(value))
