"""A real fleet on a real Redis Cluster: api, scheduler and worker processes with ``FUSEFLEET_REDIS_CLUSTER=true``
on the session's local cluster (three masters, one replica each: tests/support/redis_cluster.py), the session's
plain Redis as the Celery broker, and ``ChaosRunner`` forwards (simulated, no model to load).

What crosses the cluster client here: every Lua script (``EVALSHA`` on the fleet's slot, loaded on the node that
answered ``NOSCRIPT``), the pipelines and ``MULTI``s, ``XREADGROUP BLOCK`` (scheduler, webhook outbox) and
``XREAD BLOCK`` over many event streams (the api's feeds), the long polls' pub/sub, the Redis result store's binary
client; and that every key the fleet wrote is in one slot. ``pytest --redis-cluster`` runs every other fleet test on
the cluster too (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fusefleet.client import Client
from shared.redis_conn import async_client
from shared.settings import Settings
from tests.support import fleet as support_fleet
from tests.support.fleet import Fleet
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.cluster

CLUSTER_ENV = {
    "FUSEFLEET_RUNNER": "tests.support.runners:ChaosRunner",
    # a forward of 4 steps takes 300 ms + 100 ms per image, of 200 steps 50 times that
    "FUSEFLEET_SIM_BASE_MS": "300",
    "FUSEFLEET_SIM_PER_IMAGE_MS": "100",
    "FUSEFLEET_SIM_REF_STEPS": "4",
    "FUSEFLEET_MAX_NUM_SEQS": "4",
    "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "300",
    "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
    "FUSEFLEET_EVENT_PING_S": "0.5",
    "FUSEFLEET_RESULT_STORE": "redis",
}
WOKEN_WITHIN_S = 10.0
"""A long poll of ``wait_s=30`` answers within this of its request's end (woken by pub/sub, not its timeout)."""


@pytest.fixture(scope="module")
def fleet(
    redis_cluster: LocalRedisCluster, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    logs: Path = tmp_path_factory.mktemp("cluster-fleet")
    with support_fleet.running_fleet(redis_server.url, logs, CLUSTER_ENV, cluster_url=redis_cluster.url) as one:
        yield one


@pytest.fixture
def client(fleet: Fleet) -> Iterator[Client]:
    with Client(fleet.base_url, timeout=30) as one:
        yield one


def test_compatible_requests_are_fused_and_their_images_served(fleet: Fleet) -> None:
    ids = fleet.submit_batch([{"prompt": f"a fox {i}", "width": 64, "height": 64} for i in range(4)])
    states = fleet.wait_done(ids, timeout=60)
    assert {state["status"] for state in states.values()} == {"succeeded"}, fleet.logs_hint()
    assert max(state["batch_size"] for state in states.values()) > 1, states
    for request_id in ids:
        assert fleet.image(request_id).startswith(b"\x89PNG")  # from the Redis result store, on the cluster


def test_a_long_poll_is_woken_by_the_finished_channel(fleet: Fleet) -> None:
    request_id = fleet.submit(num_inference_steps=8)
    started = time.monotonic()
    answer = fleet.http.get(f"/v1/requests/{request_id}", params={"wait_s": 30})
    assert answer.json()["status"] == "succeeded", fleet.logs_hint()
    assert time.monotonic() - started < WOKEN_WITHIN_S


def test_events_stream_live_one_request_and_many(fleet: Fleet, client: Client) -> None:
    single = fleet.submit(num_inference_steps=4)
    names = [event.name for event in client.events(single)]
    assert names[:3] == ["queued", "scheduled", "running"] and names[-1] == "succeeded", names
    assert set(names[3:-1]) <= {"progress"}, names
    many = [fleet.submit(prompt=f"a whale {i}", num_inference_steps=4) for i in range(3)]
    ended = {event.request_id: event.name for event in client.watch(many) if event.terminal}
    assert ended == dict.fromkeys(many, "succeeded")


def test_abort_while_running_and_while_queued(fleet: Fleet) -> None:
    running = fleet.submit(prompt="endless", num_inference_steps=200)
    fleet.wait_running(running, min_step=2)
    assert fleet.http.post(f"/v1/requests/{running}/abort").status_code == 200
    fleet.scheduler.stop()
    try:
        queued = fleet.submit(prompt="never")
        assert fleet.http.post(f"/v1/requests/{queued}/abort").json()["status"] == "aborted"
    finally:
        fleet.scheduler.start()
    states = fleet.wait_done([running, queued], timeout=60)
    assert states[running]["status"] == "aborted" and states[running]["progress"]["step"] < 200
    assert states[queued]["status"] == "aborted" and states[queued]["started_at"] is None
    after = fleet.submit(prompt="after")
    assert fleet.wait_done([after], timeout=60)[after]["status"] == "succeeded"


def test_a_killed_scheduler_loses_nothing(fleet: Fleet) -> None:
    ids = [fleet.submit(prompt=f"wave one {i}") for i in range(4)]
    fleet.scheduler.kill()
    ids += [fleet.submit(prompt=f"while down {i}") for i in range(4)]
    fleet.scheduler.start()
    states = fleet.wait_done(ids, timeout=60)
    assert {state["status"] for state in states.values()} == {"succeeded"}, fleet.logs_hint()
    for batch_id in {state["batch_id"] for state in states.values()}:
        assert fleet.redis.hget(fleet.keys.batch(batch_id), "attempts") == "1", f"batch {batch_id} ran twice"


def test_every_key_of_the_fleet_is_in_its_one_slot(fleet: Fleet, redis_cluster: LocalRedisCluster) -> None:
    request_id = fleet.submit()
    fleet.wait_done([request_id])
    with redis_cluster.client() as cluster:
        keys = list(cluster.scan_iter(match=f"*{fleet.prefix}*", count=1000))  # every node's keys
        slots = {cluster.keyslot(key) for key in keys}
        assert len(keys) > 10 and slots == {cluster.keyslot(fleet.keys.tag)}, sorted(keys)
        assert fleet.keys.request(request_id) in keys and fleet.keys.requests in keys
        assert not [key for key in keys if not key.startswith(f"{fleet.keys.tag}:")], "a key outside the tag"


@pytest.mark.anyio
async def test_concurrent_first_calls_of_a_fresh_asyncio_client_succeed(redis_cluster: LocalRedisCluster) -> None:
    """A fresh client's first calls, all at once and more of them than its connections: ``MULTI`` and plain
    pipelines and blocking reads (the api's event feeds) and a subscription (its completion listener) while the
    client is still finding the cluster (``shared.redis_cluster``). With redis-py 8.1's own clients the ``MULTI``
    deadlocks the event loop, the subscription raises ``KeyError``, and calls past ``max_connections`` break the
    connections of the others."""
    settings = Settings(redis_url=redis_cluster.url, redis_cluster=True, broker_url="redis://127.0.0.1:1/0")
    client = async_client(settings, max_connections=3)
    tag = f"{{ff-fresh-{uuid.uuid4().hex[:8]}}}"

    async def one_moment(i: int) -> list[object]:
        pipe = client.pipeline(transaction=True)
        pipe.hset(f"{tag}:h{i}", "status", "queued")
        pipe.hget(f"{tag}:h{i}", "status")
        pipe.xrevrange(f"{tag}:s{i}", count=1)
        replies = list(await pipe.execute())
        plain = client.pipeline(transaction=False)
        plain.exists(f"{tag}:h{i}")
        replies += await plain.execute()
        replies.append(await client.xread({f"{tag}:s{i}": "0-0"}, count=1, block=200))
        return replies

    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        replies = await asyncio.gather(pubsub.subscribe(f"{tag}:finished"), *(one_moment(i) for i in range(8)))
        assert replies[1:] == [[1, "queued", [], 1, []]] * 8
        await client.publish(f"{tag}:finished", "done")
        deadline = time.monotonic() + 5
        message = None
        while message is None and time.monotonic() < deadline:  # None while it reads the subscribe reply
            message = await pubsub.get_message(timeout=1)
        assert message is not None and message["data"] == "done"
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.aclose()


@pytest.mark.anyio
async def test_a_pipeline_reads_the_clock_with_the_fleets_keys(redis_cluster: LocalRedisCluster) -> None:
    """``shared.fleet_state`` reads ``TIME`` in the pipeline of a scrape (redis-py refuses it on a cluster)."""
    settings = Settings(redis_url=redis_cluster.url, redis_cluster=True, broker_url="redis://127.0.0.1:1/0")
    client = async_client(settings)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.time()
        pipe.xlen("{ff-clock}:requests")
        (seconds, micros), depth = await pipe.execute()
        assert abs(seconds + micros / 1e6 - time.time()) < 5 and depth == 0
    finally:
        await client.aclose()


def test_the_schedulers_capacity_read_is_one_pipeline_with_its_script_on_the_fleets_node(
    redis_cluster: LocalRedisCluster,
) -> None:
    """``SchedulerStore.capacity`` runs ``free_slots.lua`` in a pipeline with four reads; a cluster pipeline loads no
    script, so its first call on a node that has none (a fresh cluster, a failover) loads it and reads again."""
    from scheduler.store import SchedulerStore, Slots
    from shared.contracts import Task, WorkerCapabilities
    from shared.redis_conn import sync_client

    prefix = f"ff-capacity-{uuid.uuid4().hex[:8]}"
    settings = Settings(redis_url=redis_cluster.url, redis_cluster=True, broker_url="redis://127.0.0.1:1/0",
                        key_prefix=prefix)  # fmt: skip
    client = sync_client(settings)
    try:
        client.script_flush()  # every node: no script loaded anywhere
        store = SchedulerStore(client, settings)
        sd = WorkerCapabilities(model="sd", pipeline="StableDiffusionPipeline", tasks=(Task.TEXT_TO_IMAGE,))
        client.zadd(store.keys.workers, {"w1": time.time() * 1000})
        client.hset(store.keys.capabilities, "w1", sd.model_dump_json())
        client.zadd(store.keys.inflight, {"B1": time.time() * 1000})
        capacity = store.capacity({"B1": "sd"})
        assert capacity.slots == Slots(free=0, live=1) and capacity.workers == {"w1": sd}
        assert capacity.busy == {"B1": "sd"}
        assert store.capacity({"B1": "sd"}) == capacity  # loaded now: one pipeline
    finally:
        client.close()
