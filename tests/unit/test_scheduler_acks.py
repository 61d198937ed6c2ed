"""The scheduler's acknowledgements ride its next read (``SchedulerStore.ack``, ``read_new``): no round trip of
their own; a failed round trip keeps them for the next; ``flush_acks`` sends them at a lead's end. And the free slots
come with the live workers that announced (``SchedulerStore.slots``: the prefetch bound needs no read of its own)."""

from __future__ import annotations

import time
from typing import Any

import fakeredis
import pytest
import redis

from scheduler.store import SchedulerStore, Slots
from shared import keys as k
from shared.contracts import Task, WorkerCapabilities
from shared.settings import Settings
from tests.unit.test_scripts import submit


@pytest.fixture
def store() -> SchedulerStore:
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, Settings(key_prefix="t"))
    store.ensure_groups()
    return store


def pending(store: SchedulerStore, stream: str) -> int:
    return int(store._redis.xpending(stream, k.SCHEDULER_GROUP)["pending"])


def test_acknowledgements_wait_for_the_next_read_and_go_in_its_round_trip(store: SchedulerStore) -> None:
    keys, client = store.keys, store._redis
    submit(client, keys, "a", "b")
    client.xadd(keys.events, {"type": "batch_done"})
    read = store.read_new(1)
    assert [entry.request_id for entry in read.entries] == ["a", "b"] and read.woken
    store.ack([entry.entry_id for entry in read.entries])
    assert (pending(store, keys.requests), client.xlen(keys.requests), pending(store, keys.events)) == (2, 2, 1)
    assert store.read_new(1).entries == []  # this read carried them
    assert (pending(store, keys.requests), client.xlen(keys.requests), pending(store, keys.events)) == (0, 0, 0)


def test_a_failed_read_keeps_the_acknowledgements_for_the_next(
    store: SchedulerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, client = store.keys, store._redis
    submit(client, keys, "a")
    store.ack([entry.entry_id for entry in store.read_new(1).entries])
    real = client.pipeline

    def failing(*args: Any, **kwargs: Any) -> Any:
        pipe = real(*args, **kwargs)

        def execute(raise_on_error: bool = True) -> Any:
            raise redis.ConnectionError("down")

        pipe.execute = execute
        return pipe

    monkeypatch.setattr(client, "pipeline", failing)
    with pytest.raises(redis.ConnectionError):
        store.read_new(1)
    monkeypatch.setattr(client, "pipeline", real)
    assert pending(store, keys.requests) == 1
    store.read_new(1)
    assert pending(store, keys.requests) == 0 and client.xlen(keys.requests) == 0


def test_flush_acks_sends_them_at_once_and_a_second_flush_sends_nothing(store: SchedulerStore) -> None:
    keys, client = store.keys, store._redis
    submit(client, keys, "a")
    store.ack([entry.entry_id for entry in store.read_new(1).entries])
    store.flush_acks()
    assert pending(store, keys.requests) == 0 and client.xlen(keys.requests) == 0
    store.flush_acks()  # nothing due: no round trip
    assert store._acks_due == [] and store._events_due == []


def test_slots_count_the_live_workers_that_announced(store: SchedulerStore) -> None:
    keys, client = store.keys, store._redis
    now_ms = time.time() * 1000
    client.zadd(keys.workers, {"w1": now_ms, "w2": now_ms, "old": now_ms - 3_600_000})
    client.hset(keys.capabilities, mapping={"w1": "{}", "old": "{}"})  # w2 beat without announcing (a test's)
    client.zadd(keys.inflight, {"B1": now_ms})
    assert store.slots() == Slots(free=1, live=1)  # "old" is swept, capabilities and all
    assert client.hkeys(keys.capabilities) == ["w1"] and store.free_slots() == 1


def test_capacity_reads_in_one_round_trip_what_slots_and_worker_models_read(store: SchedulerStore) -> None:
    keys, client = store.keys, store._redis
    now_ms = time.time() * 1000
    sd = WorkerCapabilities(model="sd", pipeline="StableDiffusionPipeline", tasks=(Task.TEXT_TO_IMAGE,))
    flux = WorkerCapabilities(model="flux", pipeline="FluxPipeline", tasks=(Task.TEXT_TO_IMAGE,))
    client.zadd(keys.workers, {"w1": now_ms, "w2": now_ms, "old": now_ms - 3_600_000})
    client.hset(keys.capabilities, mapping={"w1": sd.model_dump_json(), "w2": flux.model_dump_json(), "old": "{}"})
    client.zadd(keys.inflight, {"B1": now_ms, "B2": now_ms})
    client.zadd(keys.storing, {"B2": now_ms})  # its forward is over: it occupies no worker
    known = {"B1": "sd", "B9": "sd"}  # B9 left flight
    capacity = store.capacity(known)
    assert capacity.slots == Slots(free=1, live=2) and capacity.workers == {"w1": sd, "w2": flux}
    assert capacity.busy == {"B1": "sd"} and known == {"B1": "sd"}
    assert capacity.workers == store.worker_models() and capacity.slots == store.slots()  # the separate reads agree
    trips = round_trips(client)
    store.capacity(known)  # its script loaded by now
    assert trips == {"commands": 0, "pipelines": 1}


def round_trips(client: Any) -> dict[str, int]:
    """Count from now on ``client``'s plain commands and its pipelines executed (each one round trip)."""
    counts = {"commands": 0, "pipelines": 0}
    command, pipeline = client.execute_command, client.pipeline

    def counted_command(*args: Any, **kwargs: Any) -> Any:
        counts["commands"] += 1
        return command(*args, **kwargs)

    def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute

        def counted_execute(*a: Any, **k: Any) -> Any:
            counts["pipelines"] += 1
            return execute(*a, **k)

        pipe.execute = counted_execute
        return pipe

    client.execute_command, client.pipeline = counted_command, counted_pipeline
    return counts
