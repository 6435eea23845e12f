"""Small Markdown writers the generated reference pages share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def cell(text: object) -> str:
    """``text`` made safe for one cell of a Markdown table: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table; an empty ``rows`` gives an empty string."""
    body = ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    if not body:
        return ""
    head = "| " + " | ".join(header) + " |\n|" + "---|" * len(header)
    return head + "\n" + "\n".join(body) + "\n"


def code(text: object) -> str:
    """Inline code, with a fence long enough for backticks inside."""
    value = str(text)
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def anchor(text: str) -> str:
    """A stable heading id from ``text``: lowercase words joined by ``-``."""
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())
