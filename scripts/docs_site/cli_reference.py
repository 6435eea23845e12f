"""The command-line page, written from the ``lipstream`` command's argparse parsers.

Each command and sub-command gets its help line and the help argparse prints for it
(``lipstream … --help``), formatted at a fixed width so the page does not depend on the
terminal that built it.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager

# ``web.cli`` re-exports its ``main`` function under the module's own name.
cli = importlib.import_module("web.cli.main")

WIDTH = "90"


def page() -> str:
    parts = [
        "# Command line\n",
        "Generated from the `lipstream` command's own parsers (`web/cli/main.py`); "
        "`lipstream COMMAND --help` prints the same.\n",
    ]
    doc = inspect.getdoc(cli) or ""
    status = [line for line in doc.splitlines() if line.startswith("Exit status")]
    parts.extend(f"{line}\n" for line in status)
    with _columns(WIDTH):
        for name, help_text, parser in _commands(cli._parser(), "lipstream", ""):
            level = "#" * min(2 + name.count(" ") - 1, 4) if " " in name else "##"
            parts.append(f"{level} `{name}`\n")
            if help_text:
                parts.append(f"{help_text[0].upper()}{help_text[1:]}.\n")
            parts.append(f"```text\n{parser.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


def _commands(
    parser: argparse.ArgumentParser, name: str, help_text: str
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    yield name, help_text, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for sub_name, sub in action.choices.items():
                yield from _commands(sub, f"{name} {sub_name}", helps.get(sub_name, ""))


@contextmanager
def _columns(width: str) -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
