"""A scheduler that dies between the batch transition and the Celery publish loses nothing.

The crash is reproduced exactly: with the real scheduler stopped, this test reads the stream as the scheduler
would and moves two requests into a batch, then "dies" before publishing. The restarted scheduler must publish
that batch and dispatch the request left queued; every request then runs exactly once.
"""

from __future__ import annotations

from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared.redis_conn import sync_client
from shared.settings import Settings
from tests.integration.conftest import Fleet


def test_batch_recorded_but_never_published_is_republished(fleet: Fleet) -> None:
    fleet.scheduler.stop()
    try:
        ids = [fleet.submit(prompt=f"orphan {i}") for i in range(3)]
        settings = Settings(redis_url=fleet.env["FUSEFLEET_REDIS_URL"], key_prefix=fleet.env["FUSEFLEET_KEY_PREFIX"])
        store = SchedulerStore(sync_client(settings), settings)
        store.ensure_groups()
        read = store.read_new(block_ms=100).entries
        assert [e.request_id for e in read][-3:] == ids
        lease = Lease(sync_client(settings), store.keys.scheduler_lease, 60_000)
        assert lease.try_acquire()
        assert store.schedule(lease.key, lease.token, "crashed-batch", ids[:2]) == ids[:2]
        lease.release()  # the dead scheduler's lease lapses
        assert fleet.get(ids[0])["status"] == "scheduled"
    finally:
        fleet.scheduler.start()
    states = fleet.wait_done(ids)
    assert {s["status"] for s in states.values()} == {"succeeded"}
    assert states[ids[0]]["batch_id"] == states[ids[1]]["batch_id"] == "crashed-batch"
    assert states[ids[2]]["batch_id"] != "crashed-batch"
    assert fleet.redis.hget(fleet.keys.batch("crashed-batch"), "attempts") == "1"
    assert fleet.redis.xlen(fleet.keys.requests) == 0
