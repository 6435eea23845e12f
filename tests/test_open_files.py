"""The server raises its open-file soft limit to the hard limit at start-up."""

from __future__ import annotations

import subprocess
import sys


def test_the_soft_limit_is_raised_to_the_hard_limit() -> None:
    # In a child process, so this test process keeps its own limits.
    code = (
        "import resource\n"
        "from web.open_files import raise_open_file_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "assert raise_open_file_limit() == (hard, hard)\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)\n"
        "print('ok', hard)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")
