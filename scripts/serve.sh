#!/usr/bin/env bash
# Install lipstream into .venv and run it on the built-in demo avatar.
# Until the WebRTC server lands this renders the bundled sample to demo.mp4.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
exec .venv/bin/lipstream render --avatar demo --out demo.mp4 "$@"
