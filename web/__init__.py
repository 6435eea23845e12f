"""The outside of lipstream: HTTP (signalling, session control, raw inference, admin,
metrics, demo page) and the ``lipstream`` command line (:mod:`web.cli`).

The top of the import graph: it may import every other package; nothing imports it.
"""

from __future__ import annotations

from web.app import build_app, serve
from web.cli import main

__all__ = ["build_app", "main", "serve"]
