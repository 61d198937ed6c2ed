#!/usr/bin/env bash
# One-command GPU run (docs/benchmarks.md, "One-command GPU run"): python -m bench gpu, from the repo root.
# `bench/gpu.sh accel ...` runs python -m bench accel instead: stock, exact accelerations and the approximate ones
# (cached: DeepCache/TaylorSeer every 3rd step; approx: that plus fp8 matmuls, P6_approx_speedup_sd15_b8) side by side
# (SD 1.5 architecture at 512 px; a DiT at 1024 px with --dit-model: a Flux or Qwen-Image one takes the step cache,
# SD3 does not). Uses .venv/bin/python when present. fp8 needs torchao (pip install -e '.[quant]') and a GPU of
# compute capability 8.9+ (H100, H200, L4, ...).
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
