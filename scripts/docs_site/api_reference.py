"""The HTTP API page, written from the server's OpenAPI document.

``web.openapi.openapi_document()`` is what ``GET /openapi.json`` serves: its operations
by tag, then its component schemas, each field with its type and description.
"""

from __future__ import annotations

import json
from typing import Any

from md_writer import anchor, cell, code, table

from web.openapi import openapi_document

Json = dict[str, Any]

_METHODS = ("get", "post", "put", "patch", "delete")
_ACCESS = {"sessionToken": "[session token](#access)", "adminToken": "[admin](#access)"}


def page() -> str:
    document = openapi_document()
    info = document["info"]
    components = document["components"]
    parts = [
        "# HTTP API\n",
        "Generated from the server's OpenAPI "
        f"{document['openapi']} document, the one `GET /openapi.json` serves "
        "(`web/openapi.py`, from the request and response models in `web/schemas/`).\n",
        f"{info['description']}\n",
        _access(components["securitySchemes"]),
    ]
    by_tag: dict[str, list[tuple[str, str, Json, Json]]] = {}
    for path, item in document["paths"].items():
        for method in _METHODS:
            if method in item:
                operation = item[method]
                by_tag.setdefault(operation["tags"][0], []).append((method, path, operation, item))
    for tag in document["tags"]:
        operations = by_tag.get(tag["name"], [])
        if not operations:
            continue
        parts.append(f"## {tag['name'].capitalize()}\n\n{tag['description']}\n")
        parts.extend(_operation(*entry, components) for entry in operations)
    parts.append("## Schemas\n\nThe JSON bodies the operations above take and answer.\n")
    for name, schema in components["schemas"].items():
        parts.append(_schema(name, schema))
    return "\n".join(parts)


def _access(schemes: Json) -> str:
    lines = ["## Access { #access }\n"]
    for name, scheme in schemes.items():
        label = "Session token" if name == "sessionToken" else "Admin"
        lines.append(f"**{label}** (`{scheme['scheme']}`): {scheme['description']}\n")
    lines.append("Operations that list neither are open.\n")
    return "\n".join(lines)


def _deref(value: Json, components: Json) -> Json:
    ref = value.get("$ref")
    if ref is None:
        return value
    _, _, kind, name = ref.split("/")
    return {**components[kind][name], **{k: v for k, v in value.items() if k != "$ref"}}


def type_of(schema: Json) -> str:
    """A JSON schema as a short phrase: ``integer (1–32)``, ``array of [Link](#…)``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#schema-{anchor(name)})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(type_of(option) for option in schema[key])
    if "const" in schema:
        return code(json.dumps(schema["const"]))
    if "enum" in schema:
        return "one of " + ", ".join(code(json.dumps(value)) for value in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        if "prefixItems" in schema:
            return "[" + ", ".join(type_of(item) for item in schema["prefixItems"]) + "]"
        return "array of " + type_of(schema.get("items", {}))
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return "object of " + type_of(schema["additionalProperties"])
    if isinstance(kind, list):
        text = " or ".join(kind)
    else:
        text = kind or "any"
    limits = _limits(schema)
    return f"{text} ({limits})" if limits else text


def _limits(schema: Json) -> str:
    words = {
        "minimum": "≥ {}",
        "exclusiveMinimum": "> {}",
        "maximum": "≤ {}",
        "exclusiveMaximum": "< {}",
        "minLength": "at least {} characters",
        "maxLength": "at most {} characters",
        "minItems": "at least {} items",
        "maxItems": "at most {} items",
        "format": "{}",
    }
    found = [form.format(schema[key]) for key, form in words.items() if key in schema]
    if "pattern" in schema:
        found.append(code(schema["pattern"]))
    return ", ".join(found)


def _operation(method: str, path: str, operation: Json, item: Json, components: Json) -> str:
    lines = [f"### `{method.upper()} {path}` {{ #{operation['operationId']} }}\n"]
    lines.append(f"**{operation['summary']}.**")
    if operation.get("description"):
        lines.append(f"{operation['description']}\n")
    else:
        lines.append("")
    security = operation.get("security")
    if security:
        names = [_ACCESS[name] for requirement in security for name in requirement]
        optional = any(not requirement for requirement in security)
        lines.append(
            f"Access: {', '.join(names)}{' when one is configured' if optional else ''}.\n"
        )
    parameters = [
        _deref(p, components)
        for p in [*item.get("parameters", []), *operation.get("parameters", [])]
    ]
    if parameters:
        rows = [
            (
                code(p["name"]),
                p["in"],
                type_of(p.get("schema", {})),
                "yes" if p.get("required") else "no",
                p.get("description", ""),
            )
            for p in parameters
        ]
        lines.append(table(("parameter", "in", "type", "required", "description"), rows))
    body = operation.get("requestBody")
    if body:
        lines.append(
            "Request body" + (f": {body['description']}" if "description" in body else "") + "\n"
        )
        lines.append(table(("content type", "schema"), _contents(body.get("content", {}))))
    rows = []
    for status, response in operation["responses"].items():
        response = _deref(response, components)
        text = response.get("description", "")
        for name, header in response.get("headers", {}).items():
            text += f" Header {code(name)}: {header.get('description', '')}"
        bodies = "; ".join(
            f"{kind}: {schema}" if schema else kind
            for kind, schema in _contents(response.get("content", {}))
        )
        rows.append((status, text, bodies))
    lines.append(table(("status", "meaning", "body"), rows))
    return "\n".join(lines)


def _contents(content: Json) -> list[tuple[str, str]]:
    return [
        (code(kind), type_of(media["schema"]) if "schema" in media else "")
        for kind, media in content.items()
    ]


def _schema(name: str, schema: Json) -> str:
    lines = [f"### {name} {{ #schema-{anchor(name)} }}\n"]
    if schema.get("description"):
        lines.append(f"{schema['description']}\n")
    properties = schema.get("properties")
    if not properties:
        lines.append(f"Type: {type_of(schema)}.\n")
        return "\n".join(lines)
    required = set(schema.get("required", ()))
    rows = []
    for field, spec in properties.items():
        text = spec.get("description", "")
        if "default" in spec:
            text = f"{text} Default {code(json.dumps(spec['default']))}.".strip()
        rows.append((code(field), type_of(spec), "yes" if field in required else "no", cell(text)))
    lines.append(table(("field", "type", "required", "description"), rows))
    return "\n".join(lines)
