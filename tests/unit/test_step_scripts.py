"""Step mode's Lua scripts on fakeredis: ``step_join.lua`` (through ``SchedulerStore.step_join``), ``step_close.lua``,
``step_reregister.lua`` (a swept set registered again), what ``heartbeat.lua`` says of a worker announced anew, and what
``free_slots.lua`` and ``reap.lua`` make of open sets and the batches sent to them."""

from __future__ import annotations

import time
from typing import Any

import fakeredis
import pytest
import redis

from gpu_worker.store import Beat, WorkerStore
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared import keys as k
from shared.contracts import BatchMessage, Task, WorkerCapabilities
from shared.retry import call_with_retry
from shared.settings import Settings
from tests.unit.test_scripts import submit

DIGEST = "0123456789abcdef"
CAPABILITIES = WorkerCapabilities(model="demo", pipeline="Test", tasks=(Task.TEXT_TO_IMAGE,))


@pytest.fixture
def settings() -> Settings:
    return Settings(key_prefix="t", worker_ttl_s=5, batch_claim_timeout_s=30)


@pytest.fixture
def store(client: fakeredis.FakeRedis, settings: Settings) -> SchedulerStore:
    return SchedulerStore(client, settings)


def now_ms() -> float:
    return time.time() * 1000


def open_set(client: fakeredis.FakeRedis, keys: k.RedisKeys, worker: str, digest: str, rows: int) -> None:
    """A live worker running a set on ``digest`` (``sealed`` = takes no joins) of ``rows`` requests."""
    client.zadd(keys.workers, {worker: now_ms()})
    client.hset(keys.step_sets, worker, digest)
    client.hset(keys.step_rows, worker, rows)


def message(batch_id: str, *ids: str) -> str:
    return BatchMessage(batch_id=batch_id, request_ids=ids, created_at=1.0).model_dump_json()


def schedule(client: fakeredis.FakeRedis, store: SchedulerStore, batch_id: str, *ids: str) -> list[str]:
    submit(client, store.keys, *ids)
    lease = Lease(client, store.keys.scheduler_lease, 5000)
    assert lease.try_acquire() or lease.renew()
    return store.schedule(lease.key, lease.token, batch_id, list(ids))


def test_join_accepted_grows_the_set_fills_the_inbox_and_frees_the_batchs_slot(
    client: fakeredis.FakeRedis, store: SchedulerStore, settings: Settings
) -> None:
    keys = store.keys
    open_set(client, keys, "w1", DIGEST, 2)
    assert store.step_join("w1", DIGEST, message("B1", "a", "b"), "B1", 2, 4)
    assert client.hget(keys.step_rows, "w1") == "4"
    assert client.lrange(keys.step_inbox("w1"), 0, -1) == [message("B1", "a", "b")]
    ttl_ms = client.pttl(keys.step_inbox("w1"))
    assert 2 * settings.batch_claim_timeout_s * 1000 < ttl_ms <= 2 * settings.batch_time_limit_s * 1000
    assert client.zscore(keys.storing, "B1") is not None
    assert client.hget(keys.step_sets, "w1") == DIGEST  # the set stays open on its key
    # the next batch would take it over its cap: refused, nothing changed
    assert not store.step_join("w1", DIGEST, message("B2", "c"), "B2", 1, 4)
    assert client.hget(keys.step_rows, "w1") == "4"
    assert client.llen(keys.step_inbox("w1")) == 1
    assert client.zscore(keys.storing, "B2") is None


@pytest.mark.parametrize("why", ["no heartbeat", "stale heartbeat", "other key", "sealed", "closed", "full"])
def test_join_refused_changes_nothing(client: fakeredis.FakeRedis, store: SchedulerStore, why: str) -> None:
    keys = store.keys
    open_set(client, keys, "w1", DIGEST, 1)
    if why == "no heartbeat":
        client.zrem(keys.workers, "w1")
    elif why == "stale heartbeat":
        client.zadd(keys.workers, {"w1": now_ms() - 6000})  # worker_ttl_s = 5
    elif why == "other key":
        client.hset(keys.step_sets, "w1", "fedcba9876543210")
    elif why == "sealed":
        client.hset(keys.step_sets, "w1", "sealed")
    elif why == "closed":
        client.hdel(keys.step_sets, "w1")
    elif why == "full":
        client.hset(keys.step_rows, "w1", 3)
    rows = client.hget(keys.step_rows, "w1")
    assert not store.step_join("w1", DIGEST, message("B1", "a", "b"), "B1", 2, 4)
    assert client.hget(keys.step_rows, "w1") == rows
    assert not client.exists(keys.step_inbox("w1"))
    assert client.zscore(keys.storing, "B1") is None


def test_a_join_that_exactly_fills_the_set_is_accepted(client: fakeredis.FakeRedis, store: SchedulerStore) -> None:
    open_set(client, store.keys, "w1", DIGEST, 3)
    assert store.step_join("w1", DIGEST, message("B1", "a"), "B1", 1, 4)
    assert client.hget(store.keys.step_rows, "w1") == "4"


def close(client: fakeredis.FakeRedis, keys: k.RedisKeys, worker: str) -> int:
    return int(WorkerStore(client, Settings(key_prefix=keys.prefix)).step_close(worker))


def test_close_is_refused_while_the_inbox_holds_a_batch(client: fakeredis.FakeRedis, store: SchedulerStore) -> None:
    keys = store.keys
    open_set(client, keys, "w1", DIGEST, 0)
    open_set(client, keys, "w2", DIGEST, 1)
    assert store.step_join("w1", DIGEST, message("B1", "a"), "B1", 1, 4)
    assert close(client, keys, "w1") == 0
    assert client.hget(keys.step_sets, "w1") == DIGEST and client.hget(keys.step_rows, "w1") == "1"
    assert client.xlen(keys.events) == 0
    client.lpop(keys.step_inbox("w1"))  # the worker took the batch; its set ran empty again
    assert close(client, keys, "w1") == 1
    assert not client.hexists(keys.step_sets, "w1") and not client.hexists(keys.step_rows, "w1")
    assert client.hget(keys.step_sets, "w2") == DIGEST  # another worker's set is left alone
    events = client.xrange(keys.events)
    assert [fields for _, fields in events] == [{"type": "slot_free", "worker": "w1"}]  # wakes the scheduler


def test_free_slots_counts_an_open_set_busy_and_sweeps_a_stale_workers_set(
    client: fakeredis.FakeRedis, store: SchedulerStore
) -> None:
    keys = store.keys
    for worker in ("w1", "w2", "w3"):
        client.zadd(keys.workers, {worker: now_ms()})
    assert store.free_slots() == 3
    open_set(client, keys, "w1", DIGEST, 1)
    assert store.free_slots() == 2
    open_set(client, keys, "w2", "sealed", 2)  # a sealed set still runs: its worker is busy
    assert store.free_slots() == 1
    # a batch sent to a set is in flight but holds no slot of its own
    assert schedule(client, store, "B1", "a") == ["a"]
    assert store.free_slots() == 0  # in flight, not yet sent anywhere
    assert store.step_join("w1", DIGEST, message("B1", "a"), "B1", 1, 4)
    assert store.free_slots() == 1
    client.zadd(keys.workers, {"w2": now_ms() - 6000})  # w2 stopped beating: gone, with its set
    assert store.free_slots() == 1  # two live workers, w1's set busy
    assert not client.hexists(keys.step_sets, "w2") and not client.hexists(keys.step_rows, "w2")
    assert client.hget(keys.step_sets, "w1") == DIGEST


def test_the_reaper_leaves_a_sent_batch_to_its_set_until_the_claim_timeout(
    client: fakeredis.FakeRedis, store: SchedulerStore
) -> None:
    """A batch in a set's inbox has no lock (not claimed yet) but must keep holding no slot; unclaimed past the claim
    timeout (its worker died) it is published again and takes a slot of its own."""
    keys = store.keys
    client.zadd(keys.workers, {"w2": now_ms()})
    open_set(client, keys, "w1", DIGEST, 0)
    assert schedule(client, store, "B1", "a") == ["a"]
    assert store.step_join("w1", DIGEST, message("B1", "a"), "B1", 1, 4)
    assert store.reap().republish == []
    assert client.zscore(keys.storing, "B1") is not None
    assert store.free_slots() == 1
    client.hset(keys.batch("B1"), "published_ms", now_ms() - 31_000)  # batch_claim_timeout_s = 30
    assert store.reap().republish == ["B1"]
    assert client.zscore(keys.storing, "B1") is None
    assert store.free_slots() == 0  # w1's set and the republished batch


class LosesAReply(fakeredis.FakeRedis):
    """Runs each script, but loses the reply of the first one after ``lose()``: the caller sees a connection
    error for a call that took effect (Redis restarted or the link dropped right after)."""

    losing = False

    def evalsha(self, *args: Any) -> Any:
        reply = super().evalsha(*args)
        if self.losing:
            self.losing = False
            raise redis.ConnectionError("the reply was lost")
        return reply


def test_a_count_out_retried_after_a_lost_reply_is_counted_once(settings: Settings) -> None:
    """The loop retries a count-out whose reply was lost (``ResultWriter.redis``) with the same token: the set's
    count drops once, so the scheduler never sends it joiners past ``max_num_seqs``."""
    client = LosesAReply(decode_responses=True)
    worker = WorkerStore(client, settings)
    worker.step_open("w1", DIGEST, 4)
    client.hset(worker.keys.step_levels("w1"), mapping={"a": "0 1", "b": "0 1"})
    client.losing = True
    call_with_retry(lambda: worker.step_leave("w1", 2, ["a", "b"], token="leave-1"), what="t", give_up_after_s=5)
    assert not client.losing  # the first call's reply was lost: it ran twice
    assert client.hget(worker.keys.step_rows, "w1") == "2"
    assert not client.exists(worker.keys.step_levels("w1"))
    worker.step_leave("w1", 1, token="leave-2")  # the next count-out counts
    assert client.hget(worker.keys.step_rows, "w1") == "1"


def test_reregister_registers_a_swept_set_with_its_count_and_wakes_the_scheduler(
    client: fakeredis.FakeRedis, store: SchedulerStore, settings: Settings
) -> None:
    keys, worker = store.keys, WorkerStore(client, settings)
    client.zadd(keys.workers, {"w1": now_ms()})
    set_id = worker.step_open("w1", DIGEST, 3)
    client.zadd(keys.workers, {"w1": now_ms() - 60_000})  # its beat came late: swept with its set
    assert store.slots().live == 0 and not client.hexists(keys.step_sets, "w1")
    client.rpush(keys.step_inbox("w1"), message("B1", "a", "b"))  # sent before the sweep, not read yet
    assert worker.step_reregister("w1", set_id, DIGEST, 3, 1) == -1  # not live: nothing written
    assert not client.hexists(keys.step_sets, "w1")
    assert worker.heartbeat("w1", CAPABILITIES)  # its next beat announces the worker again
    assert worker.step_reregister("w1", set_id, DIGEST, 3, 2) == -1  # the inbox was not as read: nothing written
    assert worker.step_reregister("w1", "another set", DIGEST, 3, 1) == -2  # not this worker's open set
    assert not client.hexists(keys.step_sets, "w1")
    client.delete(keys.events)
    assert worker.step_reregister("w1", set_id, DIGEST, 3, 1) == 1
    assert client.hget(keys.step_sets, "w1") == DIGEST and client.hget(keys.step_rows, "w1") == "3"
    assert [fields for _, fields in client.xrange(keys.events)] == [{"type": "room_free", "worker": "w1"}]
    assert store.slots().free == 0  # the set holds the worker's slot again
    assert worker.step_reregister("w1", set_id, k.STEP_SEALED, 9, 1) == 0  # registered: a later call changes nothing
    assert client.hget(keys.step_sets, "w1") == DIGEST and client.hget(keys.step_rows, "w1") == "3"


def test_a_set_closed_or_dropped_is_never_registered_again(client: fakeredis.FakeRedis, settings: Settings) -> None:
    """A re-registration that comes after its set closed or was dropped (its reader outlived the set's cleanup)
    writes nothing: no set that no loop reads holds the slot or takes joins."""
    worker = WorkerStore(client, settings)
    keys = worker.keys
    worker.heartbeat("w1", CAPABILITIES, first=True)
    for end in (lambda: worker.step_close("w1"), lambda: worker.step_drop("w1"), lambda: worker.leave("w1")):
        set_id = worker.step_open("w1", DIGEST, 1)
        assert client.get(keys.step_open("w1")) == set_id
        client.hdel(keys.step_sets, "w1")  # swept
        client.hdel(keys.step_rows, "w1")
        end()
        worker.heartbeat("w1", CAPABILITIES)
        assert worker.step_reregister("w1", set_id, DIGEST, 1, 0) == -2
        assert not client.hexists(keys.step_sets, "w1") and not client.exists(keys.step_open("w1"))


def test_a_beat_says_when_it_announced_the_worker_anew(client: fakeredis.FakeRedis, settings: Settings) -> None:
    store = WorkerStore(client, settings)
    assert store.heartbeat("w1", CAPABILITIES, first=True) == Beat.ANEW
    assert store.heartbeat("w1", CAPABILITIES) == Beat.ANNOUNCED
    client.zrem(store.keys.workers, "w1")  # swept (free_slots.lua) or left
    assert store.heartbeat("w1", CAPABILITIES) == Beat.ANEW
    client.set(store.keys.worker_quarantine("w1"), "stuck")
    assert store.heartbeat("w1", CAPABILITIES) == Beat.REFUSED
