"""The scheduler's loop on fakeredis (and on a Redis that is not there): takeover with a backlog, outages.

Celery's publish is the one stand-in: ``PublishedBatches`` records ``send_task`` calls instead of writing to a
broker (what is under test is the loop around the policy, not Celery).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fakeredis
import pytest
import redis

from scheduler.lease import Lease
from scheduler.service import SchedulerService
from scheduler.step_service import service_for
from scheduler.store import SchedulerStore
from shared.settings import Settings
from tests.support.redis_server import free_port
from tests.unit.test_fleet_metrics import abort
from tests.unit.test_scripts import submit


class PublishedBatches:
    """Records what the scheduler publishes (``Celery.send_task``'s signature, as the service calls it)."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []

    def send_task(self, name: str, args: list[dict[str, Any]], task_id: str, queue: str) -> None:
        self.batches.append(args[0])

    def request_ids(self) -> list[str]:
        return [rid for batch in list(self.batches) for rid in batch["request_ids"]]


@contextmanager
def running(service: SchedulerService) -> Iterator[threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=10)


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def scheduler(client: redis.Redis, settings: Settings, celery: PublishedBatches) -> SchedulerService:
    store = SchedulerStore(client, settings)
    lease = Lease(client, store.keys.scheduler_lease, settings.scheduler_lease_ms)
    return service_for(settings)(settings, store, lease, celery)  # type: ignore[arg-type]


def worker_up(client: redis.Redis, store: SchedulerStore, event: str = "worker_up") -> None:
    """A worker's slot is free (its heartbeat) and the scheduler is woken for it."""
    client.zadd(store.keys.workers, {"w": time.time() * 1000})
    client.xadd(store.keys.events, {"type": event})


def finish_the_batch_in_flight(client: redis.Redis, store: SchedulerStore) -> None:
    """What a worker does with the one batch in flight, in short: its requests succeed and it leaves flight."""
    batch_id = client.zrange(store.keys.inflight, 0, -1)[0]
    for rid in client.hget(store.keys.batch(batch_id), "ids").split():
        client.hset(store.keys.request(rid), "status", "succeeded")
    client.zrem(store.keys.inflight, batch_id)


def test_a_new_leader_replays_a_backlog_larger_than_one_read(tmp_path: Any) -> None:
    """Today's main re-read the first page of the pending list forever (every queued entry stays pending)."""
    settings = Settings(key_prefix="t", scheduler_read_count=10, max_num_seqs=4, scheduler_lease_ms=600)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    ids = [f"r{i:02d}" for i in range(25)]
    submit(client, store.keys, *ids)
    while store.read_new(block_ms=1).entries:  # a previous leader read them all, then died (no worker was free)
        pass
    assert len(store.read_pending()) == 10  # one page: the replay must go on past it
    celery = PublishedBatches()
    with running(scheduler(client, settings, celery)):
        client.zadd(store.keys.workers, {"w": time.time() * 1000})
        for _ in range(7):  # a worker slot frees up once per batch
            assert wait_until(lambda: client.zcard(store.keys.inflight) == 1, 5), celery.batches
            finish_the_batch_in_flight(client, store)
            worker_up(client, store, "batch_done")
            if len(celery.request_ids()) == len(ids):
                break
    assert celery.request_ids() == ids  # every one of them, in order, once
    assert client.xlen(store.keys.requests) == 0


def test_the_scheduler_outlives_a_redis_that_is_not_there() -> None:
    """Today's main let the first ConnectionError end the process (and `fusefleet up` with it)."""
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", key_prefix="t", scheduler_lease_ms=300)
    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=0.2, socket_timeout=1)
    with running(scheduler(client, settings, PublishedBatches())) as thread:
        time.sleep(1.5)
        assert thread.is_alive()
    assert not thread.is_alive()  # and it still stops when asked


@pytest.mark.parametrize("pending", [0, 3])
def test_takeover_acknowledges_the_previous_leaders_wake_ups(pending: int) -> None:
    settings = Settings(key_prefix="t", scheduler_lease_ms=600)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    for _ in range(pending):
        client.xadd(store.keys.events, {"type": "worker_up"})
    client.xreadgroup("scheduler", "active", {store.keys.events: ">"})  # read, never acknowledged
    with running(scheduler(client, settings, PublishedBatches())):
        assert wait_until(lambda: client.xpending(store.keys.events, "scheduler")["pending"] == 0, 5)


# --- aborted backlogs and the bound of the in-memory queue ------------------------------------------------------


def pending(client: redis.Redis, store: SchedulerStore) -> int:
    return int(client.xpending(store.keys.requests, "scheduler")["pending"])


@contextmanager
def backlog(count: int) -> Iterator[tuple[redis.Redis, SchedulerStore, PublishedBatches, list[str]]]:
    """A running scheduler that has read ``count`` queued requests (r000, r001, ...) while no worker slot is free."""
    settings = Settings(key_prefix="t", max_num_seqs=4, scheduler_lease_ms=600, scheduler_block_ms=500)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    celery = PublishedBatches()
    ids = [f"r{i:03d}" for i in range(count)]
    with running(scheduler(client, settings, celery)):
        submit(client, store.keys, *ids, max_len=1000)
        assert wait_until(lambda: pending(client, store) == len(ids), 5)  # read into its queue: no slot is free
        yield client, store, celery, ids


def test_requests_aborted_while_no_slot_is_free_leave_the_schedulers_memory_and_pending_list() -> None:
    """Today's main kept them (memory and pending list) until a slot freed, then skipped 64 per 500 ms round: the
    first new request after 300 aborted ones waited five blocking reads for a free slot."""
    with backlog(300) as (client, store, celery, ids):
        for rid in ids:
            assert abort(client, store.keys, rid) == "aborted"
        assert wait_until(lambda: pending(client, store) == 0, 2), pending(client, store)  # no slot needed
        assert wait_until(lambda: client.get(store.keys.scheduler_queued) == "0", 2)
        worker_up(client, store)
        started = time.monotonic()
        submit(client, store.keys, "new")
        assert wait_until(lambda: celery.request_ids() == ["new"], 5), celery.batches
        waited = time.monotonic() - started
    assert waited < 0.4, f"the new request waited {waited:.2f}s behind the aborted ones"


def test_a_window_of_aborted_requests_never_ends_the_round_while_live_ones_wait_behind_it() -> None:
    """Requests that ended without the scheduler being told (no id in ``P:scheduler:aborted``: a path that does not
    tell it) are found by the status check of the head; today's main ended the round (a 500 ms blocking read) at
    each window of 64 of them."""
    with backlog(320) as (client, store, celery, ids):
        for rid in ids:  # ended behind the scheduler's back
            client.hset(store.keys.request(rid), mapping={"status": "aborted", "abort": 1})
        worker_up(client, store)
        started = time.monotonic()
        submit(client, store.keys, "live", max_len=1000)
        assert wait_until(lambda: celery.request_ids() == ["live"], 5), celery.batches
        waited = time.monotonic() - started
        assert wait_until(lambda: pending(client, store) == 0, 2)
    assert waited < 0.4, f"the live request waited {waited:.2f}s behind the aborted ones"


def test_the_in_memory_queue_holds_at_most_max_queue_len_requests() -> None:
    """Today's main read every entry of the stream whatever its queue held (the stream may outgrow max_queue_len:
    requeued requests are added past it)."""
    settings = Settings(
        key_prefix="t", max_num_seqs=4, scheduler_lease_ms=600, max_queue_len=50, scheduler_read_count=20
    )
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    celery = PublishedBatches()
    ids = [f"r{i:03d}" for i in range(120)]
    submit(client, store.keys, *ids, max_len=1000)
    with running(scheduler(client, settings, celery)):
        assert wait_until(lambda: client.get(store.keys.scheduler_queued) == "50", 5)
        time.sleep(0.3)  # more rounds: it reads no more
        assert pending(client, store) == 50 and client.get(store.keys.scheduler_queued) == "50"
        client.zadd(store.keys.workers, {"w": time.time() * 1000})
        for _ in range(len(ids) // 4):  # one slot: the rest is read as room is made, in order
            assert wait_until(lambda: client.zcard(store.keys.inflight) == 1, 5), len(celery.batches)
            finish_the_batch_in_flight(client, store)
            client.xadd(store.keys.events, {"type": "batch_done"})
    assert celery.request_ids() == ids
