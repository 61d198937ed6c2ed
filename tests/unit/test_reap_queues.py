"""The reaper looks for a batch's message in every queue it may wait in (fakeredis, the real scripts): in a fleet of
several models, a batch unclaimed past the claim timeout whose message waits in its model's queue or in a live
worker's own queue is left to its consumer; one whose message is gone, or waits only in a gone worker's queue (no
consumer), is published again."""

from __future__ import annotations

import fakeredis
import pytest

from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared.celery_config import broker_key_prefix
from shared.routing import model_queue, worker_queue
from shared.settings import Settings
from tests.unit.test_model_routing import MODELS, announce
from tests.unit.test_scripts import submit


@pytest.fixture
def settings() -> Settings:
    """A fleet of two models (``sd`` the default, on the fleet's queue; ``px`` on its own) on one Redis."""
    return Settings(key_prefix="t", models=MODELS, batch_claim_timeout_s=30.0)


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


def overdue_batch(client: fakeredis.FakeRedis, store: SchedulerStore, model: str) -> str:
    """Batch B1 of one request of ``model``, scheduled and published long past the claim timeout, never claimed."""
    submit(client, store.keys, "a", model=model)
    lease = Lease(client, store.keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    assert store.schedule(lease.key, lease.token, "B1", ["a"]) == ["a"]
    client.hset(store.keys.batch("B1"), "published_ms", 0)  # published at the epoch: overdue, no clock waited on
    return "B1"


def wait_in(client: fakeredis.FakeRedis, settings: Settings, queue: str, batch_id: str) -> str:
    """Put a Celery message of ``batch_id`` in broker queue ``queue`` (its key in the fleet's Redis); the key."""
    key = broker_key_prefix(settings) + queue
    client.lpush(key, f'{{"headers": {{"id": "{batch_id}", "task": "fusefleet.run_batch"}}}}')
    return key


def test_a_batch_waiting_in_another_models_queue_is_not_published_again(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    store = SchedulerStore(client, settings)
    batch_id = overdue_batch(client, store, "px")
    assert model_queue(settings, "px") != settings.queue_name  # not the fleet's default queue
    queue = wait_in(client, settings, model_queue(settings, "px"), batch_id)
    assert store.reap().republish == []  # overdue, but its message waits in px's queue: a px worker will take it
    client.delete(queue)  # the message is lost
    assert store.reap().republish == [batch_id]
    assert store.reap().republish == []  # stamped: not again before another timeout


def test_a_batch_waiting_in_a_live_workers_queue_is_left_and_in_a_gone_ones_published_again(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    store = SchedulerStore(client, settings)
    batch_id = overdue_batch(client, store, "px")
    announce(client, store, "w1", "px")
    wait_in(client, settings, worker_queue(settings, "w1"), batch_id)
    assert store.reap().republish == []  # placed on w1, which is live: it will take it
    client.zadd(store.keys.workers, {"w1": 0})  # w1's heartbeat lapsed: nothing consumes its queue
    assert store.reap().republish == [batch_id]


def test_on_another_broker_no_queue_is_read_and_an_overdue_batch_is_published_again(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    elsewhere = settings.model_copy(update={"broker_url": "redis://broker:6379/0"})
    store = SchedulerStore(client, elsewhere)
    batch_id = overdue_batch(client, store, "px")
    wait_in(client, settings, model_queue(settings, "px"), batch_id)  # a stale list of a former broker
    assert store.reap().republish == [batch_id]
