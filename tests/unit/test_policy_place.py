"""Step mode's pure placement (``scheduler.policy.place``): which waiting requests join which open running set."""

from __future__ import annotations

from scheduler.policy import Join, OpenSet, PolicyConfig, WaitingRequest, place

STRICT = PolicyConfig(max_num_seqs=4, max_wait_s=0.5, stable_s=0.125)
GROUPED = PolicyConfig(max_num_seqs=4, max_wait_s=0.5, stable_s=0.125, grouped=True)


def req(id: str, key: str = "a", level: int = 0, aborted: bool = False, cost: int = 1) -> WaitingRequest:
    return WaitingRequest(id=id, key=key, arrived_at=0.0, aborted=aborted, cost=cost, level=level)


def test_joins_the_open_set_of_the_heads_key() -> None:
    waiting = [req("a0"), req("a1"), req("a2")]
    sets = [OpenSet("w1", "b", 0), OpenSet("w2", "a", 1)]
    assert place(waiting, sets, STRICT) == Join("w2", ("a0", "a1", "a2"), ())


def test_no_set_no_head_or_no_set_of_the_key_answers_none() -> None:
    assert place([req("a0")], [], STRICT) is None
    assert place([], [OpenSet("w1", "a", 0)], STRICT) is None
    assert place([req("x", aborted=True)], [OpenSet("w1", "a", 0)], STRICT) is None
    assert place([req("a0")], [OpenSet("w1", "b", 0)], STRICT) is None


def test_room_is_cap_less_rows() -> None:
    waiting = [req(f"a{i}") for i in range(6)]
    assert place(waiting, [OpenSet("w1", "a", 3)], STRICT) == Join("w1", ("a0",), ())
    assert place(waiting, [OpenSet("w1", "a", 0)], STRICT) == Join("w1", ("a0", "a1", "a2", "a3"), ())
    assert place(waiting, [OpenSet("w1", "a", 4)], STRICT) is None  # full
    assert place(waiting, [OpenSet("w1", "a", 9)], STRICT) is None  # over (another scheduler's join)


def test_the_pixel_budget_lowers_the_cap() -> None:
    config = PolicyConfig(max_num_seqs=8, max_wait_s=0.5, stable_s=0.125, max_batch_cost=12)
    waiting = [req(f"a{i}", cost=4) for i in range(5)]  # cap 12 // 4 = 3 requests
    assert place(waiting, [OpenSet("w1", "a", 1)], config) == Join("w1", ("a0", "a1"), ())
    assert place(waiting, [OpenSet("w1", "a", 3)], config) is None


def test_strict_stops_at_the_first_incompatible_request() -> None:
    waiting = [req("a0"), req("b0", key="b"), req("a1")]
    assert place(waiting, [OpenSet("w1", "a", 0)], STRICT) == Join("w1", ("a0",), ())


def test_grouped_skips_incompatible_requests() -> None:
    waiting = [req("a0"), req("b0", key="b"), req("a1"), req("b1", key="b"), req("a2")]
    assert place(waiting, [OpenSet("w1", "a", 0)], GROUPED) == Join("w1", ("a0", "a1", "a2"), ())
    assert place(waiting, [OpenSet("w1", "a", 2)], GROUPED) == Join("w1", ("a0", "a1"), ())


def test_levels_never_mix() -> None:
    waiting = [req("h0", level=2), req("l0", level=0), req("h1", level=2)]
    assert place(waiting, [OpenSet("w1", "a", 0)], STRICT) == Join("w1", ("h0", "h1"), ())
    # a lower level's request neither joins nor closes the higher level's batch, even in strict order
    waiting = [req("h0", level=2), req("l0", key="b", level=0), req("h1", level=2)]
    assert place(waiting, [OpenSet("w1", "a", 0)], STRICT) == Join("w1", ("h0", "h1"), ())


def test_sealed_sets_take_no_joins() -> None:
    waiting = [req("a0")]
    assert place(waiting, [OpenSet("w1", "a", 0, sealed=True)], STRICT) is None
    sets = [OpenSet("w1", "a", 0, sealed=True), OpenSet("w2", "a", 3)]
    assert place(waiting, sets, STRICT) == Join("w2", ("a0",), ())


def test_aborted_requests_are_dropped_and_never_join() -> None:
    waiting = [req("x0", aborted=True), req("a0"), req("x1", aborted=True), req("a1")]
    assert place(waiting, [OpenSet("w1", "a", 0)], STRICT) == Join("w1", ("a0", "a1"), ("x0", "x1"))
    # an aborted incompatible request does not close a strict batch
    waiting = [req("a0"), req("b0", key="b", aborted=True), req("a1")]
    assert place(waiting, [OpenSet("w1", "a", 0)], STRICT) == Join("w1", ("a0", "a1"), ("b0",))


def test_picks_the_set_with_the_most_room_then_the_lowest_worker_name() -> None:
    waiting = [req("a0")]
    sets = [OpenSet("w3", "a", 2), OpenSet("w2", "a", 1), OpenSet("w9", "b", 0)]
    assert place(waiting, sets, STRICT) == Join("w2", ("a0",), ())
    tied = [OpenSet("w3", "a", 1), OpenSet("w1", "a", 1), OpenSet("w2", "a", 1)]
    assert place(waiting, tied, STRICT) == Join("w1", ("a0",), ())
    assert place(waiting, list(reversed(tied)), STRICT) == Join("w1", ("a0",), ())
