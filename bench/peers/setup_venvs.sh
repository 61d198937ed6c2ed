#!/usr/bin/env bash
# Create the peer-framework virtual environments used by the side-by-side benchmark:
#   .bench-venvs/bentoml   (bentoml + the diffusers stack)
#   .bench-venvs/litserve  (litserve + the diffusers stack)
# These are NOT fusefleet dependencies. Idempotent: a venv whose .complete stamp matches the wanted
# package spec is skipped. Usage: bench/peers/setup_venvs.sh [bentoml] [litserve]   (default: both)
#
# torch is installed FIRST and pinned again on the second pip command line: torch==2.13.0 is a local
# CPU wheel here, and letting pip re-resolve torch would pull a multi-GB CUDA build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENVS="${BENCH_VENVS_DIR:-$ROOT/.bench-venvs}"
PYTHON="${BENCH_PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

TORCH_SPEC="${BENCH_TORCH_SPEC:-torch==2.13.0}"
# The diffusers stack matches the project venv (.venv) so every server runs the same code per batch.
COMMON_SPECS=(
    "diffusers==0.42.1"
    "transformers==${BENCH_TRANSFORMERS_VERSION:-5.24.0}"
    "accelerate==${BENCH_ACCELERATE_VERSION:-1.15.0}"
    "safetensors==${BENCH_SAFETENSORS_VERSION:-0.8.0}"
    "pillow==${BENCH_PILLOW_VERSION:-13.0.0}"
)

peer_spec() {
    case "$1" in
        bentoml) echo "bentoml==${BENCH_BENTOML_VERSION:-1.4.40}" ;;
        litserve) echo "litserve==${BENCH_LITSERVE_VERSION:-0.2.19}" ;;
        *) echo "unknown peer: $1 (expected bentoml or litserve)" >&2; return 1 ;;
    esac
}

setup_one() {
    local name="$1" venv="$VENVS/$1" spec stamp_want start
    spec="$(peer_spec "$name")"
    stamp_want="$TORCH_SPEC $spec ${COMMON_SPECS[*]}"
    if [[ -f "$venv/.complete" && "$(cat "$venv/.complete")" == "$stamp_want" ]]; then
        echo "[$name] already complete: $venv"
        return 0
    fi
    start=$(date +%s)
    echo "[$name] creating $venv with $PYTHON"
    rm -rf "$venv"
    mkdir -p "$VENVS"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install "$TORCH_SPEC"
    "$venv/bin/python" -m pip install "$TORCH_SPEC" "$spec" "${COMMON_SPECS[@]}"
    "$venv/bin/python" - "$name" <<'PY'
import importlib.metadata as md
import sys

import torch

assert "+cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
pkgs = [sys.argv[1], "torch", "diffusers", "transformers", "accelerate", "safetensors", "pillow"]
print(" ".join(f"{p}=={md.version(p)}" for p in pkgs))
PY
    echo "$stamp_want" >"$venv/.complete"
    echo "[$name] done in $(($(date +%s) - start))s"
}

peers=("$@")
[[ ${#peers[@]} -eq 0 ]] && peers=(bentoml litserve)
for peer in "${peers[@]}"; do
    setup_one "$peer"
done
