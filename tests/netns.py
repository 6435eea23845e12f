"""The caller's own network namespace for the tests (``benchmarks/netns.py``), and the
tools it needs: :func:`require_tools` fails the test (never skips) naming the Debian
packages to install."""

from __future__ import annotations

import shutil

import pytest

from benchmarks.netns import Namespace, Shaping, client_namespace

__all__ = ["TOOLS", "Namespace", "Shaping", "client_namespace", "require_tools"]

#: The programs namespace tests need, and the Debian package of each.
TOOLS = {"ip": "iproute2", "iptables": "iptables", "tc": "iproute2", "turnserver": "coturn"}


def require_tools(*names: str) -> dict[str, str]:
    """The path of each of ``names`` (default: all of :data:`TOOLS`); fail (never skip)
    naming the packages missing."""
    wanted = names or tuple(TOOLS)
    found = {name: shutil.which(name) for name in wanted}
    missing = sorted({TOOLS[name] for name, path in found.items() if path is None})
    if missing:
        pytest.fail(
            f"{', '.join(n for n, p in found.items() if p is None)} not found: run "
            f"`apt-get install -y {' '.join(missing)}` (.ci/run installs them)"
        )
    return {name: path for name, path in found.items() if path is not None}
