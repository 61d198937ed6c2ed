"""An aborted backlog costs the scheduler nothing once it is aborted: 10,000 requests submitted while no worker is
up (the scheduler reads them all into its queue), then aborted (``abort.lua``, as the api runs it: in bulk through
the script, and some through ``POST /v1/requests/{id}/abort``). Without any free slot they leave the scheduler's
memory (``P:scheduler:queued``) and the stream's pending list; four new requests wait, a worker joins, and they are
dispatched within a second of its first heartbeat (the free slot), whatever the number aborted before them.

Today's main kept every aborted request in memory and pending until a slot freed, then skipped 64 per round of a
500 ms blocking read: 10,000 aborted requests held the new ones for about 80 s.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shared import keys as k
from shared.settings import Settings
from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.chaos import FinishedWatcher, assert_every_request_ended_once, body, submit_all
from tests.support.fleet import Fleet
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

BACKLOG = 10_000
THROUGH_THE_API = 50  # of them aborted one by one through the api, the rest through the script in bulk
NEW = 4
RESULT_TTL_S = 600
MAX_QUEUE_LEN = Settings.model_fields["max_queue_len"].default  # the fleet's, as the api passes it to abort.lua


def queued_in_memory(fleet: Fleet) -> int | None:
    """The active scheduler's in-memory queue length, as it last reported it (None: not reported)."""
    value = fleet.redis.get(fleet.keys.scheduler_queued)
    return None if value is None else int(value)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def first_heartbeat(fleet: Fleet, name: str, timeout: float = 120) -> float:
    """Start worker ``name`` and return when its first heartbeat made its slot free (Redis time, s)."""
    worker = fleet.new_worker(name).start()
    fleet.workers.append(worker)
    node = worker.env["FUSEFLEET_WORKER_NAME"]
    deadline = time.monotonic() + timeout
    while (score := fleet.redis.zscore(fleet.keys.workers, node)) is None:  # polled well within one beat
        assert time.monotonic() < deadline and worker.alive(), f"worker {node} never beat (log: {worker.log_path})"
        time.sleep(0.01)
    return float(score) / 1000


def abort_in_bulk(fleet: Fleet, ids: list[str], page: int = 1000) -> None:
    """``abort.lua`` with the api's arguments (``api.store.RedisStore.abort``), pipelined ``page`` at a time."""
    script = fleet.redis.register_script(k.ABORT)
    for start in range(0, len(ids), page):
        pipe = fleet.redis.pipeline(transaction=False)
        for rid in ids[start : start + page]:
            keys = k.abort_keys(fleet.keys, rid)
            args = [repr(time.time()), RESULT_TTL_S, fleet.keys.finished, rid, MAX_QUEUE_LEN]
            script(keys=keys, args=args, client=pipe)
        assert set(pipe.execute()) == {"aborted"}


def test_an_aborted_backlog_leaves_the_scheduler_and_never_delays_a_free_slot(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory
) -> None:
    started = time.monotonic()
    server = chaos_redis()
    fleet = chaos_fleet(
        server, workers=0, FUSEFLEET_RUNNER="bench.runners:NullRunner", FUSEFLEET_RESULT_TTL_S=str(RESULT_TTL_S)
    )
    assert fleet.scheduler.process is not None
    pid = fleet.scheduler.process.pid
    wait_for(lambda: queued_in_memory(fleet) == 0, 30, f"the scheduler to lead ({fleet.logs_hint()})")
    baseline_rss = rss_kib(pid)

    with FinishedWatcher(server.url, fleet.keys) as watcher:
        ids = submit_all(fleet, [body(f"aborted {i}") for i in range(BACKLOG)])
        submitted_s = time.monotonic() - started
        wait_for(lambda: queued_in_memory(fleet) == BACKLOG, 60, f"the scheduler to read {BACKLOG} requests")
        held_rss = rss_kib(pid)

        aborting = time.monotonic()
        for rid in ids[:THROUGH_THE_API]:
            response = fleet.http.post(f"/v1/requests/{rid}/abort")
            assert response.status_code == 200 and response.json()["status"] == "aborted", response.text
        abort_in_bulk(fleet, ids[THROUGH_THE_API:])
        aborted_s = time.monotonic() - aborting
        wait_for(lambda: queued_in_memory(fleet) == 0, 10, "the aborted requests to leave the scheduler's memory")
        left_s = time.monotonic() - aborting - aborted_s  # after the last abort; reported once per lease renewal
        assert fleet.redis.xpending(fleet.keys.requests, k.SCHEDULER_GROUP)["pending"] == 0
        assert fleet.redis.xlen(fleet.keys.requests) == 0
        after_rss = rss_kib(pid)

        new = fleet.submit_batch([body(f"new {i}") for i in range(NEW)])
        wait_for(lambda: queued_in_memory(fleet) == NEW, 10, "the new requests in the scheduler's queue")
        first_beat_s = first_heartbeat(fleet, "late")

        finishes = assert_every_request_ended_once(
            fleet,
            watcher,
            ids + new,
            timeout=60,
            expect=lambda rid, f: None if f.status == ("succeeded" if rid in new else "aborted") else f"{f}",
        )

    scheduled_s = [float(fleet.redis.hget(fleet.keys.request(rid), "scheduled_at") or 0) for rid in new]
    dispatch_s = max(scheduled_s) - first_beat_s
    assert all(finishes[rid].status == "succeeded" for rid in new)
    # reported once per lease renewal (a third of the lease), so the last report may still count the new ones
    wait_for(lambda: queued_in_memory(fleet) == 0, 10, "the scheduler's queue to be empty again")
    print(
        f"aborted backlog: {BACKLOG} submitted in {submitted_s:.1f}s and aborted in {aborted_s:.1f}s; the scheduler's "
        f"queue was back to 0 {left_s:.2f}s after the last abort (RSS {baseline_rss} KiB at rest, {held_rss} KiB "
        f"holding them, {after_rss} KiB after); {NEW} new requests dispatched {dispatch_s:.3f}s after the joining "
        f"worker's first heartbeat; took {time.monotonic() - started:.1f}s"
    )
    assert dispatch_s < 1.0, f"the new requests waited {dispatch_s:.2f}s for a free slot"
