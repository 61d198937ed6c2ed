"""``python -m bench redis``'s pure part: the commandstats rows it keeps, the per-request arithmetic and the
side-by-side ratios; and that a fleet started from another source tree (its baseline) runs that tree's code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.redis_cost import CommandCost, RedisCost, SideBySide, command_costs, figures
from fusefleet.up import LocalFleet

STATS: dict[str, dict[str, float]] = {
    "cmdstat_evalsha": {"calls": 40, "usec": 4000, "usec_per_call": 100.0, "rejected_calls": 0, "failed_calls": 0},
    "cmdstat_hget": {"calls": 300, "usec": 210, "usec_per_call": 0.7, "rejected_calls": 0, "failed_calls": 0},
    "cmdstat_XADD": {"calls": 60, "usec": 330, "usec_per_call": 5.5, "rejected_calls": 0, "failed_calls": 0},
    "cmdstat_config|resetstat": {"calls": 1, "usec": 39, "usec_per_call": 39.0},
    "cmdstat_info": {"calls": 2, "usec": 56, "usec_per_call": 28.0},
    "errorstat_ERR": {"count": 1},
}


def test_commandstats_rows_drop_the_benchmarks_own_commands_and_other_sections() -> None:
    assert sorted(command_costs(STATS), key=lambda row: row.name) == [
        CommandCost("evalsha", 40, 4000),
        CommandCost("hget", 300, 210),
        CommandCost("xadd", 60, 330),
    ]


def test_per_request_figures_and_the_table_most_costly_first() -> None:
    cost = RedisCost(requests=20, commands=tuple(command_costs(STATS)), cpu_s=0.005, reads=90)
    assert cost.cmds_per_request == pytest.approx((40 + 300 + 60) / 20)
    assert cost.reads_per_request == pytest.approx(4.5)  # the server's socket reads: its round trips
    assert cost.us_per_request == pytest.approx(250.0)  # 5 ms of server CPU over 20 requests
    assert cost.command_us_per_request == pytest.approx((4000 + 210 + 330) / 20)
    assert [row.name for row in cost.by_cost()] == ["evalsha", "xadd", "hget"]
    lines = cost.table().splitlines()
    assert lines[2] == "| EVALSHA | 2.00 | 200.0 | 100.0 |"
    assert lines[4] == "| HGET | 15.00 | 10.5 | 0.7 |"
    assert len(cost.table(top=1).splitlines()) == 3


def test_figures_name_the_null_runner_apart() -> None:
    simulated = RedisCost(10, (CommandCost("hget", 50, 10),), cpu_s=0.001)
    null = RedisCost(10, (CommandCost("hget", 20, 4),), cpu_s=0.0005)
    assert figures({"simulated": simulated, "null": null}) == {
        "redis_cmds_per_request": 5.0,
        "redis_us_per_request": pytest.approx(100.0),
        "redis_cmds_per_request_null": 2.0,
        "redis_us_per_request_null": pytest.approx(50.0),
    }


def test_no_requests_is_refused() -> None:
    with pytest.raises(ValueError, match="requests"):
        RedisCost(0, (), 0.0)


def test_slowlog_entries_are_summed_by_script_name_and_the_benchmarks_own_left_out() -> None:
    from bench.redis_cost import ScriptCost, script_costs, script_names
    from shared import keys

    names = script_names()
    finish = next(sha for sha, name in names.items() if name == "FINISH")
    assert names[finish] == "FINISH" and len(names) > 20
    entries = [
        {"command": f"EVALSHA {finish} 7 a b".encode(), "duration": 100},
        {"command": f"EVALSHA {finish} 7 a b".encode(), "duration": 300},
        {"command": b"EVALSHA 0123456789abcdef 1 x", "duration": 7},
        {"command": b"HMGET t:r:1 status", "duration": 3},
        {"command": b"SLOWLOG RESET", "duration": 1},
        {"command": b"CONFIG SET slowlog-log-slower-than 0", "duration": 9},
    ]
    rows = sorted(script_costs(entries, names), key=lambda row: row.name)
    assert rows == [
        ScriptCost("FINISH", 2, 400, 200.0),
        ScriptCost("evalsha:01234567", 1, 7, 7.0),
        ScriptCost("hmget", 1, 3, 3.0),
    ]
    assert keys.FINISH  # the names come from shared.keys' scripts


def test_the_idle_share_is_the_idle_rate_over_the_window_per_request() -> None:
    cost = RedisCost(10, (CommandCost("hget", 50, 10),), cpu_s=0.01, window_s=2.0, idle_cpu_rate=0.002)
    assert cost.idle_share_us == pytest.approx(400.0)  # 2 ms/s x 2 s over 10 requests
    assert cost.summary()["idle_share_us"] == pytest.approx(400.0)


def test_side_by_side_ratios_are_this_trees_medians_over_the_baselines() -> None:
    def cost(cmds: int, cpu_s: float, reads: int) -> RedisCost:
        return RedisCost(10, (CommandCost("hget", cmds, 1),), cpu_s=cpu_s, reads=reads)

    compared = SideBySide(
        "abc1234",
        before=(cost(1500, 0.011, 100), cost(1520, 0.010, 102), cost(1480, 0.012, 98)),
        after=(cost(300, 0.004, 26), cost(290, 0.005, 27), cost(310, 0.0041, 25)),
    )
    assert compared.ratio("cmds_per_request") == pytest.approx(30.0 / 150.0)
    assert compared.ratio("us_per_request") == pytest.approx(410.0 / 1100.0)
    table = compared.table()
    assert "| Redis CPU µs / request | 1100, 1000, 1200 | 1100 | 400, 500, 410 | 410 | 0.373 |" in table
    assert "| socket reads / request | 10.00, 10.20, 9.80 | 10.00 | 2.60, 2.70, 2.50 | 2.60 | 0.260 |" in table


def test_a_fleet_from_another_source_tree_runs_that_trees_code(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "fusefleet").mkdir(parents=True)
    marker = tmp_path / "ran"
    (tree / "fusefleet" / "__main__.py").write_text(
        f"import pathlib, sys\npathlib.Path({str(marker)!r}).write_text(' '.join(sys.argv[1:]))\n"
    )
    fleet = LocalFleet(host="127.0.0.1", port=1, workers=0, state_dir=tmp_path / "state", code_dir=tree)
    fleet._spawn("probe", ["scheduler"], {"PATH": os.environ.get("PATH", "")})
    assert fleet.processes["probe"].wait(timeout=60) == 0
    assert marker.read_text() == "scheduler"
