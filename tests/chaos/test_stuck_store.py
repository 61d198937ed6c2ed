"""A result store that hangs under one worker (an S3 endpoint that trickles its answer forever: botocore's read
timeouts never trip) does not turn that worker into a black hole.

The worker's write fails after ``result_store_timeout_s`` (``shared.results.deadline``); its finisher is stuck, so
it is quarantined (``worker_quarantine_s``), stops taking messages, gives the batches it holds back uncounted and
exits its pool process (``gpu_worker.app``), which Celery replaces; the batch, whose requests were not failed or
charged a lost run, is published again by the reaper and runs on a worker whose store answers, with the default
``max_batch_attempts``. The replacement pool process announces no slot and takes no batch while quarantined. Every
request ends once; the stuck worker's Celery process lives on.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.chaos import FinishedWatcher, assert_every_request_ended_once
from tests.support.processes import wait_for
from tests.support.s3_server import s3_server
from tests.support.trickle_server import trickle_server

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

S3_TIMEOUT_S = 0.3  # each read gets a byte every 0.02 s: it never times out
STORE_TIMEOUT_S = 8.0  # at least 3 x (2 x S3_TIMEOUT_S + 2 s): Settings checks


def test_a_worker_whose_store_hangs_is_replaced_and_its_batch_runs_elsewhere(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory
) -> None:
    server = chaos_redis()
    with s3_server() as s3, trickle_server(interval_s=0.02) as hanging:
        fleet = chaos_fleet(
            server,
            workers=0,
            FUSEFLEET_S3_TIMEOUT_S=str(S3_TIMEOUT_S),
            FUSEFLEET_RESULT_STORE_TIMEOUT_S=str(STORE_TIMEOUT_S),
            **s3.env(prefix="results/"),
        )
        stuck = fleet.add_worker("stuck", FUSEFLEET_S3_ENDPOINT_URL=hanging.url)
        with FinishedWatcher(server.url, fleet.keys) as watcher:
            ids = [fleet.submit(prompt="stored into a hang", n=2)]
            # running: the forward began (a forward shorter than the progress interval reports its last step only
            # with its ending, which the hung store holds back)
            wait_for(lambda: fleet.get(ids[0])["status"] == "running", 60, f"request {ids[0]} to run")
            running_at = time.monotonic()
            wait_for(lambda: "is stuck" in stuck.log(), 60, f"the worker to give up ({stuck.log_path})")
            stuck_after_s = time.monotonic() - running_at
            assert stuck_after_s < STORE_TIMEOUT_S + 5, stuck_after_s  # the write's deadline, not the time limit
            wait_for(lambda: "exitcode 70" in stuck.log(), 30, f"the pool process to exit ({stuck.log_path})")
            exited_log = len(stuck.log())
            assert hanging.accepted.is_set()
            assert fleet.redis.hget(fleet.keys.request(ids[0]), "status") == "running"
            assert not fleet.redis.hget(fleet.keys.request(ids[0]), "claim")  # given back: no run holds it
            stuck_node = stuck.env["FUSEFLEET_WORKER_NAME"]
            assert fleet.redis.exists(fleet.keys.worker_quarantine(stuck_node))

            started_at = time.monotonic()
            healthy = fleet.add_worker("healthy")
            healthy_start_s = time.monotonic() - started_at
            finishes = assert_every_request_ended_once(fleet, watcher, ids, timeout=90, killed=[])
            ended_after_s = time.monotonic() - running_at
            assert fleet.redis.zscore(fleet.keys.workers, stuck_node) is None  # no slot while quarantined
        node = healthy.env["FUSEFLEET_WORKER_NAME"]
        assert fleet.redis.hget(fleet.keys.request(ids[0]), "status") == "succeeded", finishes
        assert fleet.redis.hget(fleet.keys.request(ids[0]), "worker") == node, finishes
        assert stuck.alive()  # the Celery worker itself lives on: only its pool process was replaced
        after_exit = stuck.log()[exited_log:]
        assert "run_batch" not in after_exit, after_exit  # the quarantined host took no further message
        batch = fleet.redis.hgetall(fleet.keys.batch(str(fleet.redis.hget(fleet.keys.request(ids[0]), "batch_id"))))
        assert not any(field.startswith("lost:") for field in batch), batch  # the give-back counted no lost run
        attempts = batch.get("attempts")
        print(
            f"\nstuck store: the worker gave up {stuck_after_s:.1f} s after the run began (store timeout "
            f"{STORE_TIMEOUT_S} s); the request succeeded on another worker {ended_after_s:.1f} s after it "
            f"(that worker's start {healthy_start_s:.1f} s included), attempts {attempts}, no lost run"
        )
