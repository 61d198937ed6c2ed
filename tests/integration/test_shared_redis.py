"""Two fleets on one Redis, told apart by their key prefix only (docs/configuration.md, FUSEFLEET_KEY_PREFIX).

Neither sets FUSEFLEET_QUEUE_NAME: the Celery queue follows the prefix, so each fleet's worker takes its own
fleet's batches only; and every key kombu writes in the broker follows it too (``broker_key_prefix``: the queue
list, the unacknowledged messages, the bindings and the remote-control fanout), so the fleets share none. (With
one queue for both, a worker of one fleet swallowed the other's batches: it found nothing of them under its own
prefix and dropped them, and their requests waited for the reaper.)
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.fleet import Fleet, new_prefix
from tests.support.redis_server import RedisServer

PLACEHOLDER_RUNNER = {
    "FUSEFLEET_RUNNER": "tests.support.runners:ChaosRunner",  # instant noise images: the test is about routing
    "FUSEFLEET_SIM_BASE_MS": "0",
    "FUSEFLEET_SIM_PER_IMAGE_MS": "0",
    "FUSEFLEET_MAX_NUM_SEQS": "2",
    "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "20",
}
REQUESTS_PER_FLEET = 12
FINISH_WITHIN_S = 25.0  # far below the reaper's batch_claim_timeout_s (30 s): a lost batch cannot be rescued in time


@pytest.mark.timeout(240)
def test_fleets_with_distinct_prefixes_share_one_redis(redis_server: RedisServer, tmp_path: Path) -> None:
    with ExitStack() as stack:
        fleets = []
        for name in ("blue", "green"):
            prefix = new_prefix(name)
            env = {"FUSEFLEET_REDIS_URL": redis_server.url, "FUSEFLEET_KEY_PREFIX": prefix, **PLACEHOLDER_RUNNER}
            (logs := tmp_path / name).mkdir()
            fleet = Fleet(env, logs, redis_server.url, prefix)
            stack.callback(fleet.stop)
            fleets.append(fleet.start())
        ids = {
            fleet.prefix: [fleet.submit(prompt=f"{fleet.prefix} {i}") for i in range(REQUESTS_PER_FLEET)]
            for fleet in fleets
        }
        for fleet in fleets:
            states = fleet.wait_done(ids[fleet.prefix], timeout=FINISH_WITHIN_S)
            (worker,) = fleet.workers
            assert {state["status"] for state in states.values()} == {"succeeded"}, fleet.logs_hint()
            assert {state["worker"] for state in states.values()} == {worker.env["FUSEFLEET_WORKER_NAME"]}
            assert fleet.redis.exists(f"{fleet.prefix}:{fleet.prefix}.batches") == 0  # its queue, drained
            assert fleet.redis.keys(f"{fleet.prefix}:_kombu.binding.*")  # its own exchange bindings
        # nothing of the broker is shared: no unprefixed queue, unacknowledged-message hash or binding
        assert fleets[0].redis.keys("unacked*") == [] and fleets[0].redis.keys("_kombu.*") == []
