"""Every setting says what it does: the configuration reference is generated from it."""

from __future__ import annotations

import pydantic

from config.settings import Settings


def _fields(model: type[pydantic.BaseModel], prefix: str) -> list[tuple[str, str | None]]:
    found = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        found.append((key, field.description))
        for nested in _models(field.annotation):
            found.extend(_fields(nested, f"{key}."))
    return found


def _models(annotation: object) -> list[type[pydantic.BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models(arg)]


def test_every_setting_has_a_description() -> None:
    fields = _fields(Settings, "")
    assert len(fields) > 100  # every section, and the entries of ice_servers and models
    assert "server.ice_servers.credential" in dict(fields)
    assert "registry.models.preload" in dict(fields)
    missing = [key for key, description in fields if not (description or "").strip()]
    assert not missing, f"settings without a docstring (config/settings.py): {missing}"


def test_a_field_docstring_becomes_its_description() -> None:
    # pydantic's use_attribute_docstrings: the text under a field, not a Field(...) argument
    server = Settings.model_fields["server"].annotation
    assert isinstance(server, type)
    assert issubclass(server, pydantic.BaseModel)
    assert server.model_fields["port"].description == "The HTTP port."
    schema = Settings.model_json_schema()
    assert schema["$defs"]["ServerSettings"]["properties"]["port"]["description"]
