#!/usr/bin/env bash
# One-command GPU run (docs/benchmarks.md, "One-command GPU run"): python -m bench gpu, from the repo root.
# `bench/gpu.sh accel ...` runs python -m bench accel instead: stock, exact accelerations and the approximate ones
# (cached: DeepCache/TaylorSeer every 3rd step; quantized: fp8 matmuls; approx: both, P6_approx_speedup_sd15_b8)
# side by side (SD 1.5 architecture at 512 px; a DiT at 1024 px: SD3 Medium's architecture unless --dit-model
# names a folder). fp8 needs torchao (pip install -e '.[quant]') and a GPU of compute capability 8.9+ (H100, H200,
# L4, ...).
# `bench/gpu.sh all ...` is the prepared GPU session (docs/benchmarks.md, "Prepared GPU session"): python -m
# bench.gpu_all, every per-GPU speed figure in one command of about 8 minutes; with a folder .whl of wheels
# (python bench/gpu_wheels.py download .whl, where an index is reachable) it first installs those this Python
# lacks into /tmp/fusefleet-site.
# Pass --device cpu --tiny ... to try any of them without a GPU (accel and all: add --no-compile).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=python
if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; elif ! command -v python >/dev/null; then PYTHON=python3; fi
case "${1:-}" in
  accel)
    shift
    exec "$PYTHON" -m bench accel "$@"
    ;;
  all)
    shift
    if [ -d .whl ]; then
      "$PYTHON" bench/gpu_wheels.py install .whl /tmp/fusefleet-site
      export PYTHONPATH="/tmp/fusefleet-site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONUNBUFFERED=1
    exec "$PYTHON" -m bench.gpu_all "$@"
    ;;
esac
exec "$PYTHON" -m bench gpu "$@"
