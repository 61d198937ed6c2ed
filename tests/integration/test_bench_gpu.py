"""The one-command GPU run (``python -m bench gpu``) keeps working: its CPU tiny variant end to end (the real
command as a subprocess: demo model saved and loaded through from_pretrained, pipeline alone, fleets, Poisson),
its refusal to run without a CUDA device, and the DiT it builds for ``bench/gpu.sh accel`` having SD3 Medium's
architecture."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _bench_gpu(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", "gpu", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_cpu_tiny_run_writes_every_section(tmp_path: Path) -> None:
    out, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    done = _bench_gpu(
        *("--device", "cpu", "--tiny", "--size", "64", "--steps", "2", "--batches", "1,2", "--seqs", "1,2"),
        *("--seconds", "0.5", "--fleet-seconds", "1.5", "--poisson-seconds", "1.5", "--torch-threads", "1"),
        *("--budget-s", "240", "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--markdown", str(md)),
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    for section in ("config", "environment", "model", "pipeline", "fleet", "poisson", "figures", "skipped"):
        assert section in results, section
    assert results["skipped"] == [] and results["within_budget"] is True

    model = Path(results["model"]["path"])
    assert (model / "model_index.json").is_file() and results["model"]["bytes_on_disk"] > 0

    pipe = results["pipeline"]["batches"]
    assert set(pipe) == {"1", "2"}
    for point in pipe.values():
        assert _positive(point["images_per_s"]) and point["calls"] >= 2
        assert point["peak_memory_bytes"] is None  # CPU: no accelerator memory to report

    fleet = results["fleet"]
    assert set(fleet) == {"1", "2"}
    for seqs, run in fleet.items():
        assert run["succeeded"] == run["requests"] > 0, run["first_errors"]
        assert _positive(run["images_per_s"]) and 0.2 < run["P1"] < 5.0
        assert run["latency_s"]["p50"] <= run["latency_s"]["p99"]
        assert run["mean_batch_size"] <= int(seqs)
    assert fleet["2"]["mean_batch_size"] > 1  # the fleet really fuses at max_num_seqs 2

    figures = results["figures"]
    assert figures["P1"] == fleet["2"]["P1"] and _positive(figures["P2"]) and figures["P2_over"] == [1, 2]

    poisson = results["poisson"]
    assert poisson["max_num_seqs"] == 2 and _positive(poisson["offered_rps"])
    assert poisson["succeeded"] == poisson["requests"] > 0, poisson["first_errors"]
    assert _positive(poisson["images_per_s"]) and poisson["latency_s"]["p50"] <= poisson["latency_s"]["p99"]

    table = md.read_text()
    assert "## The pipeline alone" in table and "| max_num_seqs |" in table and "Poisson" in table
    assert table in done.stdout  # printed too


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA device: the command would really run")
def test_no_cuda_device_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    done = _bench_gpu("--device", "cuda", "--out", str(tmp_path / "gpu.json"), timeout=120)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: no CUDA device"), done.stderr
    assert not (tmp_path / "gpu.json").exists()


def test_the_dit_has_sd3_mediums_architecture() -> None:
    from bench.gpu import build_sd3_random_pipeline

    pipe = build_sd3_random_pipeline("meta")  # the shapes alone: no memory, no time
    millions = {
        name: round(sum(p.numel() for p in getattr(pipe, name).parameters()) / 1e6)
        for name in ("transformer", "vae", "text_encoder", "text_encoder_2")
    }
    assert millions == {"transformer": 2028, "vae": 84, "text_encoder": 124, "text_encoder_2": 695}
    assert type(pipe).__name__ == "StableDiffusion3Pipeline" and pipe.text_encoder_3 is None
