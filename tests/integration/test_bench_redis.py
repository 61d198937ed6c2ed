"""``python -m bench redis`` end to end on a small window (seconds): it cannot rot, and the progress path's Redis
cost per request stays cut (the step reporter writes at most once per ``WRITE_EVERY_S``, not once per step)."""

from __future__ import annotations

from pathlib import Path

from bench.redis_cost import measure


def test_bench_redis_measures_the_simulated_fleet_and_progress_stays_cheap(tmp_path: Path) -> None:
    cost = measure("simulated", requests=24, concurrency=16, steps=20, seqs=8, log_dir=tmp_path)
    calls = {row.name: row.calls / cost.requests for row in cost.commands}
    # schedule, claim, finish, batch_done one a batch of up to 8 (0.5 a request at least); submit one per burst of
    # concurrent submissions (api/coalescer.py: at most one a request)
    assert cost.us_per_request > 0 and calls.get("evalsha", 0) >= 0.5, calls
    # progress.lua reads a request's last event only where claim.lua left no event_ms: one write per step (20 a
    # request before the first cut) read it 20 times a request; now a 180 ms forward, shorter than the reporter's
    # 250 ms interval, writes no progress of its own (its last step goes with finish.lua)
    assert calls.get("xrevrange", 0) <= 1, calls
    # 152 before the first cut, 37 before the 250 ms interval and the once-a-second metrics, ~34 after (200
    # requests; this short window charges the fleet's timers to fewer requests): per-step writes would add 60
    assert cost.cmds_per_request < 60, calls


def test_bench_redis_scripts_times_each_script_of_a_requests_life() -> None:
    from bench.redis_scripts import measure, table

    figures = {figure.name: figure for figure in measure(rounds=4, size=4, repeats=1)}
    for name in ("SUBMIT", "SCHEDULE", "CLAIM", "RESULTS_RECORD", "FORWARD_DONE", "FINISH", "BATCH_DONE"):
        assert figures[name].us_per_call > 0 and figures[name].calls_per_request == 0.25, figures
    assert "| all |" in table(list(figures.values()))
