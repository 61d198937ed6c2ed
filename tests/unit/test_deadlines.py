"""Priorities and deadlines: the pure overdue rule, ``expire.lua`` and ``schedule.lua``'s deadlines on fakeredis,
and the scheduler's loop on fakeredis (priority order, a queued request's expiry, a running one's abort).

Celery's publish is the one stand-in (``PublishedBatches``, as in test_scheduler_service.py); every other part is
the production code over fakeredis.
"""

from __future__ import annotations

import time
from typing import Any

import fakeredis
import pytest

from gpu_worker.store import Claimed, RowSignal, WorkerStore
from scheduler.deadlines import RAN_PAST, InFlightRequest, overdue
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared import keys as k
from shared.contracts import TIMEOUT_ERROR, BatchMessage, RequestSpec, RequestStatus
from shared.settings import Settings
from shared.state import STATE_FIELDS, parse_state
from shared.submit_call import SubmitGroup, SubmitRow, submit_call
from tests.unit.test_scheduler_service import PublishedBatches, running, scheduler, wait_until


def spec(rid: str, **fields: Any) -> RequestSpec:
    values: dict[str, Any] = {
        "id": rid,
        "model": "demo",
        "prompt": rid,
        "seed": 1,
        "width": 64,
        "height": 64,
        "num_inference_steps": 4,
        "guidance_scale": 5.0,
        "created_at": time.time(),
        **fields,
    }
    return RequestSpec(**values)


def submit(client: fakeredis.FakeRedis, keys: k.RedisKeys, *specs: RequestSpec) -> None:
    """``submit.lua`` as the api calls it (``api.store.RequestStore.submit``), without an API key."""
    group = SubmitGroup(tuple(SubmitRow(one.id, one.model_dump_json(), one.created_at) for one in specs))
    call_keys, args = submit_call(keys, [group], max_queue_len=1000, set_ttl_s=60, max_input_bytes=None)
    script = client.register_script(k.SUBMIT)
    assert script(keys=call_keys, args=args) == [1]


def state(client: fakeredis.FakeRedis, keys: k.RedisKeys, rid: str) -> Any:
    values = client.hmget(keys.request(rid), STATE_FIELDS)
    return parse_state({f: v for f, v in zip(STATE_FIELDS, values, strict=True) if v is not None})


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


@pytest.fixture
def settings() -> Settings:
    return Settings(key_prefix="t", max_num_seqs=4, scheduler_lease_ms=600, result_ttl_s=60)


def beat(client: fakeredis.FakeRedis, keys: k.RedisKeys, worker: str = "w") -> None:
    client.zadd(keys.workers, {worker: time.time() * 1000})


# --- the pure rule ------------------------------------------------------------------------------------------


def test_overdue_picks_unflagged_scheduled_or_running_requests_at_or_past_their_deadline() -> None:
    requests = [
        InFlightRequest("due-running", RequestStatus.RUNNING, 10.0, abort=False),
        InFlightRequest("due-scheduled", RequestStatus.SCHEDULED, 9.0, abort=False),
        InFlightRequest("not-yet", RequestStatus.RUNNING, 10.5, abort=False),
        InFlightRequest("no-deadline", RequestStatus.RUNNING, None, abort=False),
        InFlightRequest("flagged", RequestStatus.RUNNING, 1.0, abort=True),
        InFlightRequest("finished", RequestStatus.SUCCEEDED, 1.0, abort=False),
        InFlightRequest("gone", None, 1.0, abort=False),
    ]
    assert overdue(requests, now=10.0) == ["due-running", "due-scheduled"]


# --- the scripts ----------------------------------------------------------------------------------------------


def test_expire_fails_what_has_not_started_and_flags_what_runs(client: fakeredis.FakeRedis, settings: Settings) -> None:
    store = SchedulerStore(client, settings)
    keys = store.keys
    submit(client, keys, *(spec(rid, timeout_s=1.0) for rid in ("queued", "sched", "run", "flagged", "done")))
    lease = Lease(client, keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    assert store.schedule(lease.key, lease.token, "B1", ["sched", "run", "flagged", "done"], [1.5, 2.5, 3.5, None])
    assert client.hget(keys.request("sched"), "deadline") == "1.5"  # recorded for the in-flight sweep
    assert not client.hexists(keys.request("done"), "deadline")
    worker = WorkerStore(client, settings)
    claimed = worker.claim(BatchMessage(batch_id="B1", request_ids=("run", "flagged", "done"), created_at=0), "t", "w")
    assert isinstance(claimed, Claimed)
    client.hset(keys.request("flagged"), "abort", 1)  # a client aborted it already
    worker.finish_many({"done": []}, {}, "t")
    client.hset(keys.request("queued"), "input_image", "png bytes")

    statuses = store.expire(["queued", "sched", "run", "flagged", "done", "unknown"])

    assert statuses == ["failed", "failed", "aborting", "running", "succeeded", "missing"]
    for rid in ("queued", "sched"):
        failed = state(client, keys, rid)
        assert failed.status is RequestStatus.FAILED and failed.error.type == TIMEOUT_ERROR
        assert 0 < client.ttl(keys.request(rid)) <= 60
        assert [e["event"] for _, e in client.xrange(keys.request_events(rid))][-1] == "failed"
    assert not client.hexists(keys.request("queued"), "input_image")
    assert client.hget(keys.metrics, f"failed:{TIMEOUT_ERROR}") == "2"
    assert client.hget(keys.request("run"), "abort") == "1"
    assert client.hget(keys.request("run"), "error_message") == RAN_PAST
    assert not client.hexists(keys.request("flagged"), "error_type")  # a client's abort stays a client's abort
    # the worker learns it at its next step report, and the run ends aborted, its error saying why
    assert worker.progress(["run"], 2, 4, "t") == [RowSignal.ABORTED]
    assert worker.finish_many({"run": []}, {}, "t") == {"run": RequestStatus.ABORTED}
    aborted = state(client, keys, "run")
    assert aborted.status is RequestStatus.ABORTED and aborted.error.type == TIMEOUT_ERROR
    assert store.expire(["run", "queued"]) == ["aborted", "failed"]  # only ever forward


def test_a_request_put_aside_by_the_split_is_ended_at_its_deadline_at_once(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    """Put aside after a lost run (running, no claim token: it waits for the other half), it runs nowhere: past its
    deadline it ends ``aborted`` with error ``Timeout`` now (before: flagged only, it ended at a later claim)."""
    store, worker = SchedulerStore(client, settings), WorkerStore(client, settings)
    keys = store.keys
    submit(client, keys, spec("a"), spec("b", timeout_s=1.0))
    lease = Lease(client, keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    store.schedule(lease.key, lease.token, "B1", ["a", "b"], [None, 1.0])
    batch = BatchMessage(batch_id="B1", request_ids=("a", "b"), created_at=0)
    assert isinstance(worker.claim(batch, "t1", "w"), Claimed)
    client.delete(keys.batch_lock("B1"))  # the run died
    second = worker.claim(batch, "t2", "w")
    assert isinstance(second, Claimed) and second.running == ["a"]  # b put aside

    assert store.expire(["b"]) == ["aborted"]

    ended = state(client, keys, "b")
    assert ended.status is RequestStatus.ABORTED and ended.error.type == TIMEOUT_ERROR
    assert ended.error.message == RAN_PAST
    assert 0 < client.ttl(keys.request("b")) <= 60
    assert [e["event"] for _, e in client.xrange(keys.request_events("b"))][-1] == "aborted"
    assert worker.finish_many({"a": []}, {}, "t2") == {"a": RequestStatus.SUCCEEDED}
    assert worker.batch_done("B1", "t2")  # nothing left waiting: no later claim needed


def test_in_flight_reads_the_requests_of_every_batch_in_flight(client: fakeredis.FakeRedis, settings: Settings) -> None:
    store = SchedulerStore(client, settings)
    submit(client, store.keys, spec("a", timeout_s=5.0), spec("b"), spec("c", timeout_s=7.0))
    lease = Lease(client, store.keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    store.schedule(lease.key, lease.token, "B1", ["a", "b"], [105.0, None])
    store.schedule(lease.key, lease.token, "B2", ["c"], [107.0])
    found = {r.id: r for r in store.in_flight()}
    assert found == {
        "a": InFlightRequest("a", RequestStatus.SCHEDULED, 105.0, abort=False),
        "b": InFlightRequest("b", RequestStatus.SCHEDULED, None, abort=False),
        "c": InFlightRequest("c", RequestStatus.SCHEDULED, 107.0, abort=False),
    }
    assert overdue(found.values(), now=106.0) == ["a"]


# --- the loop ---------------------------------------------------------------------------------------------------


def test_a_high_priority_request_overtakes_a_queued_backlog(client: fakeredis.FakeRedis, settings: Settings) -> None:
    store = SchedulerStore(client, settings)
    backlog = [spec(f"n{i}") for i in range(8)]
    submit(client, store.keys, *backlog, spec("low", priority=-1), spec("high", priority=2))
    celery = PublishedBatches()
    with running(scheduler(client, settings, celery)):
        beat(client, store.keys)  # one slot: one batch at a time, each finished by hand
        for _ in range(4):
            assert wait_until(lambda: client.zcard(store.keys.inflight) == 1, 5), celery.batches
            batch_id = client.zrange(store.keys.inflight, 0, -1)[0]
            for rid in client.hget(store.keys.batch(batch_id), "ids").split():
                client.hset(store.keys.request(rid), "status", "succeeded")
            client.zrem(store.keys.inflight, batch_id)
            client.xadd(store.keys.events, {"type": "batch_done"})
    # the high request first and alone (levels do not share a batch); FIFO within the normal level; the low one last
    assert [b["request_ids"] for b in celery.batches] == [
        ["high"],
        ["n0", "n1", "n2", "n3"],
        ["n4", "n5", "n6", "n7"],
        ["low"],
    ]


def test_a_queued_request_past_its_deadline_fails_with_timeout(client: fakeredis.FakeRedis, settings: Settings) -> None:
    store = SchedulerStore(client, settings)
    with running(scheduler(client, settings, PublishedBatches())):  # no worker: nothing can start
        # submitted once it leads (a loaded host may take a second to start it), so the deadline is the loop's
        assert wait_until(lambda: client.exists(store.keys.scheduler_lease), 5)
        submit(client, store.keys, spec("patient"), spec("hasty", timeout_s=0.3))
        started = time.monotonic()
        assert wait_until(lambda: client.hget(store.keys.request("hasty"), "status") == "failed", 5)
    waited = time.monotonic() - started
    hasty = state(client, store.keys, "hasty")
    assert hasty.error.type == TIMEOUT_ERROR
    assert hasty.finished_at - hasty.spec.created_at == pytest.approx(0.3, abs=0.25)  # woken for it, not polled
    assert waited < 2.0
    assert client.hget(store.keys.request("patient"), "status") == "queued"
    assert [e["id"] for _, e in client.xrange(store.keys.requests)] == ["patient"]  # its entry is gone


def test_a_running_request_past_its_deadline_is_aborted(client: fakeredis.FakeRedis, settings: Settings) -> None:
    store = SchedulerStore(client, settings)
    # a deadline a loaded host dispatches well within (at 0.5 s, "slow" once expired queued before the first batch)
    submit(client, store.keys, spec("slow", timeout_s=2.0), spec("other"))
    celery = PublishedBatches()
    worker = WorkerStore(client, settings)
    with running(scheduler(client, settings, celery)):
        beat(client, store.keys)
        assert wait_until(lambda: celery.batches, 5)
        batch = BatchMessage.model_validate(celery.batches[0])
        assert batch.request_ids == ("slow", "other")
        assert isinstance(worker.claim(batch, "tok", "w"), Claimed)
        # the sweep runs with the reaper, about every second
        assert wait_until(lambda: client.hget(store.keys.request("slow"), "abort") == "1", 5)
    assert worker.progress(["slow", "other"], 1, 4, "tok") == [RowSignal.ABORTED, RowSignal.GO_ON]
    assert client.hget(store.keys.request("slow"), "error_type") == TIMEOUT_ERROR
    assert not client.hexists(store.keys.request("other"), "abort")
