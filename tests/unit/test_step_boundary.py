"""The running set's boundary threads (``gpu_worker.step_boundary``) on fakeredis with the real Lua scripts:
``Arrivals`` claims a batch sent to the inbox (held, ``FORWARD_DONE``, journaled) so that the boundary only takes it;
a batch another run holds is skipped and counted out; evictions keep their inbox order; ``drain`` leaves nothing
in the inbox; an error of the reader comes back at ``take``; what was never taken comes back from ``stop``.
``Writes`` keeps the submitted order, hands its error to the loop and runs inline once closed.

No test waits for a thread by time: ``drain`` and ``settle`` read the rest on the test's thread, ``flush`` waits
for the writes.
"""

from __future__ import annotations

import threading
import time
import uuid

import fakeredis
import pytest

from gpu_worker.heartbeat import Heartbeat
from gpu_worker.result_writer import ResultWriter
from gpu_worker.step_boundary import Arrivals as ArrivalsThread
from gpu_worker.step_boundary import Eviction, Joiner, Writes
from gpu_worker.store import Claimed, WorkerStore
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared.compat import step_key
from shared.contracts import BatchMessage, ModelTraits, RequestSpec, StepEviction, Task, WorkerCapabilities
from shared.results.filesystem import FilesystemResultStore
from shared.settings import Settings
from tests.support.specs import demo_spec
from tests.unit.test_scripts import submit

WORKER = "w1"
BOUND_S = 30.0


class Fleet:
    """A worker's store, writer and heartbeat, and the scheduler's side of a join, on one fakeredis."""

    def __init__(self, client: fakeredis.FakeRedis, tmp_path: object) -> None:
        self.client = client
        self.settings = Settings(key_prefix="t", batch_lock_ttl_s=5, result_ttl_s=60, worker_ttl_s=60)
        self.store = WorkerStore(client, self.settings)
        self.keys = self.store.keys
        capabilities = WorkerCapabilities(model="demo", pipeline="Test", tasks=(Task.TEXT_TO_IMAGE,))
        self.store.heartbeat(WORKER, capabilities, first=True)
        self.heartbeat = Heartbeat(self.store, WORKER, 1.0, capabilities)  # never started: holds are observed
        self.writer = ResultWriter(self.store, FilesystemResultStore(tmp_path), ModelTraits())  # type: ignore[arg-type]
        self.lease = Lease(client, self.keys.scheduler_lease, 60_000)
        assert self.lease.try_acquire()
        self.skipped: list[int] = []
        self.digest = step_key(self.spec("first")).digest
        self.store.step_open(WORKER, self.digest, 1)

    def spec(self, rid: str) -> RequestSpec:
        return demo_spec(rid, 4, side=32, created_at=time.time())

    def arrivals(self) -> ArrivalsThread:
        return ArrivalsThread(self.writer, WORKER, self.digest, self.heartbeat, on_skipped=self.skipped.append)

    def send(self, batch_id: str, *rids: str) -> BatchMessage:
        """Submit, schedule and join a batch of ``rids`` to the worker's set, as the api and scheduler do."""
        submit(self.client, self.keys, *rids)
        for rid in rids:
            self.client.hset(self.keys.request(rid), "spec", self.spec(rid).model_dump_json())
        scheduler = SchedulerStore(self.client, self.settings)
        assert scheduler.schedule(self.lease.key, self.lease.token, batch_id, list(rids)) == list(rids)
        message = BatchMessage(batch_id=batch_id, request_ids=tuple(rids), created_at=time.time())
        assert scheduler.step_join(WORKER, self.digest, message.model_dump_json(), batch_id, len(rids), 8)
        return message

    def inbox(self) -> int:
        return int(self.client.llen(self.keys.step_inbox(WORKER)))


@pytest.fixture
def fleet(client: fakeredis.FakeRedis, tmp_path: object) -> Fleet:
    return Fleet(client, tmp_path)


def test_a_batch_sent_to_the_set_is_claimed_held_marked_and_journaled_before_the_boundary(fleet: Fleet) -> None:
    arrivals = fleet.arrivals()
    try:
        fleet.send("B2", "a", "b")
        (joiner,) = arrivals.drain(BOUND_S)
    finally:
        assert arrivals.stop() == []
    assert isinstance(joiner, Joiner)
    assert joiner.message.batch_id == "B2" and [spec.id for spec in joiner.claim.specs] == ["a", "b"]
    assert fleet.heartbeat.held == ["B2"]  # its lock renewed from the claim on
    assert fleet.client.zrange(fleet.keys.storing, 0, -1) == ["B2"]  # FORWARD_DONE: it occupies no slot
    assert fleet.client.zcard(fleet.keys.finished) == 0
    for rid in ("a", "b"):
        assert fleet.client.hget(fleet.keys.request(rid), "status") == "running"
    journal = [key for key in fleet.client.keys(f"{fleet.keys.tag}:*") if "result" in key]
    assert journal, "the result keys of the claim are journaled before the first step that could write them"
    assert fleet.inbox() == 0


def test_a_batch_another_run_holds_is_skipped_and_counted_out(fleet: Fleet) -> None:
    message = fleet.send("B2", "a")
    assert isinstance(fleet.store.claim(message, uuid.uuid4().hex, "w2"), Claimed)  # another run holds it
    arrivals = fleet.arrivals()
    try:
        assert arrivals.drain(BOUND_S) == []
    finally:
        arrivals.stop()
    assert fleet.skipped == [1]
    assert fleet.heartbeat.held == []


def test_evictions_and_joins_come_in_inbox_order(fleet: Fleet) -> None:
    fleet.send("B2", "a")
    fleet.client.rpush(fleet.keys.step_inbox(WORKER), StepEviction(evict="first").model_dump_json())
    fleet.client.rpush(fleet.keys.step_inbox(WORKER), "not a message")  # dropped, logged
    fleet.send("B3", "b")
    arrivals = fleet.arrivals()
    try:
        got = arrivals.drain(BOUND_S)
    finally:
        arrivals.stop()
    assert [type(arrival).__name__ for arrival in got] == ["Joiner", "Eviction", "Joiner"]
    assert got[1] == Eviction("first")
    assert [arrival.message.batch_id for arrival in got if isinstance(arrival, Joiner)] == ["B2", "B3"]


def test_what_settle_claimed_waits_for_the_next_take_and_stop_returns_what_no_take_took(fleet: Fleet) -> None:
    arrivals = fleet.arrivals()
    fleet.send("B2", "a")
    arrivals.settle(BOUND_S)
    assert fleet.inbox() == 0
    left = arrivals.stop()
    assert [arrival.message.batch_id for arrival in left if isinstance(arrival, Joiner)] == ["B2"]
    assert fleet.heartbeat.held == ["B2"]  # still held: the owner lets it go (step_loop._release_joiners)


class BrokenStore(WorkerStore):
    """A store whose inbox read fails as a bug would (not a Redis outage)."""

    def step_inbox_wait(self, worker: str, timeout_s: float) -> str | None:
        raise RuntimeError("the inbox read broke")


def test_an_error_of_the_reader_is_raised_at_the_next_take(fleet: Fleet, tmp_path: object) -> None:
    broken = ResultWriter(BrokenStore(fleet.client, fleet.settings), FilesystemResultStore(tmp_path), ModelTraits())  # type: ignore[arg-type]
    arrivals = ArrivalsThread(broken, WORKER, fleet.digest, None, on_skipped=fleet.skipped.append)
    try:
        assert arrivals.pause(BOUND_S)  # the thread has stopped on its error: no read is in flight
        with pytest.raises(RuntimeError, match="the inbox read broke"):
            arrivals.take()
    finally:
        arrivals.stop()


def test_writes_run_in_the_order_submitted_and_inline_once_closed() -> None:
    writes = Writes()
    done: list[int] = []
    gate = threading.Event()
    writes.submit(lambda: gate.wait(BOUND_S))  # the first write is slow: the others queue behind it
    for index in range(5):
        writes.submit(lambda index=index: done.append(index))  # type: ignore[misc]
    assert done == []
    gate.set()
    writes.flush(BOUND_S)
    assert done == [0, 1, 2, 3, 4]
    writes.close(BOUND_S)
    caller: list[str] = []
    writes.submit(lambda: caller.append(threading.current_thread().name))
    assert caller == [threading.current_thread().name]


def test_a_failed_write_is_raised_once_and_the_writes_after_it_are_dropped() -> None:
    writes = Writes()
    done: list[str] = []

    def boom() -> None:
        raise ConnectionError("Redis went away")

    writes.submit(boom)
    writes.submit(lambda: done.append("after"))
    with pytest.raises(ConnectionError, match="Redis went away"):
        writes.flush(BOUND_S)
    writes.check()  # raised once
    writes.abandon()
    assert done == []


def test_a_flush_that_outlives_its_bound_says_so() -> None:
    writes = Writes()
    gate = threading.Event()
    writes.submit(lambda: gate.wait(BOUND_S))
    try:
        with pytest.raises(TimeoutError):
            writes.flush(0.0)
    finally:
        gate.set()
        writes.close(BOUND_S)
