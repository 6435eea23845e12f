"""The outside of lipstream: HTTP (signalling, session control, raw inference, admin,
metrics, demo page) and the ``lipstream`` command line (:mod:`web.cli`).

The top of the import graph: it may import every other package; nothing imports it.
"""

from __future__ import annotations

from web.app import build_app
from web.cli import main
from web.serve import serve

__all__ = ["build_app", "main", "serve"]
