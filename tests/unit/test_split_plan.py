"""The split plan of a batch whose runs were lost (``shared/lua/lib_split_plan.lua``), run on its own in Lua 5.1
(Redis's Lua) without Redis: which requests each claim runs, puts aside or fails, and the bounds that follow: a
request whose run kills its worker fails after at most ceil(log2 N) + A lost runs, and a loss that is not a
request's fault (a restart, at any point, of a whole run or of what a run left unfinished) fails it only if it is
lost A times running alone."""

from __future__ import annotations

import math
import random
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
    alone: dict[int, int] = field(default_factory=dict)


LUA = lupa.lua51.LuaRuntime()
SPLIT_PLAN = LUA.execute(LIB + "\nreturn split_plan")


def plan_of(rows: list[tuple[bool, int, int]], max_lost: int, ran: int | None = None) -> Plan:
    """``split_plan`` for rows of (lost in the last run, earlier lost runs, those of them alone), the last run
    having run ``ran`` requests (None: unknown)."""
    table = LUA.table_from(
        [LUA.table_from({"lost": lost, "count": count, "alone": alone}) for lost, count, alone in rows]
    )
    out = SPLIT_PLAN(table, max_lost, ran)
    return Plan(
        run=[int(i) - 1 for i in out["run"].values()],
        fail=[int(i) - 1 for i in out["fail"].values()],
        counts={int(i) - 1: int(n) for i, n in out["counts"].items()},
        alone={int(i) - 1: int(n) for i, n in out["alone"].items()},
    )


def test_a_batch_no_run_of_which_was_lost_runs_whole() -> None:
    assert plan_of([(False, 0, 0)] * 4, 3) == Plan(run=[0, 1, 2, 3], fail=[], counts={})


def test_a_lost_run_of_several_is_split_and_its_first_half_runs() -> None:
    plan = plan_of([(True, 0, 0)] * 5, 3, ran=5)
    assert plan == Plan(run=[0, 1, 2], fail=[], counts=dict.fromkeys(range(5), 1))  # 3 and 4 are put aside


def test_a_lost_run_of_several_never_fails_anyone_whatever_their_counts() -> None:
    plan = plan_of([(True, 5, 2), (True, 5, 2)], 3, ran=2)
    assert plan == Plan(run=[0], fail=[], counts={0: 6, 1: 6})


def test_a_lost_run_of_one_runs_alone_again_until_lost_max_times_alone_then_fails_and_the_next_part_runs() -> None:
    assert plan_of([(True, 1, 0), (False, 1, 0)], 3, ran=1) == Plan(run=[0], fail=[], counts={0: 2}, alone={0: 1})
    # lost alone the 3rd time: it fails, and the claim runs the part put aside (the highest count waiting)
    rows = [(False, 1, 0), (True, 4, 2), (False, 2, 0), (False, 1, 0)]
    assert plan_of(rows, 3, ran=1) == Plan(run=[2], fail=[1], counts={1: 5}, alone={1: 3})
    assert plan_of([(True, 2, 2)], 3, ran=1) == Plan(run=[], fail=[0], counts={0: 3}, alone={0: 3})


def test_many_losses_with_others_then_one_alone_do_not_fail_a_request() -> None:
    """The culprit's last sibling has been lost with it 3 times (A = 3) when it first runs alone: a loss of that
    solo run that is not its fault (a deploy restart) runs it alone again; it fails only lost A times alone."""
    assert plan_of([(True, 3, 0)], 3, ran=1) == Plan(run=[0], fail=[], counts={0: 4}, alone={0: 1})


def test_the_one_row_left_of_a_run_that_finished_the_others_is_not_lost_alone() -> None:
    assert plan_of([(True, 2, 2)], 3, ran=4) == Plan(run=[0], fail=[], counts={0: 3})
    assert plan_of([(True, 2, 2)], 3) == Plan(run=[], fail=[0], counts={0: 3}, alone={0: 3})  # unknown: alone


def test_with_no_lost_run_the_part_put_aside_last_runs() -> None:
    rows = [(False, 1, 0), (False, 2, 0), (False, 0, 0), (False, 2, 0)]
    assert plan_of(rows, 3, ran=2).run == [1, 3]


@dataclass
class Batch:
    """A batch driven claim by claim through the plan, as ``claim.lua`` applies it. A run that holds a culprit
    dies; so does each run whose index is in ``innocent`` (a restart: not the fault of any request in it), after
    finishing the first ``partial[index]`` rows it ran when given, and the first run of each request of
    ``restart_solo`` alone."""

    size: int
    culprits: set[int]
    max_lost: int
    innocent: set[int] = field(default_factory=set)
    partial: dict[int, int] = field(default_factory=dict)
    restart_solo: set[int] = field(default_factory=set)
    state: list[str] = field(init=False)  # waiting, lost, succeeded, failed
    count: list[int] = field(init=False)
    alone: list[int] = field(init=False)
    ran: int | None = None
    runs: int = 0
    lost_runs: int = 0
    good_runs: int = 0
    lost_holding: list[int] = field(init=False)  # each request's lost runs, as the simulator saw them
    lost_alone: list[int] = field(init=False)  # ... those that ran it alone
    failed_after: dict[int, int] = field(default_factory=dict)  # request -> runs of the batch before it failed

    def __post_init__(self) -> None:
        self.state = ["waiting"] * self.size
        self.count = [0] * self.size
        self.alone = [0] * self.size
        self.lost_holding = [0] * self.size
        self.lost_alone = [0] * self.size

    def claim(self) -> None:
        live = [i for i, s in enumerate(self.state) if s in ("waiting", "lost")]
        rows = [(self.state[i] == "lost", self.count[i], self.alone[i]) for i in live]
        plan = plan_of(rows, self.max_lost, self.ran)
        for r, n in plan.counts.items():
            self.count[live[r]] = n
            self.state[live[r]] = "waiting"  # put aside, unless run
        for r, n in plan.alone.items():
            self.alone[live[r]] = n
        for r in plan.fail:
            self.state[live[r]] = "failed"
            self.failed_after[live[r]] = self.runs
        ran = [live[r] for r in plan.run]
        if not ran:
            return
        self.ran, index = len(ran), self.runs
        self.runs += 1
        solo_restart = len(ran) == 1 and ran[0] in self.restart_solo
        self.restart_solo -= set(ran) if solo_restart else set()
        if any(i in self.culprits for i in ran) or index in self.innocent or solo_restart:
            self.lost_runs += 1
            finished = 0 if any(i in self.culprits for i in ran) else min(self.partial.get(index, 0), len(ran) - 1)
            for i in ran[:finished]:
                self.state[i] = "succeeded"
            for i in ran[finished:]:
                self.state[i] = "lost"
                self.lost_holding[i] += 1
                self.lost_alone[i] += len(ran) == 1
        else:
            self.good_runs += 1
            for i in ran:
                self.state[i] = "succeeded"

    def settle(self) -> None:
        for _ in range(10 * self.size * (self.max_lost + 2) + 2 * len(self.innocent)):
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
        # docs/reliability.md: at most ceil(log2 N) + A lost runs (exactly, for N a power of two): it is lost
        # exactly A times alone; and at most ceil(log2 N) runs that succeed
        assert batch.alone[culprit] == batch.lost_alone[culprit] == max_lost
        assert math.floor(math.log2(size)) + max_lost <= batch.lost_runs <= depth + max_lost, (size, culprit, batch)
        if size & (size - 1) == 0:
            assert batch.lost_runs == depth + max_lost, (size, culprit, batch)
        assert batch.count[culprit] == batch.lost_runs
        assert batch.good_runs <= depth
        assert batch.failed_after[culprit] <= 2 * depth + max_lost


def test_an_innocent_loss_of_the_culprits_last_siblings_solo_run_does_not_fail_it() -> None:
    """Batch of 8, A = 3, culprit 0: the runs that hold it (8, 4, 2, then it alone) die; then its last sibling 1,
    lost with it 3 times already, runs alone, and a deploy restart kills that run: 1 runs again and succeeds (it
    failed WorkerLost at once before: "killed the worker 4 times, the last time running alone")."""
    batch = Batch(8, {0}, 3, restart_solo={1})
    batch.settle()
    assert batch.state == ["failed"] + ["succeeded"] * 7, batch
    assert batch.count[1] == 4 and batch.alone[1] == 1
    assert batch.lost_runs == 3 + 3 + 1  # the culprit's: log2 8 with others + A alone; and the restart


@pytest.mark.parametrize("seed", range(300))
def test_innocent_losses_anywhere_fail_only_requests_lost_max_times_alone(seed: int) -> None:
    """Restarts at random runs (whole, or after finishing part of the run) on top of 0-2 culprits: every culprit
    fails within ceil(log2 N) + A of the lost runs that held it, and any other request fails only if it was lost
    A times running alone (else it succeeds)."""
    rng = random.Random(seed)
    size, max_lost = rng.choice([1, 2, 3, 5, 8, 13, 16, 33]), rng.choice([1, 2, 3, 5])
    culprits = set(rng.sample(range(size), rng.choice([0, 0, 1, 1, 2]) if size > 1 else rng.choice([0, 1])))
    horizon = 4 * size + 20
    innocent = {run for run in range(horizon) if rng.random() < 0.3}
    partial = {run: rng.randrange(size) for run in innocent if rng.random() < 0.5}
    batch = Batch(size, culprits, max_lost, innocent, partial)
    batch.settle()
    depth = math.ceil(math.log2(size)) if size > 1 else 0
    for i, state in enumerate(batch.state):
        assert batch.count[i] == batch.lost_holding[i] and batch.alone[i] == batch.lost_alone[i], (i, batch)
        if i in culprits:
            assert state == "failed" and batch.lost_alone[i] == max_lost, (i, batch)
            assert batch.lost_holding[i] <= depth + max_lost, (i, batch)
        elif state == "failed":
            assert batch.lost_alone[i] == max_lost, (i, batch)  # a restart hit it alone A times
        else:
            assert state == "succeeded" and batch.lost_alone[i] < max_lost, (i, batch)


@pytest.mark.parametrize("culprits", [{0, 1}, {0, 7}, {2, 3, 5}, set(range(8))])
def test_several_culprits_fail_and_only_they(culprits: set[int]) -> None:
    batch = Batch(8, culprits, 3)
    batch.settle()
    assert {i for i, s in enumerate(batch.state) if s == "failed"} == culprits
    assert all(batch.alone[i] == 3 for i in culprits)
