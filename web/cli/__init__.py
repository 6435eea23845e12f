"""The ``lipstream`` command line: serve, render, avatar, model, token and config commands."""

from __future__ import annotations

from web.cli.main import main

__all__ = ["main"]
