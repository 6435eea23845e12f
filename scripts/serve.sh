#!/usr/bin/env bash
# Install lipstream into .venv and start the server on the built-in demo avatar:
# open http://127.0.0.1:8080/ in a browser. Extra arguments go to `lipstream serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
exec .venv/bin/lipstream serve "$@"
