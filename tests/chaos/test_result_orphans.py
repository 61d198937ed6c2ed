"""A worker killed after it stored a batch's images and before it finished the requests (the window between the
result store and Redis): the batch runs again on another worker, the request ends with the new run's images, and
the killed run's objects are deleted by the sweeper once due. No duplicate is kept, nothing is orphaned.

To hit the window, Redis is stopped (SIGSTOP) while the forward runs: the worker's run goes on (progress writes
are best effort), stores its images (the result store does not need Redis), then blocks on the Redis call that
would finish the requests. The test sees the objects appear and SIGKILLs the worker there. Run against the
filesystem store and against an S3-protocol server (moto).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.processes import wait_for
from tests.support.s3_server import s3_server

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

TIME_LIMIT_S = 10
OUTAGE_RETRY_S = 1
GRACE_S = 13  # must exceed TIME_LIMIT_S + OUTAGE_RETRY_S (Settings checks)
SWEEP_S = 0.5

Backend = tuple[dict[str, str], Callable[[], set[str]]]  # the fleet's env, and a listing of the stored keys


@pytest.fixture(params=["filesystem", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "filesystem":
        root = tmp_path / "results"

        def files() -> set[str]:
            paths = (path for path in root.rglob("*") if path.is_file() and ".partial" not in path.name)
            return {str(path.relative_to(root)) for path in paths}

        yield {"FUSEFLEET_RESULT_STORE": "filesystem", "FUSEFLEET_RESULT_DIR": str(root)}, files
        return
    with s3_server() as server:

        def objects() -> set[str]:
            return {key.removeprefix("results/") for key in server.keys("results/")}

        yield server.env(prefix="results/"), objects


def test_killed_between_storing_and_finishing_leaves_no_orphan(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory, backend: Backend
) -> None:
    env, stored = backend
    server = chaos_redis()
    fleet = chaos_fleet(
        server,
        workers=1,
        FUSEFLEET_SIM_PER_IMAGE_MS="1000",  # a 2 s forward for n=2
        FUSEFLEET_BATCH_TIME_LIMIT_S=str(TIME_LIMIT_S),
        FUSEFLEET_VISIBILITY_TIMEOUT_S="60",
        FUSEFLEET_REDIS_OUTAGE_RETRY_S=str(OUTAGE_RETRY_S),
        FUSEFLEET_REDIS_SOCKET_TIMEOUT_S="1",
        FUSEFLEET_RESULT_ORPHAN_GRACE_S=str(GRACE_S),
        FUSEFLEET_RESULT_SWEEP_INTERVAL_S=str(SWEEP_S),
        **env,
    )
    request_id = fleet.submit(prompt="stored, then killed", n=2, num_inference_steps=4)
    fleet.wait_running(request_id, min_step=1)
    claimed_at = time.monotonic()
    first_worker = fleet.workers[0]
    server.pause()
    try:
        wait_for(lambda: len(stored()) >= 2, 30, "the run to store both images while Redis is stopped", interval=0.02)
        first_worker.kill()
    finally:
        server.resume()
    killed_run = stored()
    assert len(killed_run) == 2 and all(key.startswith(f"{request_id}/") for key in killed_run), killed_run
    assert fleet.redis.hget(fleet.keys.request(request_id), "status") == "running"  # it never finished

    fleet.add_worker("second")  # the reaper republishes the batch once the dead run's lock lapses
    state = fleet.wait_done([request_id], timeout=60)[request_id]
    assert state["status"] == "succeeded", state
    kept = set(str(fleet.redis.hget(fleet.keys.request(request_id), "results")).split())
    assert len(kept) == 2 and kept.isdisjoint(killed_run), (kept, killed_run)
    assert stored() >= kept

    # the killed run's objects fall due GRACE_S after its claim; then exactly the kept ones are left
    wait_for(
        lambda: stored() == kept,
        GRACE_S + 20,
        f"the killed run's objects to be swept (left: {stored() - kept}; {fleet.logs_hint()})",
        interval=0.2,
    )
    swept_after_s = time.monotonic() - claimed_at
    print(f"\nkilled run's {len(killed_run)} objects swept {swept_after_s:.1f} s after its claim (grace {GRACE_S} s)")
    assert swept_after_s > GRACE_S - 2, "swept before its grace period: a live run could lose images"
    for index in range(2):
        assert fleet.image(request_id, index)
    assert not fleet.redis.zcard(fleet.keys.results_deleting)
