"""Whether Ray can be used here, asked without importing the rest of the cluster code."""

from __future__ import annotations

import importlib.util

INSTALL_HINT = (
    "cluster.workers is set but Ray is not installed: pip install 'lipstream[cluster]' "
    "(or set cluster.workers: 0 to serve from one process)"
)


class ClusterUnavailableError(RuntimeError):
    """A cluster was configured but cannot be started or reached (Ray missing, no cluster
    there); the message says what to check."""


def ray_missing() -> str | None:
    """What to do when Ray is not installed, or None when it is."""
    try:
        found = importlib.util.find_spec("ray") is not None
    except ValueError:  # a module set to None in sys.modules: blocked, as good as missing
        found = False
    return None if found else INSTALL_HINT
