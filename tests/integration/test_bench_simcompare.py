"""``python -m bench simcompare`` keeps working: the real command (a subprocess) at a tiny scale (a faster cost
model, one short overloaded load point of the mixed workload), with BentoML and LitServe where their venvs exist;
without them it checks fusefleet alone and reports the peer half as skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.peers.launch import PEERS, VENVS_DIR
from bench.simcompare import ORDERS

REPO = Path(__file__).resolve().parents[2]
TINY = (
    *("--workloads", "mixed", "--loads", "1.5", "--seconds", "2", "--batch", "4"),
    *("--base-ms", "60", "--per-image-ms", "15", "--scale-workers", "1", "--scale-forwards", "3"),
)
MISSING_VENVS = [name for name in PEERS if not (VENVS_DIR / name / ".complete").exists()]


def _simcompare(tmp_path: Path, *args: str) -> dict[str, Any]:
    out, docs = tmp_path / "out", tmp_path / "docs"
    docs.mkdir()
    (docs / "benchmarks.json").write_text(json.dumps({"P1": 0.5}))  # another command's figure: kept
    done = subprocess.run(
        [sys.executable, "-m", "bench", "simcompare", *TINY, "--out-dir", str(out), "--docs-dir", str(docs), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 150% |" in done.stdout  # the table is printed
    assert (docs / "bench" / "p4sim_mixed.png").stat().st_size > 1000
    assert (docs / "bench" / "p5_scaleout.png").stat().st_size > 1000
    figures = json.loads((docs / "benchmarks.json").read_text())
    assert figures["P1"] == 0.5 and 0 < figures["P1sim"] <= 1.05
    results: dict[str, Any] = json.loads((out / "simcompare.json").read_text())
    return results


def test_simcompare_tiny_run(tmp_path: Path) -> None:
    results = _simcompare(tmp_path, *(("--no-peers",) if MISSING_VENVS else ()))
    sweep = results["p4sim"]["mixed"]
    points, sent = sweep["points"], round(sweep["rates"][0] * 2)  # 1.5 x capacity for 2 s
    for name in ("fusefleet-grouped", "fusefleet-strict"):
        (point,) = points[name]
        assert point["succeeded"] == point["requests"] == sent, point
    # 512 and 768 px alternate: strict order closes a batch at the first request of the other size, grouped order
    # fuses each size's waiting requests
    assert points["fusefleet-grouped"][0]["mean_batch_size"] > max(
        2.0, points["fusefleet-strict"][0]["mean_batch_size"]
    )
    if MISSING_VENVS:
        assert set(results["output_sha256"]) == set(ORDERS) and "P4sim_mixed_tput" not in results["figures"]
        pytest.skip(
            f"fusefleet checked; the peer half needs {', '.join(MISSING_VENVS)}: run bench/peers/setup_venvs.sh"
        )
    for peer in PEERS:
        (point,) = points[peer]
        assert point["succeeded"] == point["requests"] == sent, point
    # the same request gives the same PNG bytes from all four systems (the command checks it too)
    assert set(results["output_sha256"]) == {*ORDERS, *PEERS} and len(set(results["output_sha256"].values())) == 1
    assert results["figures"]["P4sim_mixed_tput"] > 0 and results["figures"]["P4sim_mixed_p99"] > 0
