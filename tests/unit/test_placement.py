"""Placement (``scheduler.placement``): a batch goes to a free worker holding its model resident; with none free, to
a free worker that loads it when no worker holds it or when the load saves more than ``LOAD_MARGIN`` times its
seconds of waiting; else to no worker now (its requests wait in the scheduler)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.placement import DEFAULT_BATCH_S, LOAD_MARGIN, Holder, expected_wait_s, holders, place
from shared.contracts import ModelCapabilities, Task, WorkerCapabilities

HOT = Holder("hot", resident=True, batch_s=1.0)
COLD = Holder("cold", resident=False, load_s=3.0)
BUSY_HOT = replace(HOT, occupied=1)


def test_a_free_resident_worker_takes_the_batch_whatever_the_backlog() -> None:
    assert place([HOT, COLD], busy=0) == "hot"
    assert place([HOT, COLD], busy=3, backlog=50) == "hot"  # free now: no wait for this one
    assert place([COLD, Holder("b", resident=True), Holder("a", resident=True)], busy=0) == "a"  # ties by name


def test_a_busy_resident_worker_is_passed_over_for_a_free_one_whatever_model_occupies_it() -> None:
    # the suspicion of issue 21: "hot" runs another model's batch (busy counts none of this model's), "hot2" idles
    hot2 = Holder("hot2", resident=True)
    assert place([BUSY_HOT, hot2, COLD], busy=0) == "hot2"
    assert place([replace(BUSY_HOT, worker="a"), replace(hot2, worker="b")], busy=0) == "b"


def test_with_every_resident_worker_busy_the_batch_waits_unless_a_load_wins() -> None:
    assert place([BUSY_HOT, COLD], busy=0) is None  # no wait worth a load: the requests wait in the scheduler
    assert place([BUSY_HOT, COLD], busy=6) is None  # 6 s of wait = LOAD_MARGIN x 3 s: not over it
    assert LOAD_MARGIN * COLD.load_s == 6.0  # type: ignore[operator]
    assert place([BUSY_HOT, COLD], busy=7) == "cold"  # 7 s > 6 s: the free worker loads it
    assert place([BUSY_HOT, replace(COLD, occupied=1)], busy=70) is None  # no free worker at all
    assert place([BUSY_HOT, Holder("h2", resident=True, occupied=2)], busy=70) is None  # resident everywhere


def test_a_model_resident_nowhere_is_loaded_by_a_free_worker_of_cheapest_load() -> None:
    unknown = Holder("a-unknown", resident=False)
    slow = Holder("b-slow", resident=False, load_s=9.0)
    assert place([unknown, slow, COLD], busy=0) == "cold"
    assert place([unknown, slow, replace(COLD, occupied=1)], busy=0) == "b-slow"  # a known load first
    assert place([unknown], busy=0) == "a-unknown"
    assert place([replace(COLD, occupied=1)], busy=0) is None
    assert place([], busy=0) is None


def test_the_wait_is_shared_by_the_resident_workers() -> None:
    hot2 = Holder("hot2", resident=True, batch_s=3.0, occupied=1)
    assert expected_wait_s(7, [HOT, hot2]) == 3 * 2.0  # 7 // 2 batches ahead of each, 2 s each on average
    assert place([BUSY_HOT, hot2, COLD], busy=7) is None  # 6 s: not over the margin
    assert place([BUSY_HOT, hot2, COLD], busy=8) == "cold"  # 4 ahead x 2 s = 8 s > 6 s


def test_unknown_figures_default_and_an_unknown_load_is_never_taken_where_the_model_is_resident() -> None:
    assert expected_wait_s(3, [Holder("h", resident=True)]) == 3 * DEFAULT_BATCH_S
    assert expected_wait_s(0, []) == float("inf")
    assert place([Holder("h", resident=True, occupied=1), Holder("c", resident=False)], busy=1000) is None


@pytest.mark.parametrize("busy", [0, 3, 6])
def test_a_cold_load_is_never_chosen_below_the_margin(busy: int) -> None:
    assert place([BUSY_HOT, COLD], busy=busy) is None
    assert place([HOT, COLD], busy=busy) == "hot"


def test_the_backlog_counts_toward_a_load() -> None:
    # one batch ahead at the one resident worker (1 s) is not over 6 s; with 6 more behind it, 7 s is
    assert place([BUSY_HOT, COLD], busy=1, backlog=5) is None
    assert place([BUSY_HOT, COLD], busy=1, backlog=6) == "cold"


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
        Holder("w1", resident=True, occupied=2),
        Holder("w2", resident=False, load_s=4.0),
    ]
    assert [h.worker for h in holders("px", announced, {})] == ["w2", "w3"]
    one = WorkerCapabilities(model="sd", pipeline="P", tasks=())  # an announcement of before: resident
    assert holders("sd", {"old": one}, {}) == [Holder("old", resident=True)]


def test_a_cold_load_prefers_a_worker_whose_eviction_leaves_every_other_model_resident_somewhere() -> None:
    sole = Holder("a-sole", resident=False, load_s=1.0, sole=True)
    spare = Holder("b-spare", resident=False, load_s=3.0)
    assert place([sole, spare], busy=0) == "b-spare"  # before a cheaper load that may evict a model's last copy
    assert place([BUSY_HOT, sole, spare], busy=7) == "b-spare"
    assert place([sole, replace(spare, occupied=1)], busy=0) == "a-sole"  # the only way left


def test_holders_marks_the_only_resident_copy_of_another_model_and_the_workers_loading_this_one() -> None:
    def caps(*models: tuple[str, bool]) -> WorkerCapabilities:
        served = (ModelCapabilities(model=m, pipeline="P", tasks=(Task.TEXT_TO_IMAGE,), resident=r) for m, r in models)
        return WorkerCapabilities.of(tuple(served))

    announced = {
        "w1": caps(("sd", False), ("px", True), ("fx", True)),  # the only px
        "w2": caps(("sd", False), ("fx", True)),
        "w3": caps(("sd", True), ("px", False)),
    }
    assert [(h.worker, h.resident, h.sole) for h in holders("sd", announced, {}, loading={"w2"})] == [
        ("w1", False, True),
        ("w2", True, False),  # a batch of sd placed there loads it: resident for the next batch
        ("w3", True, False),
    ]
    assert [(h.worker, h.sole) for h in holders("px", announced, {})] == [("w1", False), ("w3", True)]  # the only sd
