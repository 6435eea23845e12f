"""The outside of lipstream: HTTP (signalling, session control, raw inference, admin,
metrics, demo page) and the ``lipstream`` command line."""

from web.app import build_app, serve
from web.cli import main

__all__ = ["build_app", "main", "serve"]
