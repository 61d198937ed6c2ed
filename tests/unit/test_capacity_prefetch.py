"""Prefetch (``scheduler.capacity``): while every worker is busy, the next batch is published before a slot frees, at
most one waiting per live worker, and only one that can grow no more (full, or closed by an incompatible request);
the scheduler's loop on fakeredis with the real scripts (Celery's publish recorded)."""

from __future__ import annotations

from typing import NamedTuple

import fakeredis
import pytest

from scheduler.capacity import prefetch_decide, prefetch_room
from scheduler.policy import Dispatch, PolicyConfig, Wait, WaitingRequest
from scheduler.store import SchedulerStore
from shared.settings import Settings
from tests.unit.test_model_routing import QueuedBatches, announce
from tests.unit.test_scheduler_service import finish_the_batch_in_flight, running, scheduler, wait_until
from tests.unit.test_scripts import submit

CONFIG = PolicyConfig(max_num_seqs=4, max_wait_s=0.02, stable_s=0.004)


class Key(NamedTuple):
    model: str = "demo"
    side: int = 64


def req(rid: str, at: float = 0.0, side: int = 64, aborted: bool = False) -> WaitingRequest:
    return WaitingRequest(rid, Key(side=side), at, aborted=aborted)


@pytest.mark.parametrize(
    ("free", "live", "room"),
    [(0, 1, 1), (-1, 1, 0), (0, 3, 3), (-2, 3, 1), (-3, 3, 0), (-1, 0, -1)],
)
def test_one_batch_waits_per_live_worker(free: int, live: int, room: int) -> None:
    # free = live - what occupies a worker: one busy worker has room for one more, never two
    assert prefetch_room(free, live) == room


def test_only_a_batch_that_can_grow_no_more_is_prefetched_whatever_the_admission_wait() -> None:
    partial = [req("a", 0.0), req("b", 0.001)]
    assert prefetch_decide(partial, 100.0, CONFIG) == Wait(None, ())  # long past max_wait: still waits
    full = [req(r) for r in "abcde"]
    assert prefetch_decide(full, 0.0, CONFIG) == Dispatch(("a", "b", "c", "d"), ())
    closed = [req("a"), req("b", side=80), req("c")]  # strict order: "b" closes the head's batch
    assert prefetch_decide(closed, 0.0, CONFIG) == Dispatch(("a",), ())
    grouped = PolicyConfig(max_num_seqs=4, max_wait_s=0.02, stable_s=0.004, grouped=True)
    assert isinstance(prefetch_decide(closed, 100.0, grouped), Wait)  # grouped: "c" may still join, nothing closes
    own = PolicyConfig(max_num_seqs=4, max_wait_s=0.0, stable_s=0.0, by_model={"demo": CONFIG})
    assert isinstance(prefetch_decide(partial, 100.0, own), Wait)  # no wait at all, a model's own knobs: the same


def test_aborted_requests_seen_are_reported() -> None:
    waiting = [req("x", aborted=True), req("a")]
    assert prefetch_decide(waiting, 100.0, CONFIG) == Wait(None, ("x",))
    assert prefetch_decide([*waiting, *(req(r) for r in "bcd")], 0.0, CONFIG) == Dispatch(("a", "b", "c", "d"), ("x",))


def test_a_busy_worker_gets_one_more_full_batch_never_two_and_the_next_once_a_slot_frees() -> None:
    """Before prefetch a batch was published only once a slot was free: the worker's next forward waited for the
    scheduler's round trip (docs/benchmarks.md, gap)."""
    settings = Settings(key_prefix="t", max_num_seqs=4, request_batch_max_wait_ms=20, scheduler_lease_ms=600)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    celery = QueuedBatches()

    def batches() -> list[list[str]]:
        return [message["request_ids"] for _, message in celery.sent]

    with running(scheduler(client, settings, celery)):  # type: ignore[arg-type]
        announce(client, store, "w", "demo")
        submit(client, store.keys, "a0")
        assert wait_until(lambda: batches() == [["a0"]], 5), batches()  # a free worker: after the admission wait
        submit(client, store.keys, "b0", "b1")
        assert not wait_until(lambda: len(batches()) > 1, 0.4), batches()  # busy: a partial batch waits
        submit(client, store.keys, "b2", "b3", "c0", "c1", "c2", "c3", "d0")
        assert wait_until(lambda: len(batches()) == 2, 5), batches()
        assert not wait_until(lambda: len(batches()) > 2, 0.4), batches()  # one waits for the worker, never two
        assert batches()[1] == ["b0", "b1", "b2", "b3"]
        assert {queue for queue, _ in celery.sent} == {"t.batches"}  # the model's queue: held by no worker
        finish_the_batch_in_flight(client, store)  # the first batch's slot frees: the second now occupies it
        client.xadd(store.keys.events, {"type": "batch_done"})
        assert wait_until(lambda: len(batches()) == 3, 5), batches()
        assert batches()[2] == ["c0", "c1", "c2", "c3"]
        assert not wait_until(lambda: len(batches()) > 3, 0.4), batches()
        announce(client, store, "w2", "demo")  # it takes the waiting batch; one more may wait for the two of them
        submit(client, store.keys, "e0", "e1", "e2", "e3")
        assert wait_until(lambda: len(batches()) == 4, 5), batches()
        assert not wait_until(lambda: len(batches()) > 4, 0.4), batches()
    assert batches()[3] == ["d0", "e0", "e1", "e2"]


def test_the_fair_order_prefetches_nothing() -> None:
    """Its flows share a level: a batch closed as soon as it is full would spread a light flow's requests over
    several batches instead of the one it joins when a slot frees (tests/integration/test_fair_sharing.py)."""
    settings = Settings(key_prefix="t", max_num_seqs=4, scheduler_lease_ms=600, scheduling_policy="fair")
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    celery = QueuedBatches()
    with running(scheduler(client, settings, celery)):  # type: ignore[arg-type]
        announce(client, store, "w", "demo")
        submit(client, store.keys, "a0", "a1", "a2", "a3")
        assert wait_until(lambda: len(celery.sent) == 1, 5), celery.sent
        submit(client, store.keys, "b0", "b1", "b2", "b3")
        assert not wait_until(lambda: len(celery.sent) > 1, 0.4), celery.sent
