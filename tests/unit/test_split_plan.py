"""The split plan of a batch whose runs were lost (``shared/lua/lib_split_plan.lua``), run on its own in Lua 5.1
(Redis's Lua) without Redis: which requests each claim runs, puts aside or fails, and the bound that follows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib.resources import files

import lupa.lua51
import pytest

LIB = files("shared").joinpath("lua", "lib_split_plan.lua").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Plan:
    run: list[int]  # row indexes, 0-based
    fail: list[int]
    counts: dict[int, int]


LUA = lupa.lua51.LuaRuntime()
SPLIT_PLAN = LUA.execute(LIB + "\nreturn split_plan")


def plan_of(rows: list[tuple[bool, int]], max_lost: int) -> Plan:
    """``split_plan`` for rows of (lost in the last run, earlier lost runs)."""
    table = LUA.table_from([LUA.table_from({"lost": lost, "count": count}) for lost, count in rows])
    out = SPLIT_PLAN(table, max_lost)
    return Plan(
        run=[int(i) - 1 for i in out["run"].values()],
        fail=[int(i) - 1 for i in out["fail"].values()],
        counts={int(i) - 1: int(n) for i, n in out["counts"].items()},
    )


def test_a_batch_no_run_of_which_was_lost_runs_whole() -> None:
    assert plan_of([(False, 0)] * 4, 3) == Plan(run=[0, 1, 2, 3], fail=[], counts={})


def test_a_lost_run_of_several_is_split_and_its_first_half_runs() -> None:
    plan = plan_of([(True, 0)] * 5, 3)
    assert plan == Plan(run=[0, 1, 2], fail=[], counts=dict.fromkeys(range(5), 1))  # 3 and 4 are put aside


def test_a_lost_run_of_several_never_fails_anyone_whatever_their_counts() -> None:
    plan = plan_of([(True, 5), (True, 5)], 3)
    assert plan == Plan(run=[0], fail=[], counts={0: 6, 1: 6})


def test_a_lost_run_of_one_runs_alone_again_until_max_then_fails_and_the_next_part_runs() -> None:
    assert plan_of([(True, 1), (False, 1)], 3) == Plan(run=[0], fail=[], counts={0: 2})
    # lost the 3rd time: it fails, and the claim runs the part put aside (the highest count waiting)
    rows = [(False, 1), (True, 2), (False, 2), (False, 1)]
    assert plan_of(rows, 3) == Plan(run=[2], fail=[1], counts={1: 3})
    assert plan_of([(True, 2)], 3) == Plan(run=[], fail=[0], counts={0: 3})


def test_with_no_lost_run_the_part_put_aside_last_runs() -> None:
    rows = [(False, 1), (False, 2), (False, 0), (False, 2)]
    assert plan_of(rows, 3).run == [1, 3]


@dataclass
class Batch:
    """A batch driven claim by claim through the plan, as ``claim.lua`` applies it; a run that holds a culprit dies."""

    size: int
    culprits: set[int]
    max_lost: int
    state: list[str] = field(init=False)  # waiting, lost, succeeded, failed
    count: list[int] = field(init=False)
    lost_runs: int = 0
    good_runs: int = 0
    culprit_failed_after: dict[int, int] = field(default_factory=dict)  # culprit -> runs of the batch before

    def __post_init__(self) -> None:
        self.state = ["waiting"] * self.size
        self.count = [0] * self.size

    def claim(self) -> None:
        live = [i for i, s in enumerate(self.state) if s in ("waiting", "lost")]
        plan = plan_of([(self.state[i] == "lost", self.count[i]) for i in live], self.max_lost)
        for r, n in plan.counts.items():
            self.count[live[r]] = n
            self.state[live[r]] = "waiting"  # put aside, unless run
        for r in plan.fail:
            self.state[live[r]] = "failed"
            self.culprit_failed_after[live[r]] = self.lost_runs + self.good_runs
        ran = [live[r] for r in plan.run]
        if any(i in self.culprits for i in ran):
            self.lost_runs += 1
            for i in ran:
                self.state[i] = "lost"
        elif ran:
            self.good_runs += 1
            for i in ran:
                self.state[i] = "succeeded"

    def settle(self) -> None:
        for _ in range(10 * self.size * (self.max_lost + 2)):
            if all(s in ("succeeded", "failed") for s in self.state):
                return
            self.claim()
        raise AssertionError(f"never settled: {self}")


@pytest.mark.parametrize("max_lost", [1, 2, 3, 5])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 8, 16, 33])
def test_one_culprit_fails_alone_within_the_stated_bound(size: int, max_lost: int) -> None:
    depth = math.ceil(math.log2(size))
    for culprit in range(size):
        batch = Batch(size, {culprit}, max_lost)
        batch.settle()
        assert [s for i, s in enumerate(batch.state) if i != culprit] == ["succeeded"] * (size - 1)
        assert batch.state[culprit] == "failed"
        # docs/reliability.md: at most max(A, ceil(log2 N) + 1) lost runs (exactly, for N a power of two) and
        # ceil(log2 N) runs that succeed
        assert batch.lost_runs <= max(max_lost, depth + 1), (size, culprit, batch)
        assert batch.lost_runs >= max_lost
        if size & (size - 1) == 0:
            assert batch.lost_runs == max(max_lost, depth + 1), (size, culprit, batch)
        assert batch.count[culprit] == batch.lost_runs
        assert batch.good_runs <= depth
        assert batch.culprit_failed_after[culprit] <= max(max_lost, depth + 1) + depth


@pytest.mark.parametrize("culprits", [{0, 1}, {0, 7}, {2, 3, 5}, set(range(8))])
def test_several_culprits_fail_and_only_they(culprits: set[int]) -> None:
    batch = Batch(8, culprits, 3)
    batch.settle()
    assert {i for i, s in enumerate(batch.state) if s == "failed"} == culprits
    assert all(batch.count[i] >= 3 for i in culprits)
