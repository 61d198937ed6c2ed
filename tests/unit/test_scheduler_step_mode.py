"""The scheduler's loop in step mode on fakeredis: requests of one step key (different steps, guidance and output
counts) join a worker's open running set through its inbox; sealed, full or refusing sets send them to Celery.

Celery's publish is the one stand-in, as in ``test_scheduler_service``: ``PublishedBatches`` records ``send_task``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import fakeredis
import pytest

from scheduler.lease import Lease
from scheduler.service import SchedulerService
from scheduler.step_service import StepSchedulerService, service_for
from scheduler.store import SchedulerStore
from shared.compat import step_key
from shared.contracts import BatchMessage, RequestSpec
from shared.settings import Settings
from tests.unit.test_scheduler_service import PublishedBatches, running, scheduler, wait_until
from tests.unit.test_scripts import submit

# one step key, three different compatibility keys
MIXED: dict[str, dict[str, object]] = {
    "a": {"num_inference_steps": 4, "guidance_scale": 5.0},
    "b": {"num_inference_steps": 8, "guidance_scale": 2.0, "n": 2},
    "c": {"num_inference_steps": 2, "guidance_scale": 1.0},
}


def digest() -> str:
    """The step key digest of the requests ``submit`` makes (64x64 on ``demo``)."""
    spec = RequestSpec(id="x", model="demo", prompt="x", seed=1, width=64, height=64, num_inference_steps=4,
                       guidance_scale=5.0, created_at=0.0)  # fmt: skip
    return step_key(spec).digest


def settings_for(step_mode: bool) -> Settings:
    return Settings(
        key_prefix="t", step_mode=step_mode, max_num_seqs=4, request_batch_max_wait_ms=0, scheduler_lease_ms=60_000
    )


def setup(
    client: fakeredis.FakeRedis,
    store: SchedulerStore,
    set_value: str,
    rows: int,
    idle: tuple[str, ...] = ("w2", "w3"),
    queued: dict[str, dict[str, object]] = MIXED,
) -> None:
    """Live workers w1 (running a set: ``set_value`` = a digest or ``sealed``, ``rows`` requests) and ``idle``,
    and the ``queued`` requests (by default the MIXED ones) queued."""
    now_ms = time.time() * 1000
    client.zadd(store.keys.workers, dict.fromkeys(("w1", *idle), now_ms))
    client.hset(store.keys.step_sets, "w1", set_value)
    client.hset(store.keys.step_rows, "w1", rows)
    for rid, fields in queued.items():
        submit(client, store.keys, rid, **fields)


Scene = tuple[Settings, fakeredis.FakeRedis, SchedulerStore, PublishedBatches]


def scene(
    set_value: str,
    rows: int,
    *,
    step_mode: bool = True,
    idle: tuple[str, ...] = ("w2", "w3"),
    queued: dict[str, dict[str, object]] = MIXED,
) -> Scene:
    """Settings, a fresh Redis set up by ``setup``, the scheduler's store, and what it publishes to Celery."""
    settings = settings_for(step_mode=step_mode)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    setup(client, store, set_value, rows, idle, queued)
    return settings, client, store, PublishedBatches()


def inbox(client: fakeredis.FakeRedis, store: SchedulerStore) -> list[BatchMessage]:
    return [BatchMessage.model_validate_json(m) for m in client.lrange(store.keys.step_inbox("w1"), 0, -1)]


def published_without_a_join(scene: Scene, batches: int, rows: int) -> list[list[str]]:
    """Runs the scheduler until it has published ``batches`` batches to Celery (and a moment more, for any more),
    checks that nothing joined w1's set (no inbox, still ``rows`` requests counted), and returns the batches'
    request ids."""
    settings, client, store, celery = scene
    with running(scheduler(client, settings, celery)):
        assert wait_until(lambda: len(celery.batches) == batches, 5)
        time.sleep(0.2)
    assert not client.exists(store.keys.step_inbox("w1"))
    assert client.hget(store.keys.step_rows, "w1") == str(rows)
    return [batch["request_ids"] for batch in celery.batches]


def test_compatible_requests_with_different_steps_join_the_open_set_as_one_batch() -> None:
    settings, client, store, celery = scene(digest(), 1)
    with running(scheduler(client, settings, celery)):
        assert wait_until(lambda: client.llen(store.keys.step_inbox("w1")) == 1, 5)
        assert wait_until(lambda: client.xlen(store.keys.requests) == 0, 5)  # acknowledged after the join
    [message] = inbox(client, store)
    assert message.request_ids == ("a", "b", "c")  # room 4 - 1 = 3: all of them
    assert client.hget(store.keys.step_rows, "w1") == "4"
    assert client.zscore(store.keys.storing, message.batch_id) is not None
    assert client.zscore(store.keys.inflight, message.batch_id) is not None
    for rid in MIXED:
        assert client.hmget(store.keys.request(rid), ["status", "batch_id"]) == ["scheduled", message.batch_id]
    assert celery.batches == []


def test_a_join_takes_only_the_sets_room_and_the_rest_waits_for_a_slot() -> None:
    settings, client, store, celery = scene(digest(), 2)
    with running(scheduler(client, settings, celery)):
        assert wait_until(lambda: celery.request_ids() == ["c"], 5), celery.batches  # free slots: w2, w3
    assert [m.request_ids for m in inbox(client, store)] == [("a", "b")]
    assert client.hget(store.keys.step_rows, "w1") == "4"


@pytest.mark.parametrize("set_value, rows", [("sealed", 1), ("digest", 4), ("0000000000000000", 0)])
def test_a_sealed_full_or_other_key_set_leaves_the_requests_to_celery(set_value: str, rows: int) -> None:
    world = scene(digest() if set_value == "digest" else set_value, rows)
    assert published_without_a_join(world, 1, rows) == [["a", "b", "c"]]  # one step key: one batch


def test_a_set_sealed_after_it_was_read_refuses_the_join_and_the_batch_goes_to_celery() -> None:
    """The scheduler trusts its read of the sets for a while (here: its clock stands still); STEP_JOIN re-checks."""
    settings, client, store, celery = scene(digest(), 0, idle=(), queued={})
    frozen: Callable[[], float] = lambda: 100.0  # noqa: E731 - the cached sets never go stale
    lease = Lease(client, store.keys.scheduler_lease, settings.scheduler_lease_ms)
    service = StepSchedulerService(settings, store, lease, celery, clock=frozen)
    with running(service):
        submit(client, store.keys, "a")
        assert wait_until(lambda: client.llen(store.keys.step_inbox("w1")) == 1, 5)
        client.hset(store.keys.step_sets, "w1", "sealed")  # the worker sealed its set
        submit(client, store.keys, "b", num_inference_steps=8)
        assert wait_until(lambda: celery.request_ids() == ["b"], 5), celery.batches
    assert [m.request_ids for m in inbox(client, store)] == [("a",)]
    assert client.hget(store.keys.step_rows, "w1") == "1"
    batch_id = str(client.hget(store.keys.request("b"), "batch_id"))
    assert celery.batches[0]["batch_id"] == batch_id
    assert client.zscore(store.keys.storing, batch_id) is None  # a batch of its own: it takes a slot


def test_request_level_mode_ignores_open_sets_and_splits_by_compatibility_key() -> None:
    world = scene(digest(), 1, step_mode=False)
    # two batches, in two free slots (w1's set holds its own)
    assert published_without_a_join(world, 2, 1) == [["a"], ["b"]]


@pytest.mark.parametrize("step_mode", [True, False])
def test_a_service_refuses_settings_of_the_other_mode(step_mode: bool) -> None:
    """Built directly with the other mode's settings, a service says so instead of quietly running its own mode."""
    settings, client, store, celery = scene(digest(), 0, step_mode=step_mode, idle=(), queued={})
    lease = Lease(client, store.keys.scheduler_lease, settings.scheduler_lease_ms)
    other = SchedulerService if step_mode else StepSchedulerService
    with pytest.raises(ValueError, match="service_for"):
        other(settings, store, lease, celery)
    assert isinstance(service_for(settings)(settings, store, lease, celery), SchedulerService)
