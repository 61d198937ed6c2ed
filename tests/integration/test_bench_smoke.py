"""The benchmark harness runs end to end (seconds, null runner): it cannot rot between real benchmark runs."""

from __future__ import annotations

from pathlib import Path

from bench.smoke import SMOKE_LOADS, run_smoke


def test_bench_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    summaries = run_smoke(tmp_path / "logs", out)
    for name, spec in SMOKE_LOADS.items():
        summary = summaries[name]
        assert summary["succeeded"] == spec.count, summary
        assert summary["throughput_rps"] > 0
        assert summary["latency_s"]["p50"] <= summary["latency_s"]["p99"]
    # 16 requests land at once on one idle worker with max_num_seqs 8: they must be fused
    assert summaries["burst"]["mean_batch_size"] > 1
    assert out.exists() and out.with_suffix(".png").stat().st_size > 1000
