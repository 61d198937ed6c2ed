"""Placement (``scheduler.placement``): a batch goes to a worker holding its model resident unless a cold load
saves more than ``LOAD_MARGIN`` times its seconds of waiting; with no choice to make (every worker of the model holds
it, or none does) it goes to the model's queue."""

from __future__ import annotations

import pytest

from scheduler.placement import DEFAULT_BATCH_S, LOAD_MARGIN, Holder, expected_wait_s, holders, place
from shared.contracts import ModelCapabilities, Task, WorkerCapabilities

HOT = Holder("hot", resident=True, batch_s=1.0)
COLD = Holder("cold", resident=False, load_s=3.0)


def test_no_choice_to_make_is_the_models_queue() -> None:
    assert place([HOT, Holder("hot2", resident=True)], busy=10) is None  # every worker holds it
    assert place([COLD], busy=0) is None  # none does: a cold load is the only way
    assert place([], busy=0) is None


def test_a_resident_worker_wins_while_the_wait_there_is_under_the_margin_of_a_load() -> None:
    assert place([HOT, COLD], busy=0) == "hot"  # idle resident worker: no wait
    assert place([HOT, COLD], busy=6) == "hot"  # 6 s of wait = LOAD_MARGIN x 3 s: not over it
    assert LOAD_MARGIN * COLD.load_s == 6.0  # type: ignore[operator]


def test_a_cold_load_wins_once_the_wait_exceeds_the_margin() -> None:
    assert place([HOT, COLD], busy=7) is None  # 7 s of wait > 6: the model's queue, where the cold worker loads it


def test_the_wait_is_shared_by_the_resident_workers() -> None:
    hot2 = Holder("hot2", resident=True, batch_s=3.0)
    assert expected_wait_s(7, [HOT, hot2]) == 3 * 2.0  # 7 // 2 batches ahead of each, 2 s each on average
    assert place([HOT, hot2, COLD], busy=7) == "hot"  # 6 s: not over the margin
    assert place([HOT, hot2, COLD], busy=8) is None  # 4 ahead x 2 s = 8 s > 6 s


def test_unknown_figures_default_and_an_unknown_load_is_never_taken() -> None:
    assert expected_wait_s(3, [Holder("h", resident=True)]) == 3 * DEFAULT_BATCH_S
    assert expected_wait_s(0, []) == float("inf")
    assert place([Holder("h", resident=True), Holder("c", resident=False)], busy=1000) == "h"


def test_the_resident_worker_with_the_fewest_placed_batches_is_chosen() -> None:
    a = Holder("a", resident=True, placed=2)
    b = Holder("b", resident=True, placed=1)
    c = Holder("c", resident=True, placed=1)
    assert place([a, b, c, COLD], busy=0) == "b"  # fewest, ties by name


@pytest.mark.parametrize("busy", [0, 3, 6])
def test_a_cold_load_is_never_chosen_below_the_margin(busy: int) -> None:
    assert place([HOT, COLD], busy=busy) == "hot"


def test_holders_reads_each_workers_announcement() -> None:
    def caps(model: str, resident: bool, load_s: float | None = None) -> ModelCapabilities:
        return ModelCapabilities(
            model=model, pipeline="P", tasks=(Task.TEXT_TO_IMAGE,), resident=resident, load_s=load_s
        )

    announced = {
        "w2": WorkerCapabilities.of((caps("sd", False, 4.0), caps("px", True))),
        "w1": WorkerCapabilities.of((caps("sd", True),)),
        "w3": WorkerCapabilities.of((caps("px", True),)),
    }
    assert holders("sd", announced, {"w1": 2}) == [
        Holder("w1", resident=True, placed=2),
        Holder("w2", resident=False, load_s=4.0),
    ]
    assert [h.worker for h in holders("px", announced, {})] == ["w2", "w3"]
    one = WorkerCapabilities(model="sd", pipeline="P", tasks=())  # an announcement of before: resident
    assert holders("sd", {"old": one}, {}) == [Holder("old", resident=True)]


def test_a_backlog_counts_once_no_resident_worker_is_free() -> None:
    # a resident worker free now takes the batch whatever waits behind it (the next batches see it busy)
    assert place([HOT, COLD], busy=0, backlog=50) == "hot"
    # busy: one batch ahead at the one resident worker (1 s) is not over 6 s; with 6 more behind, 7 s is
    assert place([HOT, COLD], busy=1, backlog=5) == "hot"
    assert place([HOT, COLD], busy=1, backlog=6) is None
