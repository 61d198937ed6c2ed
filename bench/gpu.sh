#!/usr/bin/env bash
# One-command GPU run (docs/benchmarks.md, "One-command GPU run"): python -m bench gpu, from the repo root.
# Uses .venv/bin/python when present. Pass --device cpu --tiny ... to try it without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=python
if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
exec "$PYTHON" -m bench gpu "$@"
