"""Request events: the Lua scripts write each status change's event in order (on fakeredis, through the real api,
scheduler and worker stores), progress events are throttled and capped, and ``Last-Event-ID`` positions parse."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import fakeredis
import pytest

from api.events import (
    START,
    format_positions,
    parse_position,
    parse_positions,
    position_key,
    unique_ids,
)
from api.store import RequestStore
from gpu_worker.step_reporter import WRITE_EVERY_S
from gpu_worker.store import Claimed, WorkerStore
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared.contracts import BatchMessage, ErrorInfo, RequestSpec
from shared.keys import RedisKeys
from shared.results import build_result_store
from shared.settings import Settings

pytestmark = pytest.mark.anyio
THROTTLE_S = 0.2  # EVENT_EVERY_MS of progress.lua


class Fleet:
    """The stores of the api, the scheduler and a worker on one fake Redis server."""

    def __init__(self, server: fakeredis.FakeServer, settings: Settings) -> None:
        self.redis = fakeredis.FakeRedis(server=server, decode_responses=True)
        self.keys = RedisKeys(settings.key_prefix)
        self.api = RequestStore(
            fakeredis.FakeAsyncRedis(server=server, decode_responses=True),
            build_result_store(settings, fakeredis.FakeRedis(server=server)),
            self.keys,
            max_queue_len=100,
            result_ttl_s=settings.result_ttl_s,
            call_timeout_s=5,
        )
        self.scheduler = SchedulerStore(self.redis, settings)
        self.worker = WorkerStore(self.redis, settings)
        self.lease = Lease(self.redis, self.keys.scheduler_lease, 5000)
        assert self.lease.try_acquire()

    async def submit(self, *ids: str, steps: int = 4) -> None:
        specs = [
            RequestSpec(
                id=rid,
                model="demo",
                prompt=rid,
                seed=1,
                width=64,
                height=64,
                num_inference_steps=steps,
                guidance_scale=5.0,
                created_at=time.time(),
            )
            for rid in ids
        ]
        await self.api.submit(specs)

    def schedule(self, batch_id: str, *ids: str) -> list[str]:
        return self.scheduler.schedule(self.lease.key, self.lease.token, batch_id, list(ids))

    def claim(self, batch_id: str, *ids: str, token: str = "c1", worker: str = "w1") -> Claimed:
        batch = BatchMessage(batch_id=batch_id, request_ids=list(ids), created_at=time.time())
        claimed = self.worker.claim(batch, token, worker)
        assert isinstance(claimed, Claimed)
        return claimed

    def events(self, request_id: str) -> list[dict[str, str]]:
        return [fields for _, fields in self.redis.xrange(self.keys.request_events(request_id))]

    def names(self, request_id: str) -> list[str]:
        return [fields["event"] for fields in self.events(request_id)]


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    yield Fleet(fakeredis.FakeServer(), Settings(key_prefix="t", max_batch_attempts=1, result_ttl_s=600))


async def test_each_status_change_writes_its_event_in_order(fleet: Fleet) -> None:
    await fleet.submit("a", "b")
    assert fleet.schedule("B1", "a", "b") == ["a", "b"]
    fleet.claim("B1", "a", "b")
    for step in range(1, 5):  # within the throttle: only the last step is an event
        fleet.worker.progress(["a", "b"], step, 4, "c1")
    fleet.worker.finish_many({"a": []}, {"b": ErrorInfo(type="ValueError", message="bad prompt")}, "c1")

    assert fleet.events("a") == [
        {"event": "queued"},
        {"event": "scheduled", "batch_id": "B1", "batch_size": "2"},
        {"event": "running", "worker": "w1"},
        {"event": "progress", "step": "4", "total": "4"},
        {"event": "succeeded"},
    ]
    assert fleet.names("b")[-1] == "failed"  # the error is in the request's state, which the api sends with it
    for rid in ("a", "b"):  # the events expire with the state
        ttl = fleet.redis.ttl(fleet.keys.request_events(rid))
        assert 0 < ttl <= 600
        assert abs(ttl - fleet.redis.ttl(fleet.keys.request(rid))) <= 1


async def test_progress_events_are_throttled_deduplicated_and_capped(fleet: Fleet) -> None:
    await fleet.submit("a", steps=8)
    fleet.schedule("B1", "a")
    fleet.claim("B1", "a")
    fleet.worker.progress(["a"], 1, 8, "c1")  # right after running: throttled
    time.sleep(THROTTLE_S + 0.05)
    fleet.worker.progress(["a"], 2, 8, "c1")
    time.sleep(THROTTLE_S + 0.05)
    fleet.worker.progress(["a"], 2, 8, "c1")  # the same step again: nothing new to say
    fleet.worker.progress(["a"], 3, 8, "c1")
    fleet.worker.progress(["a"], 4, 8, "c1")  # throttled
    fleet.worker.progress(["a"], 8, 8, "c1")  # the last step always goes out
    steps = [fields["step"] for fields in fleet.events("a") if fields["event"] == "progress"]
    assert steps == ["2", "3", "8"]

    # a long run keeps the newest 64 progress events: a stream that already holds 70 entries is trimmed
    key = fleet.keys.request_events("z")
    for seq in range(1, 71):
        fleet.redis.xadd(key, {"event": "progress", "step": "0", "total": "1"}, id=f"1-{seq}")
    await fleet.submit("z", steps=2)
    fleet.schedule("B2", "z")
    fleet.claim("B2", "z", token="c2")
    fleet.worker.progress(["z"], 2, 2, "c2")
    assert fleet.redis.xlen(key) == 64
    fleet.worker.finish_many({"z": []}, {}, "c2")
    assert fleet.names("z")[-2:] == ["progress", "succeeded"]  # the terminal event is never trimmed


async def test_each_progress_write_of_the_reporter_carries_its_event_even_a_little_early(fleet: Fleet) -> None:
    """The step reporter writes at most every ``WRITE_EVERY_S``; a write that Redis's clock sees up to 50 ms early
    (jitter between the worker's clock and Redis's) still sends its event, so a client sees one every 250 ms, not
    every other write."""
    await fleet.submit("a", steps=8)
    fleet.schedule("B1", "a")
    fleet.claim("B1", "a")
    hash_key = fleet.keys.request("a")
    for step in (1, 2, 3):
        seconds, micros = fleet.redis.time()
        early_ms = seconds * 1000 + micros // 1000 - int(WRITE_EVERY_S * 1000) + 40  # the last event 40 ms late
        fleet.redis.hset(hash_key, "event_ms", early_ms)
        fleet.worker.progress(["a"], step, 8, "c1")
    steps = [fields["step"] for fields in fleet.events("a") if fields["event"] == "progress"]
    assert steps == ["1", "2", "3"]


async def test_aborts_failures_and_lost_workers_end_with_their_event(fleet: Fleet) -> None:
    await fleet.submit("queued", "scheduled", "running", "unreadable", "lost")
    assert await fleet.api.abort("queued", time.time()) == "aborted"
    fleet.schedule("B1", "scheduled")
    assert await fleet.api.abort("scheduled", time.time()) == "aborted"
    fleet.schedule("B2", "running")
    fleet.claim("B2", "running")
    assert await fleet.api.abort("running", time.time()) == "running"  # flagged: the worker ends it
    fleet.worker.finish_many({"running": []}, {}, "c1")
    fleet.scheduler.fail_unreadable("unreadable", "its stream entry cannot be read")
    fleet.schedule("B3", "lost")
    fleet.claim("B3", "lost", token="t1")
    fleet.redis.delete(fleet.keys.batch_lock("B3"))  # its worker died: the batch is claimed again, past the limit
    claimed = fleet.claim("B3", "lost", token="t2")
    assert claimed.statuses["lost"] == "failed"

    assert fleet.names("queued") == ["queued", "aborted"]
    assert fleet.names("scheduled") == ["queued", "scheduled", "aborted"]
    assert fleet.names("running") == ["queued", "scheduled", "running", "aborted"]
    assert fleet.names("unreadable") == ["queued", "failed"]
    assert fleet.names("lost") == ["queued", "scheduled", "running", "failed"]
    # nothing is written once a request ended: a late abort or progress adds no event
    await fleet.api.abort("queued", time.time())
    fleet.worker.progress(["running"], 4, 4, "c1")
    assert fleet.names("queued")[-1] == fleet.names("running")[-1] == "aborted"


async def test_deleting_a_request_deletes_its_events(fleet: Fleet) -> None:
    await fleet.submit("a")
    await fleet.api.abort("a", time.time())
    assert fleet.redis.exists(fleet.keys.request_events("a"))
    await fleet.api.forget("a")
    assert not fleet.redis.exists(fleet.keys.request_events("a"))


def test_a_single_position_is_an_entry_id() -> None:
    assert parse_position("1718000000000-3") == "1718000000000-3"
    assert parse_position(" 1718000000000 ") == "1718000000000"
    assert parse_position("") == START
    for bad in ("abc", "1-2-3", "1,2", "-1", "1718000000000-"):
        with pytest.raises(ValueError, match="not an event id"):
            parse_position(bad)


def test_multi_request_positions_round_trip_in_the_order_of_ids() -> None:
    positions = ["1718000000000-0", START, "1718000000123-1"]
    encoded = format_positions(positions)
    assert encoded == "1718000000000-0,,1718000000123-1"
    assert parse_positions(encoded, 3) == positions
    assert parse_positions(None, 2) == parse_positions("", 2) == [START, START]
    with pytest.raises(ValueError, match="holds 2 positions for 3 ids"):
        parse_positions("1-0,2-0", 3)
    with pytest.raises(ValueError, match="not an event id"):
        parse_positions("1-0,x", 2)
    assert sorted(["2-0", "10-0", START, "2-1"], key=position_key) == [START, "2-0", "2-1", "10-0"]


def test_ids_are_split_on_commas_without_blanks_or_repeats() -> None:
    assert unique_ids(["b,a, c,,a", "d"]) == ["b", "a", "c", "d"]
    assert unique_ids([" , "]) == []
