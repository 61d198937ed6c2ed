"""Batches capped where batching stops paying: the knees the workers announce, as the scheduler reads them (the
lowest among a model's workers, per request pixel cost), and the scheduler's loop capping a batch there."""

from __future__ import annotations

import time

import fakeredis

from scheduler.knees import KneeCaps
from scheduler.store import SchedulerStore
from shared.contracts import BatchKnee, ModelCapabilities, WorkerCapabilities
from shared.settings import Settings
from tests.unit.test_scheduler_service import PublishedBatches, running, scheduler, wait_until
from tests.unit.test_scripts import submit


class Key:
    def __init__(self, model: str | None) -> None:
        self.model = model


def served(model: str, *knees: tuple[int, int]) -> ModelCapabilities:
    return ModelCapabilities(
        model=model,
        pipeline="P",
        tasks=(),
        batch_knees=tuple(BatchKnee(cost=cost, knee=knee) for cost, knee in knees),
    )


def test_the_lowest_knee_of_a_models_workers_per_cost() -> None:
    caps = KneeCaps.of(
        {
            "w1": WorkerCapabilities.of((served("a", (4096, 8), (16384, 2)), served("b", (4096, 1)))),
            "w2": WorkerCapabilities.of((served("a", (4096, 4)),)),
        }
    )
    assert caps.knee(Key("a"), 4096) == 4 and caps.knee(Key("a"), 16384) == 2 and caps.knee(Key("b"), 4096) == 1
    assert caps.knee(Key("a"), 1024) is None and caps.knee(Key("c"), 4096) is None
    assert caps.knee(Key(None), 4096) is None  # several models: a key without one has no cap


def test_a_fleet_of_one_model_caps_keys_that_name_none() -> None:
    caps = KneeCaps.of({"w": WorkerCapabilities.of((served("demo", (4096, 2)),))})
    assert caps.knee(Key(None), 4096) == 2 and caps.knee("a key without a model", 4096) == 2
    assert KneeCaps().knee(Key("demo"), 4096) is None


def test_the_scheduler_caps_a_batch_at_the_announced_knee() -> None:
    settings = Settings(key_prefix="t", max_num_seqs=4, request_batch_max_wait_ms=60_000, scheduler_lease_ms=600)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    announced = WorkerCapabilities.of((served("demo", (64 * 64, 2)),))
    client.hset(store.keys.capabilities, "w", announced.model_dump_json())
    client.zadd(store.keys.workers, {"w": time.time() * 1000})
    submit(client, store.keys, "r0", "r1", "r2", "r3")
    celery = PublishedBatches()
    with running(scheduler(client, settings, celery)):
        # full at its knee, so it goes at once (the admission wait is a minute)
        assert wait_until(lambda: len(celery.batches) >= 1, 5), celery.batches
    assert celery.batches[0]["request_ids"] == ["r0", "r1"]
