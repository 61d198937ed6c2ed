"""The worker's residency (``gpu_worker.residency``): at most ``max_resident`` footprints loaded, the least recently
used evicted first, never one with a batch running or within its minimum residency; models of one source load once;
what it announces. The clock is a variable, so every case is at exact times."""

from __future__ import annotations

import pytest

from gpu_worker.residency import Footprint, NotNow, Residency, evictions, retry_after, shared_footprints


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lru(models: tuple[str, ...] = ("a", "b", "c"), *, limit: int | None = 1, min_s: float = 10.0, **kw: object):
    clock = Clock()
    log: list[str] = []

    def load(model: str) -> str:
        log.append(f"load {model}")
        clock.now += 2.0  # a load takes 2 s
        return f"pipe-{model}"

    residency: Residency[str] = Residency(
        models,
        load,
        lambda model: log.append(f"evict {model}"),
        max_resident=limit,
        min_residency_s=min_s,
        clock=clock,
        **kw,  # type: ignore[arg-type]
    )
    return residency, clock, log


def test_evictions_picks_the_least_recently_used_unpinned_footprints_past_their_residency() -> None:
    feet = {
        "old": Footprint(loaded_at=0, used_at=5),
        "busy": Footprint(loaded_at=0, used_at=1, pins=1),
        "young": Footprint(loaded_at=95, used_at=2),
        "recent": Footprint(loaded_at=0, used_at=50),
    }
    assert evictions(feet, "old", limit=1, now=100, min_residency_s=10) == []  # resident: nothing to do
    assert evictions(feet, "new", limit=5, now=100, min_residency_s=10) == []  # fits
    assert evictions(feet, "new", limit=4, now=100, min_residency_s=10) == ["old"]  # LRU, not busy nor young
    assert evictions(feet, "new", limit=3, now=100, min_residency_s=10) == ["old", "recent"]
    assert evictions(feet, "new", limit=2, now=100, min_residency_s=10) is None  # busy and young stay
    assert evictions(feet, "new", limit=2, now=105, min_residency_s=10) == ["young", "old", "recent"]  # young aged


def test_retry_after_is_when_the_first_unpinned_footprint_may_go() -> None:
    feet = {"a": Footprint(loaded_at=95, used_at=95), "b": Footprint(loaded_at=92, used_at=99, pins=1)}
    assert retry_after(feet, now=100, min_residency_s=10) == 5.0
    assert retry_after({"b": feet["b"]}, now=100, min_residency_s=10) == 0.0  # only a pin holds it


def test_warm_loads_each_model_once_and_keeps_the_last_limit() -> None:
    residency, _, log = lru(limit=2)
    residency.warm()
    assert log == ["load a", "load b", "evict a", "load c"]
    assert sorted(residency.held()) == ["b", "c"]
    states = residency.announce()
    assert [states[m].resident for m in "abc"] == [False, True, True]
    assert all(states[m].load_s == 2.0 for m in "abc")  # each load measured, the evicted one's kept


def test_a_batch_of_a_model_not_resident_loads_it_evicting_the_least_recently_used() -> None:
    residency, clock, log = lru(limit=2, min_s=0)
    residency.warm()  # b, c resident
    residency.acquire("c")
    residency.release("c", 1.0)
    clock.now += 1
    log.clear()
    assert residency.acquire("a") == "pipe-a"  # b is the least recently used (c ran since)
    assert log == ["evict b", "load a"]
    residency.release("a", 3.0)
    assert not residency.resident("b") and residency.resident("a") and residency.resident("c")


def test_a_model_with_a_batch_running_is_never_evicted() -> None:
    residency, clock, log = lru(("a", "b"), limit=1, min_s=0)
    residency.warm()  # b resident
    residency.acquire("b")  # a batch of b runs
    clock.now += 100
    with pytest.raises(NotNow) as refused:
        residency.acquire("a")
    assert refused.value.retry_after_s == 0.0
    assert residency.resident("b") and log[-1] == "load b"  # nothing evicted nor loaded
    residency.release("b")
    assert residency.acquire("a") == "pipe-a"


def test_a_model_loaded_lately_stays_for_its_minimum_residency() -> None:
    residency, clock, log = lru(("a", "b"), limit=1, min_s=10)
    residency.warm()  # b loaded at 104
    clock.now = 110.0
    with pytest.raises(NotNow) as refused:
        residency.acquire("a")
    assert refused.value.retry_after_s == pytest.approx(4.0)
    clock.now = 114.0
    assert residency.acquire("a") == "pipe-a"
    assert log[-2:] == ["evict b", "load a"]


def test_models_of_one_source_share_one_footprint() -> None:
    share = shared_footprints({"x": "/models/sd", "y": "/models/sd", "z": "demo:pixart"}, ("x", "y", "z"))
    residency, _, log = lru(("x", "y", "z"), limit=2, min_s=0, share=share)
    residency.warm()
    assert log == ["load x", "load z"]  # y is x's pipeline: loaded once, counted once
    assert residency.limit == 2 and sorted(residency.held()) == ["x", "y", "z"]


def test_no_limit_keeps_every_model_resident() -> None:
    residency, _, log = lru(limit=None)
    residency.warm()
    assert log == ["load a", "load b", "load c"] and residency.limit == 3


def test_batch_seconds_are_a_moving_average_per_model() -> None:
    residency, _, _ = lru(("a",), limit=None)
    residency.warm()
    residency.acquire("a")
    residency.release("a", 2.0)
    residency.acquire("a")
    residency.release("a", 4.0)
    assert residency.announce()["a"].batch_s == pytest.approx(2.0 + 0.3 * 2.0)


def test_a_load_that_fails_leaves_the_model_out_and_is_tried_again_next_time() -> None:
    clock = Clock()
    failures = [RuntimeError("out of memory")]

    def load(model: str) -> str:
        if model == "a" and failures:
            raise failures.pop()
        return f"pipe-{model}"

    residency: Residency[str] = Residency(
        ("a", "b"), load, lambda model: None, max_resident=1, min_residency_s=0, clock=clock
    )
    assert residency.acquire("b") == "pipe-b"
    residency.release("b")
    with pytest.raises(RuntimeError, match="out of memory"):
        residency.acquire("a")
    assert residency.held() == {}  # b was evicted for it, a is not held
    assert residency.acquire("a") == "pipe-a"
