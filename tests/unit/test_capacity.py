"""Each model's room and its own batches (``scheduler.capacity``): what occupies each worker says where a model's
next batch may go, and the policy looks at one model's requests at a time, so another model's request neither
closes nor joins the head's batch."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from scheduler.capacity import ModelSlots, by_model, decide_by_model
from scheduler.policy import Dispatch, PolicyConfig, Wait, WaitingRequest, decide
from shared.contracts import ModelCapabilities, Task, WorkerCapabilities

CONFIG = PolicyConfig(max_num_seqs=4, max_wait_s=0.02, stable_s=0.004)


class Key(NamedTuple):
    """A compatibility key of the tests: its model, and a size that also keeps batches apart."""

    model: str
    side: int = 64


def req(rid: str, model: str, at: float = 0.0, side: int = 64, aborted: bool = False) -> WaitingRequest:
    return WaitingRequest(rid, Key(model, side), at, aborted=aborted)


def worker(*resident: str, cold: tuple[str, ...] = ()) -> WorkerCapabilities:
    models = [(m, True) for m in resident] + [(m, False) for m in cold]
    return WorkerCapabilities.of(
        tuple(
            ModelCapabilities(model=m, pipeline="P", tasks=(Task.TEXT_TO_IMAGE,), resident=r, load_s=3.0, batch_s=1.0)
            for m, r in models
        )
    )


def test_a_model_has_room_while_a_worker_holding_it_is_free_whatever_model_occupies_the_others() -> None:
    announced = {"w1": worker("sd", "px"), "w2": worker("sd", "px"), "w3": worker("px", cold=("sd",))}
    slots = ModelSlots.count(announced, {"b1": "px", "b2": None, "gone": "sd"}, {"b1": "w1", "b9": "w2"})
    assert slots.occupied == {"w1": 1}  # b2's worker is unknown, b9 left flight, "gone" was never placed
    assert slots.busy == {"px": 1, "sd": 1}
    assert (slots.target("sd"), slots.target("px"), slots.target("other"), slots.target(None)) == (
        "w2",
        "w2",
        None,
        None,
    )
    slots.take("sd", "w2")
    assert slots.target("sd") is None  # w3 could load it, but the wait at w1, w2 (2 batches // 2 x 1 s) is short
    assert slots.target("sd", backlog=12) == "w3"  # 14 // 2 x 1 s = 7 s > 2 x 3 s: w3 loads sd
    assert slots.has_room("px") and not slots.has_room("sd")
    slots.take("px", "w3")
    assert not slots.has_room("px") and not slots.has_room("sd", backlog=12)
    slots.take("px", None)  # a batch on its model's queue: its model's, no worker known
    assert slots.busy["px"] == 3 and sum(slots.occupied.values()) == 3


def test_by_model_keeps_each_models_order_and_the_models_in_the_order_of_their_first_request() -> None:
    waiting = [req("a0", "a"), req("b0", "b"), req("a1", "a"), req("c0", "c"), req("b1", "b")]
    assert [[r.id for r in lane] for lane in by_model(waiting)] == [["a0", "a1"], ["b0", "b1"], ["c0"]]
    assert by_model([]) == []


def test_another_models_request_neither_closes_the_heads_batch_nor_joins_it() -> None:
    waiting = [req("a0", "a"), req("b0", "b"), req("a1", "a"), req("b1", "b"), req("a2", "a"), req("a3", "a")]
    # one decision over every model: the strict order closes a0's batch at b0 (a batch of one)
    assert decide(waiting, 1, 0.0, CONFIG) == Dispatch(("a0",), ())
    # by model: a's four requests make a full batch at once
    assert decide_by_model(waiting, 1, 0.0, CONFIG) == Dispatch(("a0", "a1", "a2", "a3"), ())


def test_the_strict_order_holds_within_a_model() -> None:
    waiting = [req("a0", "a"), req("b0", "b"), req("a1", "a", side=80), req("a2", "a")]
    assert decide_by_model(waiting, 1, 0.0, CONFIG) == Dispatch(("a0",), ())  # a1 is another size of a's


def test_a_model_still_waiting_lets_the_next_model_dispatch_and_the_earliest_wait_is_kept() -> None:
    waiting = [req("a0", "a", at=1.0), req("b0", "b", at=0.0), *(req(f"b{i}", "b", at=0.0) for i in (1, 2, 3))]
    assert decide_by_model(waiting, 1, 1.0, CONFIG) == Dispatch(("b0", "b1", "b2", "b3"), ())  # a0 still waits
    two = [req("a0", "a", at=1.0), req("b0", "b", at=0.998)]
    wait = decide_by_model(two, 1, 1.0, CONFIG)
    assert isinstance(wait, Wait) and wait.until == pytest.approx(0.998 + 0.004)  # b0's wait ends first
    assert decide_by_model(two, 0, 1.0, CONFIG) == Wait(None, ())  # no free slot
    assert decide_by_model(two, 1, 2.0, CONFIG) == Dispatch(("a0",), ())  # both due: the first model's first


def test_aborted_requests_are_reported_across_the_models_looked_at() -> None:
    waiting = [req("a0", "a", at=1.0), req("x", "b", aborted=True), req("b0", "b"), req("b1", "b")]
    waiting += [req("b2", "b"), req("b3", "b"), req("y", "c", aborted=True)]
    assert decide_by_model(waiting, 1, 1.0, CONFIG) == Dispatch(("b0", "b1", "b2", "b3"), ("x",))
    wait = decide_by_model(waiting[:2], 1, 1.0, CONFIG)
    assert isinstance(wait, Wait) and wait.dropped_ids == ("x",)
    assert wait.until == pytest.approx(1.0 + 0.004)


def test_a_model_resident_nowhere_is_loaded_by_one_worker_not_by_every_free_one() -> None:
    announced = {name: worker("px", cold=("sd",)) for name in ("w1", "w2", "w3")}
    slots = ModelSlots.count(announced, {}, {})
    assert slots.target("sd") == "w1"  # the only way: a cold load
    slots.take("sd", "w1")
    assert slots.target("sd") is None  # w1 loads it: the next batch waits for w1 (a short wait), not a second load
    assert slots.target("sd", backlog=6) == "w2"  # 7 batches x 1 s at w1 > 2 x 3 s: a second load wins
    counted = ModelSlots.count(announced, {"b1": "sd"}, {"b1": "w1"})  # the same, counted again from Redis
    assert counted.target("sd") is None and counted.target("px") == "w2"
