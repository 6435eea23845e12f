#!/usr/bin/env bash
# Install lipstream with its test tools into .venv, then lint, type-check and run every test.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
# the client and its Pipecat and LiveKit extras; Pipecat and livekit-agents pinned like
# the lint tools, so that a new release cannot turn CI red on unchanged code
.venv/bin/python -m pip install --quiet -e 'clients/python[pipecat,livekit]' 'pipecat-ai==1.14.0' \
  'livekit-agents==1.8.9'
echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; .venv/bin/pytest "$@"
