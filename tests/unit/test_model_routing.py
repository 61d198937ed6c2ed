"""Routing by model on the scheduler's side (fakeredis, the real scripts; Celery's publish recorded): each batch goes
to the own queue of a free worker of its model and says its model, a batch published again (handed back by a worker
that fences it) is placed again, and the requests of a model without a free worker (or with none) wait aside while
another model's worker takes its own."""

from __future__ import annotations

import time
from typing import Any

import fakeredis

from gpu_worker.store import WorkerStore
from scheduler.store import SchedulerStore
from shared.contracts import ModelCapabilities, Task, WorkerCapabilities
from shared.settings import Settings
from tests.unit.test_scheduler_service import running, scheduler, wait_until
from tests.unit.test_scripts import submit

MODELS = "sd=demo:stable-diffusion,px=demo:pixart"


class QueuedBatches:
    """Records each published batch with the queue it went to."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send_task(self, name: str, args: list[dict[str, Any]], task_id: str, queue: str, **_: Any) -> None:
        self.sent.append((queue, args[0]))


def test_each_batch_goes_to_a_worker_of_its_model_and_a_handed_back_one_again() -> None:
    settings = Settings(key_prefix="t", models=MODELS, max_num_seqs=4, request_batch_max_wait_ms=0)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    submit(client, store.keys, "s1", model="sd")
    submit(client, store.keys, "p1", model="px")
    celery = QueuedBatches()
    with running(scheduler(client, settings, celery)):  # type: ignore[arg-type]
        announce(client, store, "w1", "sd")
        announce(client, store, "w2", "px")
        assert wait_until(lambda: len(celery.sent) == 2, 5), celery.sent
        sent = {message["model"]: (queue, message) for queue, message in celery.sent}
        assert sent["sd"][0] == "t.batches@w1" and sent["sd"][1]["request_ids"] == ["s1"]
        assert sent["px"][0] == "t.batches@w2" and sent["px"][1]["request_ids"] == ["p1"]
        # a worker that does not serve px took its message: it hands it back unclaimed, and the reaper routes it
        WorkerStore(client, settings).give_back(sent["px"][1]["batch_id"], None)
        assert wait_until(lambda: len(celery.sent) == 3, 5), celery.sent
    queue, message = celery.sent[2]
    assert (queue, message["model"], message["request_ids"]) == ("t.batches@w2", "px", ["p1"])  # free again
    assert message["batch_id"] == sent["px"][1]["batch_id"]
    assert client.hget(store.keys.batch(message["batch_id"]), "attempts") in (None, "0")  # no attempt counted


def test_model_of_reads_the_first_spec_still_there() -> None:
    settings = Settings(key_prefix="t", models=MODELS)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    submit(client, store.keys, "p1", "p2", model="px")
    client.delete(store.keys.request("p1"))
    assert store.model_of(["p1", "p2"]) == "px"
    assert store.model_of(["gone"]) is None


def announce(
    client: fakeredis.FakeRedis,
    store: SchedulerStore,
    worker: str,
    *models: str,
    cold: tuple[str, ...] = (),
    batch_s: float | None = None,
) -> None:
    """A live worker serving ``models`` (its heartbeat, as heartbeat.lua writes it; those of ``cold`` not resident,
    their load 1 s; ``batch_s`` its batches' seconds), and the scheduler woken."""
    served = tuple(
        ModelCapabilities(
            model=m, pipeline="P", tasks=(Task.TEXT_TO_IMAGE,), resident=m not in cold, load_s=1.0, batch_s=batch_s
        )
        for m in models
    )
    client.hset(store.keys.capabilities, worker, WorkerCapabilities.of(served).model_dump_json())
    client.zadd(store.keys.workers, {worker: client.time()[0] * 1000})
    client.xadd(store.keys.events, {"type": "worker_up"})


def test_a_model_no_live_worker_serves_waits_aside_without_blocking_or_holding_a_slot() -> None:
    settings = Settings(key_prefix="t", models=MODELS, max_num_seqs=4, request_batch_max_wait_ms=0)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    submit(client, store.keys, "p1", model="px")  # first in line, but px's workers are gone
    submit(client, store.keys, "s1", model="sd")
    celery = QueuedBatches()
    with running(scheduler(client, settings, celery)):  # type: ignore[arg-type]
        announce(client, store, "w1", "sd")
        announce(client, store, "w2", "sd")
        assert wait_until(lambda: len(celery.sent) == 1, 5), celery.sent
        time.sleep(0.5)  # two free slots, and still only sd's batch went
        assert [(q, m["request_ids"]) for q, m in celery.sent] == [("t.batches@w1", ["s1"])]
        assert client.zcard(store.keys.inflight) == 1
        announce(client, store, "w3", "px")
        assert wait_until(lambda: len(celery.sent) == 2, 5), celery.sent
    assert (celery.sent[1][0], celery.sent[1][1]["request_ids"]) == ("t.batches@w3", ["p1"])


def test_a_batch_waits_for_a_worker_of_its_model_while_another_models_worker_takes_its_own() -> None:
    settings = Settings(key_prefix="t", models=MODELS, max_num_seqs=4, request_batch_max_wait_ms=0)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    for i, side in enumerate((64, 80, 96)):  # three sd batches (sizes never share one), then one px request
        submit(client, store.keys, f"s{i}", model="sd", width=side, height=side)
    submit(client, store.keys, "p1", model="px")
    celery = QueuedBatches()
    with running(scheduler(client, settings, celery)):  # type: ignore[arg-type]
        announce(client, store, "w1", "sd")
        announce(client, store, "w2", "px")
        assert wait_until(lambda: len(celery.sent) == 2, 5), celery.sent
        time.sleep(0.5)  # two slots, both taken: one batch of each model, the other sd batches wait aside
        assert [(q, m["request_ids"]) for q, m in celery.sent] == [("t.batches@w1", ["s0"]), ("t.batches@w2", ["p1"])]
        finish_the_batch(client, store, celery.sent[0][1]["batch_id"])
        assert wait_until(lambda: len(celery.sent) == 3, 5), celery.sent
        time.sleep(0.5)
    assert [m["request_ids"] for _, m in celery.sent[2:]] == [["s1"]]


def finish_the_batch(client: fakeredis.FakeRedis, store: SchedulerStore, batch_id: str) -> None:
    """What a worker does with a batch, in short: its requests succeed, it leaves flight, the scheduler is woken."""
    for rid in client.hget(store.keys.batch(batch_id), "ids").split():
        client.hset(store.keys.request(rid), "status", "succeeded")
    client.zrem(store.keys.inflight, batch_id)
    client.xadd(store.keys.events, {"type": "batch_done"})


def test_capacity_reads_the_model_of_a_busy_batch_it_does_not_know_and_forgets_what_left() -> None:
    settings = Settings(key_prefix="t", models=MODELS)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    submit(client, store.keys, "p1", model="px")
    client.hset(store.keys.batch("b1"), "ids", "p1")
    client.zadd(store.keys.inflight, {"b1": 1, "b2": 2, "b3": 3})
    client.zadd(store.keys.storing, {"b3": 3})  # its forward is over: it frees its worker
    known = {"b2": "sd", "gone": "sd"}
    assert store.capacity(known).busy == {"b1": "px", "b2": "sd"}
    assert known == {"b1": "px", "b2": "sd"}


def test_a_batch_goes_to_a_worker_holding_its_model_resident_and_back_to_its_models_queue_when_handed_back() -> None:
    settings = Settings(key_prefix="t", models=MODELS, max_num_seqs=4, request_batch_max_wait_ms=0)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    submit(client, store.keys, "p1", model="px")
    celery = QueuedBatches()
    # announced before the scheduler counts them (a count between the two would see only mux)
    announce(client, store, "mux", "sd", "px", cold=("px",))  # holds sd, would have to load px
    announce(client, store, "w2", "px")  # holds px
    with running(scheduler(client, settings, celery)):  # type: ignore[arg-type]
        assert wait_until(lambda: len(celery.sent) == 1, 5), celery.sent
        assert celery.sent[0][0] == "t.batches@w2"  # placed where px is resident: no load
        announce(client, store, "w2", "px", cold=("px",))  # w2 evicted px meanwhile (a rolling change)
        announce(client, store, "mux", "sd", "px", cold=("sd",))  # mux holds px now
        WorkerStore(client, settings).give_back(celery.sent[0][1]["batch_id"], None)  # handed back, uncounted
        assert wait_until(lambda: len(celery.sent) == 2, 5), celery.sent
    assert celery.sent[1][0] == "t.batches@mux"  # placed again where px is resident now
    assert celery.sent[1][1]["batch_id"] == celery.sent[0][1]["batch_id"]
    assert client.hget(store.keys.batch(celery.sent[1][1]["batch_id"]), "attempts") in (None, "0")


def test_with_every_worker_of_the_model_holding_it_each_batch_takes_a_free_one() -> None:
    settings = Settings(key_prefix="t", models=MODELS, max_num_seqs=4, request_batch_max_wait_ms=0)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    submit(client, store.keys, "p1", model="px", width=64, height=64)
    submit(client, store.keys, "p2", model="px", width=80, height=80)  # another size: a batch of its own
    submit(client, store.keys, "p3", model="px", width=96, height=96)
    celery = QueuedBatches()
    announce(client, store, "w1", "px")
    announce(client, store, "w2", "px")
    with running(scheduler(client, settings, celery)):  # type: ignore[arg-type]
        assert wait_until(lambda: len(celery.sent) == 2, 5), celery.sent
        time.sleep(0.5)  # both busy: p3 waits in the scheduler, not behind one of them
        assert [(q, m["request_ids"]) for q, m in celery.sent] == [("t.batches@w1", ["p1"]), ("t.batches@w2", ["p2"])]
        finish_the_batch(client, store, celery.sent[1][1]["batch_id"])
        assert wait_until(lambda: len(celery.sent) == 3, 5), celery.sent
    assert (celery.sent[2][0], celery.sent[2][1]["request_ids"]) == ("t.batches@w2", ["p3"])  # the one that freed


def test_a_cold_load_is_taken_once_the_wait_at_the_resident_worker_is_over_twice_the_load() -> None:
    settings = Settings(key_prefix="t", models=MODELS, max_num_seqs=4, request_batch_max_wait_ms=0)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    submit(client, store.keys, "p1", model="px", width=64, height=64)
    submit(client, store.keys, "p2", model="px", width=80, height=80)  # another size: a batch of its own
    celery = QueuedBatches()
    # announced before the scheduler counts them (a count between the two would see only mux)
    announce(client, store, "mux", "sd", "px", cold=("px",))  # would load px in 1 s
    announce(client, store, "w2", "px", batch_s=10.0)  # holds px; its batches take 10 s
    with running(scheduler(client, settings, celery)):  # type: ignore[arg-type]
        assert wait_until(lambda: len(celery.sent) == 2, 5), celery.sent
    # p1: w2 is idle (no wait); p2: one px batch ahead at w2, 10 s > 2 x 1 s: mux, free, loads it
    assert [(queue, message["request_ids"]) for queue, message in celery.sent] == [
        ("t.batches@w2", ["p1"]),
        ("t.batches@mux", ["p2"]),
    ]


def test_the_models_backlog_counts_toward_a_cold_load_not_only_its_batches_in_flight() -> None:
    settings = Settings(key_prefix="t", models=MODELS, max_num_seqs=4, request_batch_max_wait_ms=0)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    for n in range(12):  # three batches of px, all waiting when the scheduler starts
        submit(client, store.keys, f"p{n}", model="px")
    celery = QueuedBatches()
    announce(client, store, "mux", "sd", "px", cold=("px",))  # would load px in 1 s
    announce(client, store, "w2", "px", batch_s=2.0)  # holds px; its batches take 2 s
    with running(scheduler(client, settings, celery)):  # type: ignore[arg-type]
        assert wait_until(lambda: len(celery.sent) == 2, 5), celery.sent  # two workers serve px: two slots
    # the first batch: w2 is free, so there; the second: one batch in flight at w2 and one more behind it, 2 x 2 s
    # > 2 x 1 s of load: mux loads px (counting only the batch in flight, 2 s is not over the 2 s margin, and it
    # waited for w2: a backlog never spread px to a second worker)
    assert [queue for queue, _ in celery.sent] == ["t.batches@w2", "t.batches@mux"]


def test_a_batch_placed_on_a_worker_that_went_is_placed_again_without_waiting_for_the_claim_timeout() -> None:
    settings = Settings(key_prefix="t", models=MODELS, max_num_seqs=4, request_batch_max_wait_ms=0)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    submit(client, store.keys, "p1", model="px")
    celery = QueuedBatches()
    # both announced before the scheduler counts them: announced one after the other while it runs, a count between
    # the two sees only mux, and a model held nowhere is loaded where it can be
    announce(client, store, "mux", "sd", "px", cold=("px",))
    announce(client, store, "w2", "px")
    with running(scheduler(client, settings, celery)):  # type: ignore[arg-type]
        assert wait_until(lambda: len(celery.sent) == 1, 5), celery.sent
        assert celery.sent[0][0] == "t.batches@w2"
        client.zadd(store.keys.workers, {"w2": (client.time()[0] - 60) * 1000})  # its last beat: a minute ago
        assert wait_until(lambda: len(celery.sent) == 2, 5), celery.sent
    assert (celery.sent[1][0], celery.sent[1][1]["request_ids"]) == ("t.batches@mux", ["p1"])  # mux loads px
    assert celery.sent[1][1]["batch_id"] == celery.sent[0][1]["batch_id"]
    assert settings.batch_claim_timeout_s >= 30  # published again long before the reaper's claim timeout
