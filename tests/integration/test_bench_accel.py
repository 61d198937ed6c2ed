"""``bench/gpu.sh accel`` keeps working: its CPU tiny path end to end (the real script as a subprocess), every
model and variant measured, the exact variant's deviation from stock within 1/255 and the P6 figures computed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def test_the_cpu_tiny_run_compares_stock_and_exact(tmp_path: Path) -> None:
    out = tmp_path / "accel.json"
    done = subprocess.run(
        [
            *("bash", "bench/gpu.sh", "accel", "--device", "cpu", "--tiny", "--no-compile", "--size", "32"),
            *("--steps", "1", "--batches", "1,4", "--seconds", "0", "--torch-threads", "1"),
            *("--cache-dir", str(tmp_path / "cache"), "--out", str(out)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["models"]) == {"sd15", "dit"}
    for model in results["models"].values():
        assert set(model) == {"stock", "exact"}
        for variant in model.values():
            assert set(variant["batches"]) == {"1", "4"}
            for batch, point in variant["batches"].items():
                assert point["images_per_s"] > 0 and point["calls"] >= 2
                # one request: encoded alone either way, bit for bit; a batch: rows encoded alone vs together
                assert point["deviation_255"] <= (0 if batch == "1" else 1)
    figures = results["figures"]
    assert figures["P6_exact_speedup_sd15_b8"] is None  # batch 8 not run
    assert figures["P6_approx_speedup_sd15_b8"] is None and results["not_built"]
    assert "| sd15 (stable-diffusion, 32 px) | exact | 4 |" in done.stdout
