"""``python -m bench redis`` end to end on a small window (seconds): it cannot rot, and the progress path's Redis
cost per request stays cut (the step reporter writes at most once per ``WRITE_EVERY_S``, not once per step)."""

from __future__ import annotations

from pathlib import Path

from bench.redis_cost import measure


def test_bench_redis_measures_the_simulated_fleet_and_progress_stays_cheap(tmp_path: Path) -> None:
    cost = measure("simulated", requests=24, concurrency=16, steps=20, seqs=8, log_dir=tmp_path)
    calls = {row.name: row.calls / cost.requests for row in cost.commands}
    assert cost.us_per_request > 0 and calls.get("evalsha", 0) >= 3, calls  # submit, schedule, claim, finish...
    # progress.lua reads each request's last event once per write: one write per step (20 a request before the
    # cut) would be 20 a request; a 180 ms forward written at most every 100 ms takes about 3
    assert calls.get("xrevrange", 0) <= 6, calls
    assert cost.cmds_per_request < 120, calls  # 152 before the cut (docs/benchmarks.md)
