"""The prepared GPU session (``bench/gpu.sh all``) keeps working: its CPU tiny path as the real script (the DiT
phase: the tiny SD3 demo, stock and exact), every file it writes and nothing else, a phase's figures never wiped by
a later phase's, a failed phase reported while the next still runs, and ``--record``: a tiny or CPU run's folder
refused, a CUDA run's figures merged into docs/benchmarks.json (others kept) and its JSON copied into docs/bench/.
The other phases' CPU paths: test_bench_accel.py and test_bench_gpu.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from bench import gpu_all
from bench.gpu import GpuRunConfig, fleet_env
from bench.gpu_all import main, record, run_all
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def test_the_cpu_tiny_dit_phase_writes_its_files_and_figure(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *("bash", "bench/gpu.sh", "all", "--device", "cpu", "--tiny", "--no-compile", "--phases", "dit"),
            *("--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--log-dir", str(tmp_path / "logs")),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["accel-dit.json", "summary.json", "summary.md"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tiny"] is True and summary["device"] == "cpu" and set(summary["phase_s"]) == {"dit"}
    assert summary["figures"]["P6_exact_speedup_dit_b4"] > 0 and summary["skipped"] == []
    assert set(summary["images_per_s"]["dit"]) == {"stock", "exact"}
    assert set(summary["images_per_s"]["dit"]["exact"]) == {"1", "4"}
    assert "`P6_exact_speedup_dit_b4`" in (out / "summary.md").read_text()
    assert main(["--record", str(out), "--docs-dir", str(tmp_path / "docs")]) == 2  # a tiny CPU run: refused
    assert not (tmp_path / "docs").exists()


def test_record_merges_a_cuda_runs_figures_and_copies_its_json(tmp_path: Path) -> None:
    out, docs = tmp_path / "out", tmp_path / "docs"
    out.mkdir()
    docs.mkdir()
    (docs / "benchmarks.json").write_text(json.dumps({"P1": 0.83, "P6_exact_speedup_dit_b4": 9.0}))
    figures = {"P6_exact_speedup_sd15_b8": 1.91234, "P6_exact_speedup_dit_b4": None, "P1_gpu_exact": 1.01}
    (out / "summary.json").write_text(json.dumps({"tiny": False, "device": "cuda", "figures": figures}))
    (out / "accel-sd15.json").write_text("{}")
    assert record(out, docs, "accel-h200") == {"P6_exact_speedup_sd15_b8": 1.91234, "P1_gpu_exact": 1.01}
    merged = json.loads((docs / "benchmarks.json").read_text())
    assert merged == {
        "P1": 0.83,
        "P6_exact_speedup_dit_b4": 9.0,
        "P6_exact_speedup_sd15_b8": 1.9123,
        "P1_gpu_exact": 1.01,
    }
    assert sorted(p.name for p in (docs / "bench").iterdir()) == [
        "accel-h200-accel-sd15.json",
        "accel-h200-summary.json",
    ]


def test_the_compiled_fleets_environment_is_settings_the_worker_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = GpuRunConfig(size=512, compile_denoiser=True, cache_dir=Path("/tmp/cache"))
    for name, value in fleet_env(cfg, Path("/models/sd15")).items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.model == "/models/sd15" and settings.compile_denoiser is True
    assert settings.knee_warmup_sizes == [(512, 512)] and settings.batch_knee_cap is False
    assert settings.compile_cache_dir == Path("/tmp/cache/inductor")
    assert "FUSEFLEET_COMPILE_DENOISER" not in fleet_env(GpuRunConfig(), Path("/m"))


def test_a_failing_phase_is_reported_and_the_next_one_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = []

    def run_accel(cfg: object, log: object) -> dict[str, object]:
        ran.append(cfg)
        if len(ran) == 1:
            raise RuntimeError("compile failed")
        return {"figures": {"P6_exact_speedup_dit_b4": 1.5}, "models": {}, "skipped": []}

    monkeypatch.setattr(gpu_all, "run_accel", run_accel)
    monkeypatch.setattr(gpu_all, "accel_markdown", lambda results: "table")
    summary = run_all("cpu", True, False, tmp_path, tmp_path / "out", tmp_path / "logs", phases=("sd15", "dit"))
    assert len(ran) == 2 and summary["errors"] == {"sd15": "RuntimeError: compile failed"}
    assert summary["figures"] == {"P6_exact_speedup_dit_b4": 1.5}
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert written["errors"] == summary["errors"] and set(written["phase_s"]) == {"sd15", "dit"}
    assert "sd15 failed: RuntimeError: compile failed" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA device: the command would really run")
def test_no_cuda_device_exits_2_before_writing_anything(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", "bench/gpu.sh", "all", "--out", str(tmp_path / "out")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 2 and done.stderr.strip().startswith("error: no CUDA device"), done.stderr
    assert not (tmp_path / "out").exists()
