"""The scheduler's request queues (pure): service order of each policy, removal, and deadline expiry."""

from __future__ import annotations

from typing import get_args

import pytest

from scheduler.policy import Dispatch, PolicyConfig, WaitingRequest, decide
from scheduler.queue import QUEUES, FcfsQueue, PriorityQueue, QueuedRequest, RequestQueue
from shared.settings import SchedulingPolicy, Settings


def queued(id: str, priority: int = 0, deadline: float | None = None, key: str = "a") -> QueuedRequest:
    return QueuedRequest(id=id, entry_id=f"e-{id}", key=key, arrived_at=0.0, priority=priority, deadline=deadline)


def ids(queue: RequestQueue, n: int = 100) -> list[str]:
    return [r.id for r in queue.head(n)]


def fill(queue: RequestQueue, *requests: QueuedRequest) -> RequestQueue:
    for request in requests:
        queue.add(request)
    return queue


# --- order ------------------------------------------------------------------------------------------------------


def test_priority_serves_the_highest_level_first_and_fifo_within_a_level() -> None:
    queue = fill(
        PriorityQueue(),
        queued("n0"),
        queued("low0", -2),
        queued("n1"),
        queued("h0", 2),
        queued("m0", 1),
        queued("h1", 2),
        queued("n2"),
        queued("low1", -2),
    )
    assert ids(queue) == ["h0", "h1", "m0", "n0", "n1", "n2", "low0", "low1"]
    assert ids(queue, 3) == ["h0", "h1", "m0"]
    assert [queue.level(r) for r in queue.head(100)] == [2, 2, 1, 0, 0, 0, -2, -2]


def test_fcfs_ignores_priorities() -> None:
    queue = fill(FcfsQueue(), queued("n0"), queued("h0", 2), queued("low0", -2), queued("n1"))
    assert ids(queue) == ["n0", "h0", "low0", "n1"]
    assert {queue.level(r) for r in queue.head(100)} == {0}


@pytest.mark.parametrize("kind", [FcfsQueue, PriorityQueue])
def test_with_one_level_both_are_the_arrival_order(kind: type[RequestQueue]) -> None:
    queue = fill(kind(), *(queued(f"r{i}") for i in range(6)))
    assert ids(queue) == [f"r{i}" for i in range(6)]


def test_removing_keeps_the_order_of_the_rest_and_empties_levels() -> None:
    queue = fill(PriorityQueue(), queued("h0", 2), queued("n0"), queued("h1", 2), queued("n1"))
    assert queue.remove("h0") == queued("h0", 2)
    assert queue.remove("h0") is None
    assert queue.remove("h1") is not None
    assert ids(queue) == ["n0", "n1"]
    assert len(queue) == 2 and "n0" in queue and "h1" not in queue
    queue.add(queued("h2", 2))  # the emptied level comes back first
    assert ids(queue) == ["h2", "n0", "n1"]


def test_a_request_added_again_is_replaced_not_duplicated() -> None:
    queue = fill(PriorityQueue(), queued("a"), queued("b"))
    queue.add(queued("a", 1))
    assert ids(queue) == ["a", "b"] and len(queue) == 2
    assert queue.get("a") == queued("a", 1)


def test_the_policy_sees_higher_levels_first_and_never_mixes_them() -> None:
    """A backlog of compatible low-priority requests: the high one arriving last leads the next batch, alone."""
    queue = fill(PriorityQueue(), *(queued(f"n{i}") for i in range(8)), queued("h0", 2))
    window = [WaitingRequest(r.id, r.key, r.arrived_at, level=queue.level(r)) for r in queue.head(64)]
    config = PolicyConfig(max_num_seqs=4, max_wait_s=0.0, stable_s=0.0)
    assert decide(window, free_slots=1, now=0.0, config=config) == Dispatch(("h0",), ())
    queue.remove("h0")
    window = [WaitingRequest(r.id, r.key, r.arrived_at, level=queue.level(r)) for r in queue.head(64)]
    assert decide(window, free_slots=1, now=0.0, config=config) == Dispatch(("n0", "n1", "n2", "n3"), ())


def test_queues_of_the_settings() -> None:
    assert isinstance(QUEUES[Settings().scheduling_policy](), PriorityQueue)
    assert isinstance(QUEUES[Settings(scheduling_policy="fcfs").scheduling_policy](), FcfsQueue)
    assert set(QUEUES) == set(get_args(SchedulingPolicy))  # every policy the settings accept has its queue


# --- deadlines --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [FcfsQueue, PriorityQueue])
def test_expired_requests_leave_wherever_they_wait_earliest_first(kind: type[RequestQueue]) -> None:
    queue = fill(
        kind(),
        queued("h0", 2, deadline=30.0),
        queued("n0", deadline=10.0),
        queued("n1"),
        queued("low0", -2, deadline=5.0),
        queued("n2", deadline=10.5),
    )
    assert queue.next_deadline() == 5.0
    assert queue.pop_expired(4.999) == []
    assert [r.id for r in queue.pop_expired(10.0)] == ["low0", "n0"]  # at its deadline is past it
    assert queue.next_deadline() == 10.5
    assert "n0" not in queue and "n2" in queue
    assert [r.id for r in queue.pop_expired(100.0)] == ["n2", "h0"]
    assert queue.next_deadline() is None
    assert ids(queue) == ["n1"]


def test_a_removed_or_replaced_request_does_not_expire() -> None:
    queue = fill(PriorityQueue(), queued("a", deadline=1.0), queued("b", deadline=2.0), queued("c", deadline=3.0))
    queue.remove("a")
    queue.add(queued("b", deadline=9.0))  # read again with another deadline: only the new one counts
    assert queue.next_deadline() == 3.0
    assert [r.id for r in queue.pop_expired(5.0)] == ["c"]
    assert queue.next_deadline() == 9.0


def test_the_deadline_heap_forgets_removed_requests() -> None:
    queue = PriorityQueue()
    for i in range(1000):
        queue.add(queued(f"r{i}", deadline=float(i)))
        queue.remove(f"r{i}")
    assert len(queue._deadlines) <= 64 + 1  # rebuilt as removals pile up, not kept until each falls due
    assert queue.next_deadline() is None and queue.pop_expired(1e9) == []


@pytest.mark.parametrize("kind", [FcfsQueue, PriorityQueue])
def test_aborted_requests_with_a_deadline_leave_the_heap_while_others_wait(kind: type[RequestQueue]) -> None:
    """Today's main compacted only past twice the whole queue: behind a backlog without deadlines (no worker up),
    10,000 aborted requests with ``timeout_s`` stayed in the heap until each deadline fell due."""
    queue = kind()
    for i in range(10_000):
        queue.add(queued(f"waiting{i}"))
    for i in range(10_000):
        queue.add(queued(f"aborted{i}", i % 3, deadline=1e9 + i))
        if i % 2:
            queue.add(queued(f"aborted{i}", i % 3, deadline=1e9 + i))  # read again, unchanged
        queue.remove(f"aborted{i}")
    assert len(queue) == 10_000 and len(queue._deadlines) <= 64
    live = [queued(f"timed{i}", deadline=float(i)) for i in range(100)]
    for request in live:
        queue.add(request)
    for i in range(10_000):
        queue.add(queued(f"again{i}", deadline=1e9 + i))
        queue.remove(f"again{i}")
    assert len(queue._deadlines) <= 2 * len(live) + 64
    assert queue.next_deadline() == 0.0 and queue.pop_expired(1e12) == live


def test_clear_empties_everything() -> None:
    queue = fill(PriorityQueue(), queued("a", 1, deadline=1.0), queued("b"))
    queue.clear()
    assert len(queue) == 0 and ids(queue) == [] and queue.next_deadline() is None


@pytest.mark.parametrize("kind", [FcfsQueue, PriorityQueue])
def test_waiting_requests_are_counted_by_their_keys_model(kind: type[RequestQueue]) -> None:
    class Keyed:  # as shared.compat.CompatKey: a key with a model
        def __init__(self, model: str) -> None:
            self.model = model

    def of(id: str, model: str, priority: int = 0, deadline: float | None = None) -> QueuedRequest:
        return QueuedRequest(id, f"e-{id}", Keyed(model), 0.0, priority=priority, deadline=deadline)

    queue = fill(kind(), of("a", "sd"), of("b", "px", priority=2, deadline=5.0), of("c", "sd"), queued("d"))
    assert [queue.waiting_of(m) for m in ("sd", "px", None, "other")] == [2, 1, 1, 0]
    queue.add(of("a", "sd", priority=1))  # replaced, not counted twice
    queue.remove("c")
    assert queue.pop_expired(10.0)[0].id == "b"
    assert [queue.waiting_of(m) for m in ("sd", "px", None)] == [1, 0, 1]
    queue.clear()
    assert queue.waiting_of("sd") == 0
