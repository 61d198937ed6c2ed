"""The fair order's swap in step mode without a model: the pure decision (``scheduler.policy.swap``) at exact
inputs, ``step_swap.lua`` on fakeredis, and the scheduler's loop swapping a waiting request of one API key into a
full set of another key's requests (its batch and the eviction sent together).

The worker's side (the eviction honoured in a sealed set, the batch held back a boundary when its request is in its
last step) is ``tests/unit/test_step_preemption.py``; the latency it buys, ``python -m bench fairness``.
"""

from __future__ import annotations

import time
from dataclasses import replace

import fakeredis
import pytest

from scheduler.policy import Member, OpenSet, PolicyConfig, Swap, WaitingRequest, swap
from scheduler.store import SchedulerStore
from shared import keys as k
from shared.contracts import BatchMessage, StepEviction
from tests.unit.test_preemption import WORKER, digest, loop_settings, running_request, settings
from tests.unit.test_scheduler_service import PublishedBatches, running, scheduler, wait_until
from tests.unit.test_scripts import submit

CONFIG = PolicyConfig(max_num_seqs=4, max_wait_s=0.5, stable_s=0.125)
FLOOD, PROBE, THIRD = ("m", "flood"), ("m", "probe"), ("m", "third")


def req(rid: str, flow: tuple[str, str], level: int = 0, key: str = "a") -> WaitingRequest:
    return WaitingRequest(id=rid, key=key, arrived_at=0.0, level=level, flow=flow)


def member(rid: str, flow: tuple[str, str] | None, joined: float = 0.0, level: int = 0) -> Member:
    return Member(rid, level, joined, flow)


def flooded(worker: str, *members: Member, key: str = "a", **fields: object) -> OpenSet:
    return OpenSet(worker, key, len(members), members=members, **fields)  # type: ignore[arg-type]


def floods(worker: str, count: int, start: float = 0.0) -> tuple[Member, ...]:
    return tuple(member(f"{worker}-f{i}", FLOOD, start + i) for i in range(count))


def rows_sent(client: fakeredis.FakeRedis, inbox: str) -> int:
    """How many requests the batches in a worker's step inbox carry."""
    return sum(len(BatchMessage.model_validate_json(m).request_ids) for m in client.lrange(inbox, 0, -1))


# --- the pure decision ------------------------------------------------------------------------------------------


def test_a_request_behind_the_flooding_head_takes_the_latest_joined_row_of_the_flow_running_most() -> None:
    sets = [flooded("w1", *floods("w1", 4)), flooded("w2", *floods("w2", 4, start=10.0))]
    waiting = [req("f9", FLOOD), req("p1", PROBE)]  # the head is the flood's: it may take no row of its own flow
    assert swap(waiting, sets, 0, CONFIG) == Swap(worker="w2", request_id="w2-f3", joiner="p1")


def test_a_flow_takes_a_row_only_from_one_running_at_least_two_more() -> None:
    probes = (member("p1", PROBE), member("p2", PROBE))
    # probe 2, flood 4, third 2 (two full sets): the probe takes one of the flood's (then 3, 3 and 2)
    thirds = (member("t0", THIRD), member("t1", THIRD))
    sets = [flooded("w1", *probes, *floods("w1", 2)), flooded("w2", *floods("w2", 2), *thirds)]
    assert swap([req("p3", PROBE)], sets, 0, CONFIG) == Swap("w1", "w1-f1", "p3")  # ties: the lowest worker
    # probe 3, flood 4, third 1: one more would make 4 and 3, and the flood would take it back
    sets = [
        flooded("w1", *probes, member("p3", PROBE), *floods("w1", 1)),
        flooded("w2", *floods("w2", 3), member("t1", THIRD)),
    ]
    assert swap([req("p4", PROBE)], sets, 0, CONFIG) is None
    # the third flow, running 1, takes a row of the flow running most (the flood's latest joined)
    assert swap([req("p4", PROBE), req("t2", THIRD)], sets, 0, CONFIG) == Swap("w2", "w2-f2", "t2")


def test_requests_sent_and_not_yet_members_count_for_their_flow_but_are_never_evicted() -> None:
    # the probe's requests on their way count: 3 (none running yet) against the flood's 4
    sets = [OpenSet("w1", "a", 4, members=floods("w1", 2), pending=(PROBE, PROBE)),
            OpenSet("w2", "a", 4, members=floods("w2", 2), pending=(PROBE,))]  # fmt: skip
    assert swap([req("p4", PROBE)], sets, 0, CONFIG) is None
    assert swap([req("p4", PROBE)], [replace(s, pending=()) for s in sets], 0, CONFIG) == Swap("w1", "w1-f1", "p4")
    # a set whose rows all left at once has no one to evict until its joiners (on their way) show among its members
    sets = [OpenSet("w1", "a", 4, pending=(FLOOD,) * 4), flooded("w2", *floods("w2", 4))]
    assert swap([req("p1", PROBE)], sets, 0, CONFIG) == Swap("w2", "w2-f3", "p1")
    assert swap([req("p1", PROBE)], sets[:1], 0, CONFIG) is None


def test_never_when_the_head_can_start_otherwise_nor_into_a_set_that_cannot_take_it() -> None:
    sets = [flooded("w1", *floods("w1", 4))]
    waiting = [req("p1", PROBE)]
    assert swap(waiting, sets, 1, CONFIG) is None  # a free slot: the policy starts a batch there
    assert swap(waiting, [flooded("w1", *floods("w1", 3))], 0, CONFIG) is None  # room: place joins it
    assert swap(waiting, [flooded("w1", *floods("w1", 4), evicting=True)], 0, CONFIG) is None  # one at a time
    assert swap(waiting, [flooded("w1", *floods("w1", 4), sealed=True)], 0, CONFIG) is None
    assert swap(waiting, [flooded("w1", *floods("w1", 4), key="b")], 0, CONFIG) is None  # another step key
    over = OpenSet("w1", "a", 5, members=floods("w1", 4))  # a swap's joiner on its way: no room for another
    assert swap(waiting, [over], 0, CONFIG) is None
    assert swap(waiting, [flooded("w1", *(member(f"u{i}", None) for i in range(4)))], 0, CONFIG) is None  # unknown


def test_only_within_the_heads_level_and_only_members_of_that_level() -> None:
    sets = [flooded("w1", *floods("w1", 4))]
    assert swap([req("h", FLOOD, level=2), req("p1", PROBE)], sets, 0, CONFIG) is None  # p1 is below the head
    lower = [flooded("w1", *(member(f"f{i}", FLOOD, level=-1) for i in range(4)))]
    assert swap([req("p1", PROBE)], lower, 0, CONFIG) is None  # preempt's (a lower level), not swap's


@pytest.mark.parametrize("tried", [1, 3])
def test_a_flow_tried_once_is_not_tried_again_and_the_first_that_may_takes_it(tried: int) -> None:
    sets = [flooded("w1", *floods("w1", 2), member("t1", THIRD, 5.0), member("t2", THIRD, 6.0))]
    waiting = [req(f"t{i}", THIRD) for i in range(3, 3 + tried)] + [req("p1", PROBE), req("p2", PROBE)]
    assert swap(waiting, sets, 0, CONFIG) == Swap("w1", "t2", "p1")  # 2 and 2 ahead: the latest joined, p1 first


# --- step_swap.lua ------------------------------------------------------------------------------------------


def empty_sets(client: fakeredis.FakeRedis, keys: k.RedisKeys, *workers: str) -> None:
    """Each of ``workers`` live with an empty running set of ``digest()`` open."""
    for worker in workers:
        client.zadd(keys.workers, {worker: time.time() * 1000})
        client.hset(keys.step_sets, worker, digest())
        client.hset(keys.step_rows, worker, 0)


def test_step_swap_sends_the_eviction_ahead_of_the_batch_or_a_plain_join_when_its_request_left() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    store, _, _ = running_request(client)  # r runs in w1's set of "digest", counted 2 (cap 2 below)
    client.hset(store.keys.step_rows, WORKER, 2)
    client.zadd(store.keys.workers, {WORKER: time.time() * 1000})
    sched = SchedulerStore(client, settings())
    inbox = store.keys.step_inbox(WORKER)
    message = BatchMessage(batch_id="B2", request_ids=("p",), created_at=0.0).model_dump_json()
    assert sched.step_swap(WORKER, "other digest", message, "B2", 1, 2, "r") == 0
    assert sched.step_swap(WORKER, "digest", message, "B2", 2, 2, "r") == 0  # two joiners for one room
    assert not client.exists(inbox)
    assert sched.step_swap(WORKER, "digest", message, "B2", 1, 2, "r") == 2
    eviction, batch = client.lrange(inbox, 0, -1)
    assert StepEviction.model_validate_json(eviction) == StepEviction(evict="r", joiner="B2")
    assert BatchMessage.model_validate_json(batch).request_ids == ("p",)
    assert client.hget(store.keys.step_rows, WORKER) == "3"  # requeue.lua lowers it when r is evicted
    assert client.zscore(store.keys.storing, "B2") is not None
    client.delete(inbox)
    client.hdel(store.keys.step_levels(WORKER), "r")  # r left (and the eviction is done): rows 3 -> 2
    client.hset(store.keys.step_rows, WORKER, 2)
    assert sched.step_swap(WORKER, "digest", message, "B3", 1, 2, "r") == 0  # full, and nothing to evict
    client.hset(store.keys.step_rows, WORKER, 1)
    assert sched.step_swap(WORKER, "digest", message, "B3", 1, 2, "r") == 1  # its room is free: a plain join
    assert [BatchMessage.model_validate_json(m).batch_id for m in client.lrange(inbox, 0, -1)] == ["B2"]
    client.hset(store.keys.step_sets, WORKER, k.STEP_SEALED)
    assert sched.step_swap(WORKER, "digest", message, "B4", 1, 2, "r") == 0


def test_step_swap_evicts_no_one_when_the_set_has_room_for_the_batch_already() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    store, _, _ = running_request(client)  # r runs in w1's set of "digest"
    client.hset(store.keys.step_rows, WORKER, 1)  # its other row was counted out (its last step) since the look
    client.zadd(store.keys.workers, {WORKER: time.time() * 1000})
    sched = SchedulerStore(client, settings())
    message = BatchMessage(batch_id="B2", request_ids=("p",), created_at=0.0).model_dump_json()
    assert sched.step_swap(WORKER, "digest", message, "B2", 1, 2, "r") == 1  # a plain join: r runs on
    [sent] = client.lrange(store.keys.step_inbox(WORKER), 0, -1)
    assert BatchMessage.model_validate_json(sent).batch_id == "B2"
    assert client.hget(store.keys.step_rows, WORKER) == "2"


# --- the scheduler's loop ---------------------------------------------------------------------------------------


def test_the_scheduler_swaps_a_probe_into_a_set_its_flood_fills_and_sends_the_eviction_with_it() -> None:
    s = loop_settings("fair")  # max_num_seqs 2
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = k.RedisKeys("t")
    client.zadd(keys.workers, {WORKER: time.time() * 1000})
    client.hset(keys.step_sets, WORKER, digest())  # w1's set is open, with room for two
    client.hset(keys.step_rows, WORKER, 0)
    inbox = keys.step_inbox(WORKER)
    celery = PublishedBatches()
    with running(scheduler(client, s, celery)):
        submit(client, keys, "f1", "f2", "f3", key="flood")
        assert wait_until(lambda: client.llen(inbox) == 1, 3)
        [joined] = client.lrange(inbox, 0, -1)
        assert BatchMessage.model_validate_json(joined).request_ids == ("f1", "f2")
        client.delete(inbox)  # the worker took them in: they run, as its levels hash says
        client.hset(keys.step_levels(WORKER), mapping={"f1": "0 1000", "f2": "0 1001"})
        time.sleep(0.3)  # f3 waits: its own flow fills the set
        assert client.llen(inbox) == 0
        submit(client, keys, "p1", key="probe")
        assert wait_until(lambda: client.llen(inbox) == 2, 3)
        time.sleep(0.4)  # several rounds: one swap (the flows run 1 and 1 once it is done)
        eviction, batch = client.lrange(inbox, 0, -1)
    assert StepEviction.model_validate_json(eviction).evict == "f2"  # the flood's latest joined
    message = BatchMessage.model_validate_json(batch)
    assert message.request_ids == ("p1",) and StepEviction.model_validate_json(eviction).joiner == message.batch_id
    assert client.hget(keys.request("f3"), "status") == "queued" and celery.batches == []


def test_a_flows_requests_in_a_sealed_set_count_so_it_never_swaps_out_a_lighter_flow() -> None:
    s = loop_settings("fair")  # max_num_seqs 2
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = k.RedisKeys("t")
    empty_sets(client, keys, WORKER, "w2")
    celery = PublishedBatches()
    with running(scheduler(client, s, celery)):
        submit(client, keys, "f1", "f2", key="flood")
        assert wait_until(lambda: rows_sent(client, keys.step_inbox(WORKER)) == 2, 3)  # w1: the lowest name
        client.delete(keys.step_inbox(WORKER))
        client.hset(keys.step_levels(WORKER), mapping={"f1": "0 1000", "f2": "0 1001"})
        client.hset(keys.step_sets, WORKER, k.STEP_SEALED)  # w1's set drains its two flood rows
        submit(client, keys, "p1", "p2", key="probe")
        assert wait_until(lambda: rows_sent(client, keys.step_inbox("w2")) == 2, 3)
        client.delete(keys.step_inbox("w2"))
        client.hset(keys.step_levels("w2"), mapping={"p1": "0 1002", "p2": "0 1003"})
        submit(client, keys, "f3", key="flood")  # the flood runs 2 (sealed) and the probe 2: no swap
        swapped = wait_until(lambda: client.llen(keys.step_inbox("w2")) > 0, 1.5)  # past the sets' cache
    assert not swapped and client.hget(keys.request("f3"), "status") == "queued" and celery.batches == []


def test_a_swap_that_waits_for_joiners_to_show_among_the_members_is_made_once_they_do() -> None:
    s = loop_settings("fair").model_copy(update={"scheduler_block_ms": 2000})  # max_num_seqs 2; no wake-up to lean on
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = k.RedisKeys("t")
    empty_sets(client, keys, WORKER)
    inbox = keys.step_inbox(WORKER)
    with running(scheduler(client, s, PublishedBatches())):
        submit(client, keys, "f1", "f2", "f3", key="flood")
        assert wait_until(lambda: client.llen(inbox) == 1, 3)  # f1 and f2 on their way: no member to evict yet
        submit(client, keys, "p1", key="probe")
        time.sleep(0.1)  # the probe looked and found the flood's rows on their way
        assert client.llen(inbox) == 1
        client.delete(inbox)  # they join: the worker records them, which wakes no one
        client.hset(keys.step_levels(WORKER), mapping={"f1": "0 1000", "f2": "0 1001"})
        assert wait_until(lambda: client.llen(inbox) == 2, 1)  # the scheduler looked again (SWAP_RETRY_S)
        eviction, batch = client.lrange(inbox, 0, -1)
    assert StepEviction.model_validate_json(eviction).evict == "f2"
    assert BatchMessage.model_validate_json(batch).request_ids == ("p1",)


def test_a_request_whose_eviction_is_pending_counts_no_longer_for_its_flow_but_its_joiner_does() -> None:
    s = loop_settings("fair")  # max_num_seqs 2
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = k.RedisKeys("t")
    empty_sets(client, keys, WORKER, "w2")
    celery = PublishedBatches()
    with running(scheduler(client, s, celery)):
        submit(client, keys, "f1", "f2", key="flood")
        assert wait_until(lambda: rows_sent(client, keys.step_inbox(WORKER)) == 2, 3)
        submit(client, keys, "f3", key="flood")
        submit(client, keys, "t1", key="third")  # may be sent in a batch of its own, after f3's: wait for both rows
        assert wait_until(lambda: rows_sent(client, keys.step_inbox("w2")) == 2, 3)
        for worker in (WORKER, "w2"):
            client.delete(keys.step_inbox(worker))
        client.hset(keys.step_levels(WORKER), mapping={"f1": "0 1000", "f2": "0 1001"})
        client.hset(keys.step_levels("w2"), mapping={"f3": "0 1002", "t1": "0 1003"})
        submit(client, keys, "p1", key="probe")  # the flood runs 3, the probe none: it swaps in for f3
        assert wait_until(lambda: client.llen(keys.step_inbox("w2")) == 2, 3)
        submit(client, keys, "p2", key="probe")  # f3 still runs (its boundary is not there yet): 2 against 1
        swapped = wait_until(lambda: client.llen(keys.step_inbox(WORKER)) > 0, 1)
    assert StepEviction.model_validate_json(client.lindex(keys.step_inbox("w2"), 0) or "").evict == "f3"
    assert not swapped and client.hget(keys.request("p2"), "status") == "queued" and celery.batches == []
