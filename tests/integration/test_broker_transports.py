"""The broker as its own setting (FUSEFLEET_BROKER_URL): a fleet whose Celery broker is RabbitMQ, and one whose
broker is a second plain Redis, both with real api, scheduler and worker processes (the simulated GPU, no torch).

On each: requests finish in fused batches that run once, through the broker (the fleet's Redis holds no message);
an abort ends a running request; a worker SIGKILLed mid-batch is recovered within the documented bound (its lock
lapses, the batch is re-run split on the other worker, each request ends once), whatever the broker does with the
unacknowledged message (RabbitMQ gives it back at once when the connection drops, a Redis broker after its
visibility timeout: either copy finds the batch held or done); a lost message is published again by the reaper.
The queue follows the key prefix on either broker, so fleets sharing the session's RabbitMQ never meet.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import purge_queue, queue_state, rabbitmq_or_skip
from tests.support.chaos import FakeWorkerHeartbeat, FinishedWatcher, assert_every_request_ended_once, body, statuses
from tests.support.fleet import Fleet, running_fleet
from tests.support.processes import wait_for
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(300)

LOCK_TTL_S = 3.0
REAPER_S = 1.0
CLAIM_TIMEOUT_S = 3.0
ENV = {
    "FUSEFLEET_RUNNER": "bench.runners:SimulatedGpuRunner",
    # a 4-step request takes 40 ms, a SLOW one 3 s (10 ms a step, whatever the batch size)
    "FUSEFLEET_SIM_BASE_MS": "200",
    "FUSEFLEET_SIM_PER_IMAGE_MS": "0",
    "FUSEFLEET_SIM_REF_STEPS": "20",
    "FUSEFLEET_MAX_INFERENCE_STEPS": "1000",
    "FUSEFLEET_MAX_NUM_SEQS": "4",
    "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "200",
    "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
    "FUSEFLEET_WORKER_HEARTBEAT_S": "0.5",
    "FUSEFLEET_WORKER_TTL_S": "3",
    "FUSEFLEET_BATCH_LOCK_TTL_S": str(LOCK_TTL_S),
    "FUSEFLEET_BATCH_CLAIM_TIMEOUT_S": str(CLAIM_TIMEOUT_S),
    # the broker's socket timeouts too (RabbitMQ: read and write): an idle worker's connection must outlive them
    "FUSEFLEET_REDIS_SOCKET_TIMEOUT_S": "2",
}
SLOW_STEPS = 300
RUN_S = 3.0
QUEUE_S = 5.0  # a message taken and claimed, a pool process replaced, on a busy 2-core machine
# docs/reliability.md, a worker killed mid-batch: L + R + queue wait + the first half's run + R + the second half's
KILLED_WORKER_BOUND_S = LOCK_TTL_S + REAPER_S + QUEUE_S + RUN_S + REAPER_S + RUN_S


@pytest.fixture(scope="module", params=["rabbitmq", "redis"])
def broker_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The broker: the session's RabbitMQ, or a plain Redis of its own (not the fleet's)."""
    if request.param == "rabbitmq":
        yield rabbitmq_or_skip()
        return
    server = RedisServer(tmp_path_factory.mktemp("broker-redis")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def fleet(broker_url: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("broker-fleet")
    with running_fleet(redis_server.url, logs, ENV, workers=2, broker_url=broker_url) as one:
        yield one


def attempts(fleet: Fleet, batch_id: str) -> int:
    return int(fleet.redis.hget(fleet.keys.batch(batch_id), "attempts") or 0)


def test_requests_finish_in_batches_that_run_once_through_the_broker(fleet: Fleet, broker_url: str) -> None:
    queue = fleet.env["FUSEFLEET_QUEUE_NAME"]
    ids = fleet.submit_batch([body(f"broker {i}") for i in range(8)])
    states = fleet.wait_done(ids, timeout=60)
    assert {s["status"] for s in states.values()} == {"succeeded"}, fleet.logs_hint()
    assert max(s["batch_size"] for s in states.values()) > 1  # fused
    assert {attempts(fleet, s["batch_id"]) for s in states.values()} == {1}
    # the messages went through the broker, not the fleet's Redis
    assert not fleet.redis.exists(f"{fleet.prefix}:{queue}") and not fleet.redis.keys(f"*_kombu.binding.{queue}")
    state = queue_state(broker_url, queue, fleet.prefix)
    assert state.waiting == 0
    assert state.consumers in (None, len(fleet.workers))  # RabbitMQ counts the consumers: both workers


def test_an_idle_workers_broker_connection_outlives_its_socket_timeout(fleet: Fleet) -> None:
    time.sleep(3 * float(ENV["FUSEFLEET_REDIS_SOCKET_TIMEOUT_S"]))
    rid = fleet.submit(prompt="after a quiet while")
    assert fleet.wait_done([rid], timeout=20)[rid]["status"] == "succeeded"
    for worker in fleet.workers:
        assert "Connection to broker lost" not in worker.log(), worker.log_path


def test_an_abort_ends_a_running_request(fleet: Fleet) -> None:
    rid = fleet.submit(prompt="abort me", num_inference_steps=SLOW_STEPS)
    fleet.wait_running(rid, min_step=3)
    asked = time.monotonic()
    assert fleet.http.post(f"/v1/requests/{rid}/abort").status_code in (200, 202)
    (state,) = fleet.wait_done([rid], timeout=10).values()
    took_s = time.monotonic() - asked
    assert state["status"] == "aborted", state
    assert took_s < RUN_S, f"the abort took {took_s:.1f} s: the forward ran to its end"


def test_a_worker_killed_mid_batch_is_recovered_within_the_bound(fleet: Fleet, broker_url: str) -> None:
    with FinishedWatcher(fleet.env["FUSEFLEET_REDIS_URL"], fleet.keys) as watcher:
        ids = fleet.submit_batch([body("kill", steps=SLOW_STEPS)] * 2)
        name = str(fleet.wait_running(ids[0], min_step=3)["worker"])
        victim = fleet.worker_named(name)
        killed_at = time.time()
        victim.kill()  # main process and its pool child: the broker connection drops with no ack
        finishes = assert_every_request_ended_once(
            fleet, watcher, ids, timeout=KILLED_WORKER_BOUND_S + 30, killed=[victim]
        )
    took_s = max(float(f.finished_at or 0) for f in finishes.values()) - killed_at
    states = [fleet.get(rid) for rid in ids]
    assert {s["worker"] for s in states} != {name}
    assert attempts(fleet, states[0]["batch_id"]) == 3  # the lost run re-ran split: each request alone, once
    print(f"\nbroker {broker_url.split(':')[0]}: worker killed mid-batch, all ended {took_s:.1f} s later")
    assert took_s <= KILLED_WORKER_BOUND_S, f"took {took_s:.1f} s, over the bound of {KILLED_WORKER_BOUND_S:.0f} s"
    victim.start()
    wait_for(lambda: fleet.redis.zscore(fleet.keys.workers, name) is not None, 60, f"{name} to come back")


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_a_lost_message_is_published_again(
    broker: str, redis_server: RedisServer, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A fake worker slot makes the scheduler publish with no consumer; the test purges the broker queue (the
    message is lost), then a real worker joins: the reaper cannot see a queue on another broker, so it publishes
    the batch again once it is unclaimed for the claim timeout, and the batch runs once."""
    if broker == "rabbitmq":
        url = rabbitmq_or_skip()
        server = None
    else:
        server = RedisServer(tmp_path_factory.mktemp("lost-broker")).start()
        url = server.url
    try:
        with running_fleet(redis_server.url, tmp_path, ENV, workers=0, broker_url=url) as fleet:
            queue = fleet.env["FUSEFLEET_QUEUE_NAME"]
            with FinishedWatcher(redis_server.url, fleet.keys) as watcher:
                ghost = FakeWorkerHeartbeat(fleet.redis, fleet.keys, f"ghost@{fleet.prefix}").start()
                try:
                    ids = fleet.submit_batch([body(f"lost {i}") for i in range(3)])
                    wait_for(lambda: queue_state(url, queue, fleet.prefix).waiting >= 1, 20, f"the message in {queue}")
                    assert purge_queue(url, queue, fleet.prefix) == 1
                    assert statuses(fleet, ids) == {"scheduled": 3}
                finally:
                    ghost.stop()
                fleet.add_worker("real-worker")
                joined = time.time()
                finishes = assert_every_request_ended_once(fleet, watcher, ids, timeout=CLAIM_TIMEOUT_S + 30)
            took_s = max(float(f.finished_at or 0) for f in finishes.values()) - joined
            (batch_id,) = {fleet.get(rid)["batch_id"] for rid in ids}
            assert attempts(fleet, batch_id) == 1
            print(f"\nbroker {broker}: lost message, the batch ran {took_s:.1f} s after a worker joined")
            assert took_s <= CLAIM_TIMEOUT_S + REAPER_S + QUEUE_S
    finally:
        if server is not None:
            server.stop()
