"""Step-mode preemption without a model: the pure decision (``scheduler.policy.preempt``) at exact inputs, the
queue's front placement of a requeued request, ``requeue.lua`` and ``step_evict.lua`` on fakeredis, and the
scheduler's loop sending an eviction to a full set of lower-level requests (and none within a level).

The worker's side (a set evicting and requeueing at a step boundary) is ``tests/unit/test_step_preemption.py``.
"""

from __future__ import annotations

import time
from dataclasses import replace

import fakeredis
import pytest

from gpu_worker.store import Claimed, WorkerStore
from scheduler.lease import Lease
from scheduler.policy import Member, OpenSet, PolicyConfig, Preempt, WaitingRequest, preempt
from scheduler.queue import FcfsQueue, PriorityQueue, QueuedRequest, RequestQueue
from scheduler.step_service import StepSchedulerService
from scheduler.store import SchedulerStore
from shared import keys as k
from shared.compat import step_key
from shared.contracts import BatchMessage, RequestSpec, StepEviction
from shared.fleet_state import accepted_count
from shared.settings import Settings
from tests.unit.test_scheduler_service import PublishedBatches, running, scheduler, wait_until
from tests.unit.test_scripts import submit

CONFIG = PolicyConfig(max_num_seqs=2, max_wait_s=0.5, stable_s=0.125)


def req(rid: str, level: int, key: str = "a", aborted: bool = False) -> WaitingRequest:
    return WaitingRequest(id=rid, key=key, arrived_at=0.0, aborted=aborted, level=level)


def full(worker: str, *members: Member, key: str = "a", **fields: bool) -> OpenSet:
    return OpenSet(worker, key, len(members), members=members, **fields)


# --- the pure decision ------------------------------------------------------------------------------------------


def test_the_head_evicts_the_lowest_level_latest_joined_request_of_a_full_set_of_its_key() -> None:
    sets = [
        full("w1", Member("l1", -2, 100.0), Member("m1", 0, 300.0)),
        full("w2", Member("l2", -2, 200.0), Member("l3", -1, 400.0)),
    ]
    assert preempt([req("h", 2)], sets, 0, CONFIG) == Preempt("w2", "l2")  # both -2: w2's joined later
    assert preempt([req("h", 2)], sets[:1], 0, CONFIG) == Preempt("w1", "l1")  # lowest level before latest join
    # exact ties: the lowest worker name, then the lowest request id
    tied = [full("w2", Member("x", -2, 5.0), Member("y", -2, 5.0)), full("w1", Member("z", -2, 5.0), Member("v", 0))]
    assert preempt([req("h", 0)], tied, 0, CONFIG) == Preempt("w1", "z")
    assert preempt([req("h", 0)], tied[:1], 0, CONFIG) == Preempt("w2", "x")


def test_never_within_a_level_nor_for_a_lower_head() -> None:
    sets = [full("w1", Member("a", 0), Member("b", 1))]
    assert preempt([req("h", 0)], sets, 0, CONFIG) is None  # "a" is at the head's level, "b" above it
    assert preempt([req("h", -1)], sets, 0, CONFIG) is None
    assert preempt([req("h", 1)], sets, 0, CONFIG) == Preempt("w1", "a")


def test_none_when_the_head_can_start_otherwise() -> None:
    low = (Member("l1", -2), Member("l2", -2))
    assert preempt([req("h", 2)], [full("w1", *low)], 1, CONFIG) is None  # a free slot: it opens a set
    room = OpenSet("w1", "a", 1, members=low[:1])
    assert preempt([req("h", 2)], [room], 0, CONFIG) is None  # the set has room: place joins it
    assert preempt([], [full("w1", *low)], 0, CONFIG) is None
    assert preempt([req("h", 2, aborted=True)], [full("w1", *low)], 0, CONFIG) is None


def test_only_from_an_open_set_of_the_heads_key_where_one_eviction_makes_room() -> None:
    low = (Member("l1", -2), Member("l2", -2))
    assert preempt([req("h", 2)], [full("w1", *low, key="b")], 0, CONFIG) is None  # another step key
    assert preempt([req("h", 2)], [full("w1", *low, sealed=True)], 0, CONFIG) is None
    over = OpenSet("w1", "a", 3, members=low)  # 3 counted (one still in its inbox): one eviction leaves it full
    assert preempt([req("h", 2)], [over], 0, CONFIG) is None
    # the first live request is the head: an aborted one ahead of it changes nothing
    assert preempt([req("x", 5, aborted=True), req("h", 2)], [full("w1", *low)], 0, CONFIG) == Preempt("w1", "l1")


def test_one_eviction_at_a_time_per_key() -> None:
    low = (Member("l1", -2), Member("l2", -2))
    pending = [full("w1", *low, evicting=True), full("w2", Member("l3", -2), Member("l4", -2))]
    assert preempt([req("h", 2), req("h2", 2)], pending, 0, CONFIG) is None
    other_key = [full("w1", *low, key="b", evicting=True), full("w2", Member("l3", -2), Member("l4", -1))]
    assert preempt([req("h", 2)], other_key, 0, CONFIG) == Preempt("w2", "l3")


def test_the_pixel_budget_bounds_the_set_as_for_place() -> None:
    config = PolicyConfig(max_num_seqs=8, max_wait_s=0.5, stable_s=0.125, max_batch_cost=8)
    head = WaitingRequest("h", "a", 0.0, cost=4, level=2)  # cap 8 // 4 = 2 requests
    assert preempt([head], [full("w1", Member("l1", -2), Member("l2", -2))], 0, config) == Preempt("w1", "l1")
    three = OpenSet("w1", "a", 3, members=(Member("l1", -2), Member("l2", -2), Member("l3", -2)))
    assert preempt([head], [three], 0, config) is None  # one eviction would leave it at its cap


# --- the queue --------------------------------------------------------------------------------------------------


def queued(rid: str, priority: int = 0) -> QueuedRequest:
    return QueuedRequest(id=rid, entry_id=f"{rid}-0", key="a", arrived_at=0.0, priority=priority)


@pytest.mark.parametrize("queue_type", [PriorityQueue, FcfsQueue])
def test_a_requeued_request_goes_to_the_front_of_its_level(queue_type: type[RequestQueue]) -> None:
    queue = queue_type()
    for request in (queued("l1", -2), queued("h1", 2), queued("l2", -2)):
        queue.add(request)
    queue.add(queued("back", -2), front=True)
    queue.add(queued("l3", -2))
    order = [r.id for r in queue.head(10)]
    if queue_type is PriorityQueue:
        assert order == ["h1", "back", "l1", "l2", "l3"]  # levels first; within -2 the requeued one leads
    else:
        assert order == ["back", "l1", "h1", "l2", "l3"]  # one level: arrival order, the requeued one first
    queue.remove("back")
    assert [r.id for r in queue.head(10)] == [i for i in order if i != "back"]


@pytest.mark.parametrize("queue_type", [PriorityQueue, FcfsQueue])
def test_requeued_requests_keep_their_original_order_at_the_front_of_their_level(
    queue_type: type[RequestQueue],
) -> None:
    """Today's main put each requeued request ahead of the one requeued before it (LIFO within a level)."""
    queue = queue_type()
    queue.add(queued("w1"))
    for rid, arrival in (("r2", (20, 0)), ("r0", (10, 0)), ("r3", (20, 1)), ("r1", (10, 1))):  # evicted in this order
        queue.add(replace(queued(rid), arrival=arrival), front=True)
    queue.add(queued("w2"))
    assert [r.id for r in queue.head(10)] == ["r0", "r1", "r2", "r3", "w1", "w2"]
    queue.remove("r1")
    queue.add(replace(queued("r1"), arrival=(10, 1)), front=True)  # requeued again: its place again
    assert [r.id for r in queue.head(10)] == ["r0", "r1", "r2", "r3", "w1", "w2"]


# --- the scripts ------------------------------------------------------------------------------------------------

WORKER = "w1"


def settings() -> Settings:
    return Settings(key_prefix="t", result_ttl_s=60)


def running_request(client: fakeredis.FakeRedis, rid: str = "r") -> tuple[WorkerStore, str, Lease]:
    """Request ``rid`` (priority -2) submitted, scheduled into batch B1 and claimed by the worker (its token
    returned, and the scheduler's lease), counted in its open set with its level recorded, as the step loop does,
    at step 3 of 4."""
    s = settings()
    store = WorkerStore(client, s)
    submit(client, store.keys, rid, priority=-2)
    lease = Lease(client, store.keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    assert SchedulerStore(client, s).schedule(lease.key, lease.token, "B1", [rid]) == [rid]
    client.xtrim(store.keys.requests, maxlen=0)  # the scheduler acknowledged and deleted the entry
    token = "tok"
    claim = store.claim(BatchMessage(batch_id="B1", request_ids=(rid,), created_at=0.0), token, WORKER)
    assert isinstance(claim, Claimed) and claim.running == [rid]
    store.step_open(WORKER, "digest", 2)
    store.step_levels(WORKER, {rid: -2})
    store.progress([rid], 3, 4, token)
    return store, token, lease


def test_requeue_moves_a_running_request_back_to_queued_under_its_claim_only() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    store, token, lease = running_request(client)
    keys = store.keys
    assert store.requeue("r", "another run", WORKER) == 0  # fenced by the claim token: nothing changes
    assert client.hget(keys.request("r"), "status") == "running" and client.xlen(keys.requests) == 0

    first = client.hget(keys.request("r"), "entry")
    assert store.requeue("r", token, WORKER) == 1
    state = client.hgetall(keys.request("r"))
    assert state["status"] == "queued" and state["step"] == "0"
    for gone in ("claim", "batch_id", "batch_size", "started_at", "worker", "total"):
        assert gone not in state, gone
    [(entry_id, fields)] = client.xrange(keys.requests)
    assert fields["id"] == "r" and fields["requeued"] == "1" and state["entry"] == entry_id
    assert fields["arrival"] == state["arrival"] == first  # its place among requeued requests: its first entry
    assert RequestSpec.model_validate_json(fields["spec"]).priority == -2
    assert SchedulerStore(client, settings())._entry(entry_id, fields).requeued  # read back: front of its level
    events = [fields for _, fields in client.xrange(keys.request_events("r"))]
    assert [e["event"] for e in events] == ["queued", "scheduled", "running", "requeued"]  # progress: throttled
    assert events[-1] == {"event": "requeued", "worker": WORKER, "step": "3"}
    assert client.hget(keys.step_rows, WORKER) == "1"  # counted out of the set
    assert not client.hexists(keys.step_levels(WORKER), "r")
    assert {"type": "room_free", "worker": WORKER} in [f for _, f in client.xrange(keys.events)]
    assert client.hget(keys.metrics, "requeued") == "1"
    assert accepted_count(client.xinfo_stream(keys.requests), client.hgetall(keys.metrics)) == 1  # accepted once

    assert store.requeue("r", token, WORKER) == 1  # a retry after a lost reply: answered again, done once
    assert client.xlen(keys.requests) == 1 and client.hget(keys.step_rows, WORKER) == "1"
    assert accepted_count(client.xinfo_stream(keys.requests), client.hgetall(keys.metrics)) == 1
    # its batch no longer counts it: released, the batch leaves flight
    assert store.batch_done("B1", token)
    assert client.zscore(keys.inflight, "B1") is None
    # and it can be scheduled again like any queued request
    assert SchedulerStore(client, settings()).schedule(lease.key, lease.token, "B2", ["r"]) == ["r"]


def test_requests_requeued_one_after_another_are_served_in_their_original_order() -> None:
    """Today's main put each requeued request ahead of the one requeued before it: a and b, requeued in that
    order, came back as b, a."""
    client = fakeredis.FakeRedis(decode_responses=True)
    s = Settings(key_prefix="t", result_ttl_s=60, max_num_seqs=4, request_batch_max_wait_ms=0, scheduler_lease_ms=600)
    store = WorkerStore(client, s)
    submit(client, store.keys, "a", "b", "c")
    lease = Lease(client, store.keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    assert SchedulerStore(client, s).schedule(lease.key, lease.token, "B1", ["a", "b", "c"]) == ["a", "b", "c"]
    lease.release()
    client.xtrim(store.keys.requests, maxlen=0)  # the scheduler acknowledged and deleted the entries
    claim = store.claim(BatchMessage(batch_id="B1", request_ids=("a", "b", "c"), created_at=0.0), "tok", WORKER)
    assert isinstance(claim, Claimed)
    store.step_open(WORKER, "digest", 3)
    store.step_levels(WORKER, {"a": 0, "b": 0, "c": 0})
    for rid in ("c", "a", "b"):  # evicted one at a time, in this order
        assert store.requeue(rid, "tok", WORKER) == 1
    assert store.batch_done("B1", "tok")  # B1 no longer counts them: it leaves flight
    assert store.step_close(WORKER)  # and the emptied set closes: the worker's slot is free
    arrivals = {client.hget(store.keys.request(rid), "arrival") for rid in "abc"}
    assert len(arrivals) == 3  # each its first entry's id (the one submit.lua wrote)
    submit(client, store.keys, "later")
    celery = PublishedBatches()
    client.zadd(store.keys.workers, {WORKER: time.time() * 1000})
    with running(scheduler(client, s, celery)):
        assert wait_until(lambda: len(celery.request_ids()) == 4, 5), celery.batches
    assert celery.request_ids() == ["a", "b", "c", "later"]


def test_requeue_leaves_a_request_flagged_aborted_to_be_ended_so() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    store, token, _ = running_request(client)
    client.hset(store.keys.request("r"), "abort", 1)
    assert store.requeue("r", token, WORKER) == 2
    assert client.hget(store.keys.request("r"), "status") == "running"
    assert client.xlen(store.keys.requests) == 0 and client.hget(store.keys.step_rows, WORKER) == "2"


def test_step_evict_is_sent_only_to_the_open_set_that_runs_the_request() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    store, _, _ = running_request(client)
    sched = SchedulerStore(client, settings())
    assert not sched.step_evict(WORKER, "other digest", "r")
    assert not sched.step_evict(WORKER, "digest", "not running there")
    assert not client.exists(store.keys.step_inbox(WORKER))
    assert sched.step_evict(WORKER, "digest", "r")
    [raw] = client.lrange(store.keys.step_inbox(WORKER), 0, -1)
    assert StepEviction.model_validate_json(raw) == StepEviction(evict="r")
    assert client.pttl(store.keys.step_inbox(WORKER)) > 0
    client.hset(store.keys.step_sets, WORKER, k.STEP_SEALED)
    assert not sched.step_evict(WORKER, "digest", "r")  # sealed: its room would go to no one
    [member] = sched.step_levels([WORKER])[WORKER]
    assert (member.request_id, member.priority) == ("r", -2) and member.joined_ms > 0


# --- the scheduler's loop ---------------------------------------------------------------------------------------


def loop_settings(policy: str = "priority") -> Settings:
    return Settings(
        key_prefix="t",
        step_mode=True,
        max_num_seqs=2,
        request_batch_max_wait_ms=0,
        scheduler_lease_ms=60_000,
        scheduling_policy=policy,  # type: ignore[arg-type]
    )


def digest() -> str:
    spec = RequestSpec(id="x", model="demo", prompt="x", seed=1, width=64, height=64, num_inference_steps=4,
                       guidance_scale=5.0, created_at=0.0)  # fmt: skip
    return step_key(spec).digest


def full_set(client: fakeredis.FakeRedis, keys: k.RedisKeys, priorities: dict[str, int]) -> None:
    """Worker w1, alive, runs a full set (max_num_seqs 2) of ``priorities``' requests, the later joined last."""
    client.zadd(keys.workers, {WORKER: time.time() * 1000})
    client.hset(keys.step_sets, WORKER, digest())
    client.hset(keys.step_rows, WORKER, len(priorities))
    for joined, (rid, priority) in enumerate(priorities.items()):
        client.hset(keys.step_levels(WORKER), rid, f"{priority} {1000 + joined}")


@pytest.mark.parametrize("policy", ["priority", "fair", "fcfs"])
def test_the_scheduler_asks_a_full_set_to_evict_its_latest_lower_level_request(policy: str) -> None:
    s = loop_settings(policy)
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = k.RedisKeys("t")
    full_set(client, keys, {"low1": -2, "low2": -2})
    celery = PublishedBatches()
    with running(scheduler(client, s, celery)):
        submit(client, keys, "high", priority=2)
        sent = wait_until(lambda: client.llen(keys.step_inbox(WORKER)) > 0, 1 if policy == "fcfs" else 3)
        time.sleep(0.6)  # several rounds: one eviction only (it is pending until the set requeues it)
    inbox = client.lrange(keys.step_inbox(WORKER), 0, -1)
    if policy == "fcfs":  # one level: nothing preempts
        assert not sent and inbox == []
    else:
        assert [StepEviction.model_validate_json(m).evict for m in inbox] == ["low2"]
    assert client.hget(keys.request("high"), "status") == "queued" and celery.batches == []


def test_the_scheduler_never_preempts_within_a_level_and_joins_the_freed_room() -> None:
    s = loop_settings()
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = k.RedisKeys("t")
    full_set(client, keys, {"peer1": 2, "peer2": 2})
    celery = PublishedBatches()
    with running(scheduler(client, s, celery)):
        submit(client, keys, "high", priority=2)
        time.sleep(0.6)
        assert client.llen(keys.step_inbox(WORKER)) == 0  # its level: it waits
        # a peer leaves (as the worker counts it out): the waiting request joins the freed room
        client.hincrby(keys.step_rows, WORKER, -1)
        client.hdel(keys.step_levels(WORKER), "peer1")
        client.xadd(keys.events, {"type": "room_free", "worker": WORKER})
        assert wait_until(lambda: client.llen(keys.step_inbox(WORKER)) == 1, 3)
    [raw] = client.lrange(keys.step_inbox(WORKER), 0, -1)
    assert BatchMessage.model_validate_json(raw).request_ids == ("high",)


@pytest.mark.parametrize("policy", ["priority", "fair"])
def test_a_new_head_looks_for_a_victim_at_once_though_a_stuck_head_just_looked(policy: str) -> None:
    s = loop_settings(policy)
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = k.RedisKeys("t")
    full_set(client, keys, {"low1": -2, "low2": -2})
    celery = PublishedBatches()
    store = SchedulerStore(client, s)
    lease = Lease(client, store.keys.scheduler_lease, s.scheduler_lease_ms)
    # its clock barely moves: the members' throttle never lapses here, so only a new head reads them again
    slow = StepSchedulerService(s, store, lease, celery, clock=lambda: time.monotonic() / 1000)  # type: ignore[arg-type]
    with running(slow):
        submit(client, keys, "peer", priority=-2)  # stuck (its own level runs there): it reads the members
        time.sleep(0.3)
        assert client.llen(keys.step_inbox(WORKER)) == 0
        submit(client, keys, "high", priority=2)  # the new head: no worker event comes to wake the loop
        assert wait_until(lambda: client.llen(keys.step_inbox(WORKER)) > 0, 3)
    inbox = client.lrange(keys.step_inbox(WORKER), 0, -1)
    assert [StepEviction.model_validate_json(m).evict for m in inbox] == ["low2"]
