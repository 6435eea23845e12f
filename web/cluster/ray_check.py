"""Whether Ray can be used here, asked without importing the rest of the cluster code."""

from __future__ import annotations

import importlib.util

INSTALL_HINT = (
    "cluster.workers is set but Ray is not installed: pip install 'lipstream[cluster]' "
    "(or set cluster.workers: 0 to serve from one process)"
)


def ray_missing() -> str | None:
    """What to do when Ray is not installed, or None when it is."""
    return None if importlib.util.find_spec("ray") is not None else INSTALL_HINT
