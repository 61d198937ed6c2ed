"""``python -m bench shards`` end to end on a tiny window: a real sharded fleet (two shards of two models, one
worker per model, one scheduler leading both) serves every request, and the report, the figures and the docs
section keep their shape. No timings are asserted (what a loaded machine gives is not a property of the code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.shards import ROWS, TICK, figures, measure, proc_cpu_s, table, write_docs

pytestmark = pytest.mark.timeout(240)


def test_a_two_shard_fleet_serves_every_request_and_the_report_keeps_its_shape(tmp_path: Path) -> None:
    run = measure(2, requests=8, concurrency=4, steps=2, seqs=4, log_dir=tmp_path / "logs", idle_s=0.5)
    summary = run.summary()
    assert summary["shards"] == 2 and summary["requests"] == 8, "every request succeeded (measure raises otherwise)"
    assert summary["redis_cmds_per_request"] > 0 and summary["redis_us_per_request"] > 0
    assert summary["scheduler_us_per_request"] >= 0 and summary["window_s"] > 0
    lines = table([run]).splitlines()
    assert lines[0] == "| | 2 shards |" and len(lines) == 2 + len(ROWS)
    assert set(figures([run])) == {
        f"shard_{name}_2"
        for name in (
            "redis_us_per_request",
            "redis_cmds_per_request",
            "scheduler_us_per_request",
            "redis_idle_ms_per_s",
            "scheduler_idle_ms_per_s",
        )
    }
    (tmp_path / "benchmarks.json").write_text(json.dumps({"other": 1.0}))
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n\n## Other\n\nkept\n")
    write_docs([run], tmp_path, "python -m bench shards --docs")
    written = json.loads((tmp_path / "benchmarks.json").read_text())
    assert written["other"] == 1.0 and "shard_redis_us_per_request_2" in written, "other keys kept"
    document = (tmp_path / "benchmarks.md").read_text()
    assert "## Other\n\nkept" in document and "## Shards:" in document and "| | 2 shards |" in document
    write_docs([run], tmp_path, "python -m bench shards --docs")
    assert (tmp_path / "benchmarks.md").read_text().count("## Shards:") == 1, "rewritten, not appended twice"


def test_a_process_cpu_is_its_user_and_system_ticks() -> None:
    # /proc/<pid>/stat: the name in parentheses may hold spaces and parentheses; utime, stime are fields 14, 15
    stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 3 0 100 0 0"
    assert proc_cpu_s(stat) == pytest.approx(400 / TICK)
