"""The pure batching policy: prefix rule, cap, each exit of the admission wait at exact clocks, aborts."""

from __future__ import annotations

import pytest

from scheduler.policy import Dispatch, PolicyConfig, Wait, WaitingRequest, decide
from shared.settings import Settings

# Dyadic values: every sum below is exact in binary floating point.
CFG = PolicyConfig(max_num_seqs=4, max_wait_s=0.5, stable_s=0.125)
TICK = 1.0 / 1024


def req(id: str, key: str = "a", at: float = 0.0, aborted: bool = False) -> WaitingRequest:
    return WaitingRequest(id=id, key=key, arrived_at=at, aborted=aborted)


# --- nothing to do ------------------------------------------------------------------------------------------


def test_empty_waits_for_input() -> None:
    assert decide([], free_slots=1, now=0.0, config=CFG) == Wait(until=None, dropped_ids=())


def test_no_free_slot_waits_even_with_full_batch() -> None:
    waiting = [req(f"r{i}") for i in range(4)]
    assert decide(waiting, free_slots=0, now=10.0, config=CFG) == Wait(until=None, dropped_ids=())
    assert decide(waiting, free_slots=-1, now=10.0, config=CFG) == Wait(until=None, dropped_ids=())
    assert decide(waiting, free_slots=1, now=10.0, config=CFG) == Dispatch(("r0", "r1", "r2", "r3"), ())


def test_no_free_slot_still_reports_dropped() -> None:
    waiting = [req("x", aborted=True), req("r0")]
    assert decide(waiting, free_slots=0, now=0.0, config=CFG) == Wait(until=None, dropped_ids=("x",))


# --- candidate batch ----------------------------------------------------------------------------------------


def test_prefix_stops_at_first_incompatible() -> None:
    waiting = [req("a0"), req("a1"), req("b0", key="b"), req("a2"), req("a3")]
    # a2 and a3 are compatible with the head but b0 blocks them; the batch is closed, so no wait.
    assert decide(waiting, free_slots=1, now=0.0, config=CFG) == Dispatch(("a0", "a1"), ())


def test_incompatible_head_right_after_dispatch() -> None:
    waiting = [req("b0", key="b"), req("a0"), req("a1")]
    assert decide(waiting, free_slots=1, now=0.0, config=CFG) == Dispatch(("b0",), ())


def test_closed_batch_dispatches_without_waiting() -> None:
    waiting = [req("a0", at=1.0), req("b0", key="b", at=1.0)]
    assert decide(waiting, free_slots=1, now=1.0, config=CFG) == Dispatch(("a0",), ())


def test_cap_at_max_num_seqs() -> None:
    waiting = [req(f"r{i}") for i in range(7)]
    assert decide(waiting, free_slots=3, now=0.0, config=CFG) == Dispatch(("r0", "r1", "r2", "r3"), ())


def test_max_num_seqs_one_dispatches_each_at_once() -> None:
    cfg = PolicyConfig(max_num_seqs=1, max_wait_s=0.5, stable_s=0.125)
    assert decide([req("r0"), req("r1")], free_slots=1, now=0.0, config=cfg) == Dispatch(("r0",), ())


# --- exits of the admission wait ----------------------------------------------------------------------------


def test_full_batch_dispatches_at_once() -> None:
    waiting = [req("r0", at=2.0), req("r1", at=2.0), req("r2", at=2.0)]
    assert decide(waiting, free_slots=1, now=2.0, config=CFG) == Wait(until=2.125, dropped_ids=())
    waiting.append(req("r3", at=2.0))
    assert decide(waiting, free_slots=1, now=2.0, config=CFG) == Dispatch(("r0", "r1", "r2", "r3"), ())


def test_stable_window_elapsed() -> None:
    waiting = [req("r0", at=1.0), req("r1", at=1.0625)]
    deadline = 1.0625 + 0.125
    assert deadline == 1.1875
    assert decide(waiting, free_slots=1, now=1.0625, config=CFG) == Wait(until=1.1875, dropped_ids=())
    assert decide(waiting, free_slots=1, now=1.1875 - TICK, config=CFG) == Wait(until=1.1875, dropped_ids=())
    assert decide(waiting, free_slots=1, now=1.1875, config=CFG) == Dispatch(("r0", "r1"), ())
    assert decide(waiting, free_slots=1, now=5.0, config=CFG) == Dispatch(("r0", "r1"), ())


def test_new_arrival_extends_stable_window() -> None:
    waiting = [req("r0", at=1.0)]
    assert decide(waiting, free_slots=1, now=1.0, config=CFG) == Wait(until=1.125, dropped_ids=())
    waiting.append(req("r1", at=1.0625))
    assert decide(waiting, free_slots=1, now=1.0625, config=CFG) == Wait(until=1.1875, dropped_ids=())


def test_max_wait_elapsed_while_arrivals_keep_coming() -> None:
    cfg = PolicyConfig(max_num_seqs=256, max_wait_s=0.5, stable_s=0.125)
    step = 1.0 / 256  # an arrival every ~4 ms: the quiet window never elapses
    waiting = [req("r0", at=3.0)]
    now = 3.0
    while now + step < 3.5:
        now += step
        waiting.append(req(f"r{len(waiting)}", at=now))
        decision = decide(waiting, free_slots=1, now=now, config=cfg)
        # The stable deadline (now + 0.125) is capped by the head's max wait (3.5).
        assert decision == Wait(until=min(3.5, now + 0.125), dropped_ids=())
    assert now == 3.5 - step
    assert decide(waiting, free_slots=1, now=3.5 - TICK, config=cfg) == Wait(until=3.5, dropped_ids=())
    ids = tuple(r.id for r in waiting)
    assert len(ids) == 128
    assert decide(waiting, free_slots=1, now=3.5, config=cfg) == Dispatch(ids, ())


def test_zero_max_wait_dispatches_immediately() -> None:
    cfg = PolicyConfig(max_num_seqs=4, max_wait_s=0.0, stable_s=0.0)
    assert decide([req("r0", at=7.0)], free_slots=1, now=7.0, config=cfg) == Dispatch(("r0",), ())
    waiting = [req("r0", at=7.0), req("r1", at=7.0)]
    assert decide(waiting, free_slots=1, now=7.0, config=cfg) == Dispatch(("r0", "r1"), ())


# --- aborts -------------------------------------------------------------------------------------------------


def test_aborted_head_is_skipped_and_dropped() -> None:
    waiting = [req("x", at=0.0, aborted=True), req("r0", at=1.0), req("r1", at=1.0)]
    # The wait is timed from the first live request, not from the aborted one.
    assert decide(waiting, free_slots=1, now=1.0, config=CFG) == Wait(until=1.125, dropped_ids=("x",))
    assert decide(waiting, free_slots=1, now=1.125, config=CFG) == Dispatch(("r0", "r1"), ("x",))


def test_aborted_incompatible_in_middle_does_not_block() -> None:
    waiting = [req("a0"), req("b0", key="b", aborted=True), req("a1"), req("a2"), req("a3")]
    assert decide(waiting, free_slots=1, now=0.0, config=CFG) == Dispatch(("a0", "a1", "a2", "a3"), ("b0",))


def test_aborted_does_not_close_or_extend_the_batch() -> None:
    waiting = [req("a0", at=1.0), req("b0", key="b", at=1.0625, aborted=True)]
    # Not closed by b0, and b0's later arrival does not push the stable deadline.
    assert decide(waiting, free_slots=1, now=1.0625, config=CFG) == Wait(until=1.125, dropped_ids=("b0",))


def test_only_aborted_waits_for_input_and_drops_all() -> None:
    waiting = [req("x0", aborted=True), req("x1", key="b", aborted=True)]
    assert decide(waiting, free_slots=1, now=0.0, config=CFG) == Wait(until=None, dropped_ids=("x0", "x1"))


# --- config -------------------------------------------------------------------------------------------------


def test_from_settings() -> None:
    budget = Settings().max_batch_pixels
    cfg = PolicyConfig.from_settings(Settings(max_num_seqs=8, request_batch_max_wait_ms=500.0))
    assert cfg == PolicyConfig(max_num_seqs=8, max_wait_s=0.5, stable_s=0.05, max_batch_cost=budget)
    short = PolicyConfig.from_settings(Settings(max_num_seqs=2, request_batch_max_wait_ms=125.0))
    assert short == PolicyConfig(max_num_seqs=2, max_wait_s=0.125, stable_s=0.025, max_batch_cost=budget)
    off = PolicyConfig.from_settings(Settings(max_batch_pixels=4096))
    assert off == PolicyConfig(max_num_seqs=1, max_wait_s=0.0, stable_s=0.0, max_batch_cost=4096)


# --- pixel budget -------------------------------------------------------------------------------------------

BUDGET = PolicyConfig(max_num_seqs=4, max_wait_s=0.5, stable_s=0.125, max_batch_cost=100)


def costly(id: str, cost: int, at: float = 0.0) -> WaitingRequest:
    return WaitingRequest(id=id, key=("size", cost), arrived_at=at, cost=cost)


def test_budget_closes_the_batch_before_it_would_exceed() -> None:
    waiting = [costly(f"r{i}", 40) for i in range(4)]
    # 3 x 40 > 100: the batch is full at two, so it goes at once (no admission wait)
    assert decide(waiting, free_slots=1, now=0.0, config=BUDGET) == Dispatch(("r0", "r1"), ())


def test_budget_exactly_met_is_full() -> None:
    waiting = [costly(f"r{i}", 25) for i in range(6)]
    assert decide(waiting, free_slots=1, now=0.0, config=BUDGET) == Dispatch(("r0", "r1", "r2", "r3"), ())


def test_request_over_budget_alone_still_runs_alone() -> None:
    waiting = [costly("big", 150), costly("big2", 150)]
    assert decide(waiting, free_slots=1, now=0.0, config=BUDGET) == Dispatch(("big",), ())


def test_budget_below_cap_still_waits_for_a_fuller_batch() -> None:
    waiting = [costly("r0", 40, at=1.0)]
    assert decide(waiting, free_slots=1, now=1.0, config=BUDGET) == Wait(until=1.125, dropped_ids=())


def kneed(id: str, knee: int | None, cost: int = 1) -> WaitingRequest:
    return WaitingRequest(id=id, key="a", arrived_at=0.0, cost=cost, knee=knee)


def test_a_knee_caps_the_batch_and_a_full_batch_goes_at_once() -> None:
    waiting = [kneed(f"r{i}", 2) for i in range(4)]
    assert decide(waiting, free_slots=1, now=0.0, config=CFG) == Dispatch(("r0", "r1"), ())


def test_a_knee_above_max_num_seqs_changes_nothing() -> None:
    waiting = [kneed(f"r{i}", 16) for i in range(6)]
    assert decide(waiting, free_slots=1, now=0.0, config=CFG) == Dispatch(("r0", "r1", "r2", "r3"), ())
    assert CFG.cap(kneed("r", None)) == CFG.cap(kneed("r", 16)) == 4


def test_the_lower_of_knee_and_budget_caps() -> None:
    assert BUDGET.cap(kneed("r", 3, cost=40)) == 2 and BUDGET.cap(kneed("r", 1, cost=10)) == 1
    assert BUDGET.cap(kneed("r", 0, cost=10)) == 1  # never below one


@pytest.mark.parametrize(
    ("max_num_seqs", "max_wait_s", "stable_s"),
    [(0, 0.5, 0.125), (1, -0.5, 0.125), (1, 0.5, -0.125)],
)
def test_invalid_config_rejected(max_num_seqs: int, max_wait_s: float, stable_s: float) -> None:
    with pytest.raises(ValueError):
        PolicyConfig(max_num_seqs=max_num_seqs, max_wait_s=max_wait_s, stable_s=stable_s)


# --- grouped order (FUSEFLEET_BATCH_ORDER=grouped) ----------------------------------------------------------

GROUPED = PolicyConfig(max_num_seqs=4, max_wait_s=0.5, stable_s=0.125, grouped=True)


def test_grouped_skips_incompatible_requests_but_keeps_the_head_first() -> None:
    waiting = [req("a0"), req("b0", key="b"), req("a1"), req("b1", key="b"), req("a2"), req("a3"), req("a4")]
    assert decide(waiting, free_slots=1, now=0.0, config=GROUPED) == Dispatch(("a0", "a1", "a2", "a3"), ())
    rest = [r for r in waiting if r.id not in ("a0", "a1", "a2", "a3")]
    # the next batch starts at the oldest remaining request: b0, which waited longest
    assert decide(rest, free_slots=1, now=1.0, config=GROUPED) == Dispatch(("b0", "b1"), ())


def test_grouped_batch_is_not_closed_by_an_incompatible_request() -> None:
    waiting = [req("a0", at=1.0), req("b0", key="b", at=1.0), req("b1", key="b", at=1.0625)]
    # b1 arrived later but cannot join a0's batch: only a0's own arrival starts the quiet window
    assert decide(waiting, free_slots=1, now=1.0, config=GROUPED) == Wait(until=1.125, dropped_ids=())
    assert decide(waiting, free_slots=1, now=1.125, config=GROUPED) == Dispatch(("a0",), ())


def test_grouped_from_settings() -> None:
    assert PolicyConfig.from_settings(Settings(batch_order="grouped")).grouped
    assert not PolicyConfig.from_settings(Settings()).grouped


# --- levels (scheduler.queue: the window comes in service order, highest level first) ----------------------


def lvl(id: str, level: int, key: str = "a", at: float = 0.0, aborted: bool = False) -> WaitingRequest:
    return WaitingRequest(id=id, key=key, arrived_at=at, aborted=aborted, level=level)


def test_a_batch_holds_the_head_level_only() -> None:
    waiting = [lvl("h0", 2), lvl("h1", 2), lvl("n0", 0), lvl("n1", 0)]
    # compatible lower-level requests do not ride along; the high batch is not full, so it waits for more of its level
    assert decide(waiting, free_slots=1, now=0.0, config=CFG) == Wait(until=0.125, dropped_ids=())
    assert decide(waiting, free_slots=1, now=0.125, config=CFG) == Dispatch(("h0", "h1"), ())
    no_wait = PolicyConfig(max_num_seqs=4, max_wait_s=0.0, stable_s=0.0)
    assert decide(waiting, free_slots=1, now=0.0, config=no_wait) == Dispatch(("h0", "h1"), ())


def test_a_lower_level_neither_closes_nor_extends_a_higher_batch() -> None:
    # n0 is incompatible but of a lower level: it does not close h0's batch (a later h could still join), and its
    # later arrival does not extend h0's quiet window
    waiting = [lvl("h0", 1, at=1.0), lvl("n0", 0, key="b", at=1.0625)]
    assert decide(waiting, free_slots=1, now=1.0, config=CFG) == Wait(until=1.125, dropped_ids=())


def test_an_incompatible_request_of_the_same_level_still_closes_the_batch() -> None:
    waiting = [lvl("h0", 1), lvl("h1", 1, key="b"), lvl("h2", 1), lvl("n0", 0)]
    assert decide(waiting, free_slots=1, now=0.0, config=CFG) == Dispatch(("h0",), ())


def test_an_aborted_head_hands_the_batch_to_the_next_live_level() -> None:
    waiting = [lvl("h0", 2, aborted=True), lvl("n0", 0), lvl("n1", 0), lvl("n2", 0), lvl("n3", 0)]
    assert decide(waiting, free_slots=1, now=0.0, config=CFG) == Dispatch(("n0", "n1", "n2", "n3"), ("h0",))


def test_grouped_skips_within_the_head_level_only() -> None:
    waiting = [lvl("h0", 1), lvl("h1", 1, key="b"), lvl("h2", 1), lvl("n0", 0), lvl("n1", 0), lvl("n2", 0)]
    assert decide(waiting, free_slots=1, now=0.5, config=GROUPED) == Dispatch(("h0", "h2"), ())
