#!/usr/bin/env bash
# One-command GPU run (docs/benchmarks.md, "One-command GPU run"): python -m bench gpu, from the repo root.
# `bench/gpu.sh accel ...` runs python -m bench accel instead: stock vs exact accelerations side by side
# (SD 1.5 architecture at 512 px; a DiT at 1024 px with --dit-model). Uses .venv/bin/python when present.
# Pass --device cpu --tiny ... to try either without a GPU (accel: add --no-compile).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=python
if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
if [ "${1:-}" = "accel" ]; then
  shift
  exec "$PYTHON" -m bench accel "$@"
fi
exec "$PYTHON" -m bench gpu "$@"
