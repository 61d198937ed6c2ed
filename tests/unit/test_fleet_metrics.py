"""Fleet metrics in Redis (shared/metrics.py): every transition script counts once, the worker's tally reaches Redis
without ever waiting on it, and the api's collectors render it all as Prometheus text (fakeredis with Lua)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import fakeredis
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector
from redis.backoff import NoBackoff
from redis.retry import Retry

from api.metrics import fleet_metrics
from gpu_worker import metrics as worker_metrics
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.store import WorkerStore
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared import keys as k
from shared.contracts import BatchKnee, BatchMessage, ErrorInfo, ModelCapabilities, WorkerCapabilities
from shared.fleet_state import FleetReader, FleetSnapshot
from shared.metrics import (
    TIME_BUCKETS_MS,
    FleetCounters,
    histogram,
    parse_counters,
    pow2_ms_bucket,
    recent_images,
)
from shared.settings import Settings
from tests.support import prometheus
from tests.unit.test_scripts import submit

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def client(server: fakeredis.FakeServer) -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(server=server, decode_responses=True)


@pytest.fixture
def settings() -> Settings:
    return Settings(key_prefix="m", max_batch_attempts=1)


async def snapshot(server: fakeredis.FakeServer, keys: k.RedisKeys) -> FleetSnapshot:
    reader = FleetReader(
        fakeredis.FakeAsyncRedis(server=server, decode_responses=True), keys, worker_ttl_s=5, timeout_s=2
    )
    read = await reader.read()
    assert read is not None
    return read


def scrape(snap: FleetSnapshot) -> dict[str, float]:
    """``fleet_metrics(snap)`` as the exposition text parses back: sample name{sorted labels} -> value."""

    class Once(Collector):
        def collect(self) -> Iterator[object]:  # type: ignore[override]
            return fleet_metrics(snap)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Once())
    return prometheus.samples(generate_latest(registry).decode())


def abort(client: fakeredis.FakeRedis, keys: k.RedisKeys, rid: str) -> str:
    script = client.register_script(k.ABORT)
    return str(script(keys=k.abort_keys(keys, rid), args=[time.time(), 60, keys.finished, rid]))


def test_pow2_buckets_and_cumulative_histograms() -> None:
    assert [pow2_ms_bucket(ms) for ms in (0, 0.5, 1, 1.01, 2, 3, 1000, 1024, 1025)] == [
        1, 1, 1, 2, 2, 4, 1024, 1024, 2048,
    ]  # fmt: skip
    cumulative = histogram({1.0: 2, 3.0: 1, 500.0: 4}, [1, 2, 4], total=2006.0)
    assert cumulative.buckets == ((1, 2), (2, 2), (4, 3)) and cumulative.count == 7  # 500 only in +Inf


def test_recent_images_counts_the_last_minute_only() -> None:
    now = 10_000
    ring = {"0": f"{now} 5", "1": f"{now - 59} 2", "2": f"{now - 60} 100", "3": f"{now + 1} 7", "4": "junk"}
    assert recent_images(ring, now) == 7


def test_unknown_fields_are_ignored() -> None:
    counters = parse_counters({"accepted": "3", "something:new": "9", "batch_size:x": "1", "images": "nan"})
    assert counters.accepted == 3 and counters.batch_sizes == {} and counters.images == 0


async def test_every_transition_counts_once(
    client: fakeredis.FakeRedis, server: fakeredis.FakeServer, settings: Settings
) -> None:
    sched = SchedulerStore(client, settings)
    worker = WorkerStore(client, settings)
    keys = sched.keys
    submit(client, keys, "a", "b", "c", "d", "e", "f", "g")
    assert abort(client, keys, "e") == "aborted"  # queued
    lease = Lease(client, keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    assert sched.schedule(lease.key, lease.token, "B1", ["a", "b", "c"]) == ["a", "b", "c"]
    assert sched.schedule(lease.key, lease.token, "B2", ["d", "e"]) == ["d"]  # e is no longer queued
    assert sched.schedule(lease.key, lease.token, "B3", ["g"]) == ["g"]
    assert abort(client, keys, "d") == "aborted"  # scheduled
    worker.claim(BatchMessage(batch_id="B1", request_ids=("a", "b", "c"), created_at=0), "t1", "w1")
    assert abort(client, keys, "c") == "running"  # flagged: the worker ends it
    assert abort(client, keys, "c") == "running"  # twice: still one abort when it ends
    oom = ErrorInfo(type="OutOfMemory", message="does not fit")
    finished = worker.finish_many({"a": [], "c": []}, {"b": oom}, "t1")
    assert {rid: str(status) for rid, status in finished.items()} == {"a": "succeeded", "c": "aborted", "b": "failed"}
    assert worker.finish_many({"a": []}, {"b": oom}, "t1")  # a late repeat changes (and counts) nothing
    sched.fail_unreadable("f", "the queued request could not be read")
    message = BatchMessage(batch_id="B3", request_ids=("g",), created_at=0)
    worker.claim(message, "t2", "w1")
    client.delete(keys.batch_lock("B3"))  # its worker died
    worker.claim(message, "t3", "w2")  # past max_batch_attempts (1): WorkerLost

    samples = scrape(await snapshot(server, keys))
    assert samples["fusefleet_requests_accepted_total"] == 7
    for status, count in {"succeeded": 1, "failed": 3, "aborted": 3}.items():
        assert samples[f"fusefleet_requests_finished_total{{status={status}}}"] == count, status
    for kind, count in {"OutOfMemory": 1, "InvalidRequest": 1, "WorkerLost": 1}.items():
        assert samples[f"fusefleet_request_failures_total{{type={kind}}}"] == count, kind
    for stage in ("queued", "scheduled", "running"):
        assert samples[f"fusefleet_aborts_total{{stage={stage}}}"] == 1, stage
    assert samples["fusefleet_batch_size_count"] == 3 and samples["fusefleet_batch_size_sum"] == 5
    assert samples["fusefleet_batch_size_bucket{le=1.0}"] == 2  # B2 (d) and B3 (g)
    assert samples["fusefleet_batch_size_bucket{le=2.0}"] == 2
    assert samples["fusefleet_batch_size_bucket{le=3.0}"] == 3
    assert samples["fusefleet_batch_size_bucket{le=+Inf}"] == 3
    assert samples["fusefleet_admission_wait_seconds_count"] == 5  # a, b, c, d, g joined a batch
    assert 0 <= samples["fusefleet_admission_wait_seconds_sum"] < 5


async def test_admission_wait_is_bucketed_as_pow2_ms_bucket_says(
    client: fakeredis.FakeRedis, server: fakeredis.FakeServer, settings: Settings
) -> None:
    sched = SchedulerStore(client, settings)
    keys = sched.keys
    waits_ms = {"a": 100, "b": 3000, "c": 70_000}
    submit(client, keys, *waits_ms)
    now_ms = int(time.time() * 1000)  # fakeredis's TIME is the host's
    for rid, wait in waits_ms.items():  # accepted this long ago (its stream entry id, Redis ms)
        client.hset(keys.request(rid), "entry", f"{now_ms - wait}-0")
    lease = Lease(client, keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    sched.schedule(lease.key, lease.token, "B1", list(waits_ms))
    counters = (await snapshot(server, keys)).counters
    assert counters.admission_wait_ms == {pow2_ms_bucket(wait): 1 for wait in waits_ms.values()}
    assert counters.admission_wait_s == pytest.approx(73.1, abs=0.5)
    samples = scrape(await snapshot(server, keys))
    assert samples["fusefleet_admission_wait_seconds_bucket{le=0.128}"] == 1
    assert samples["fusefleet_admission_wait_seconds_bucket{le=4.096}"] == 2
    assert samples["fusefleet_admission_wait_seconds_bucket{le=131.072}"] == 3
    assert (
        len([name for name in samples if name.startswith("fusefleet_admission_wait_seconds_bucket")])
        == len(TIME_BUCKETS_MS) + 1
    )


async def test_worker_metrics_reach_redis(client: fakeredis.FakeRedis, server: fakeredis.FakeServer) -> None:
    keys = k.RedisKeys("m")
    metrics = WorkerMetrics(client, keys)
    metrics.forward(batch_size=4, images=8, steps=20, seconds=1.0)  # 50 ms a step
    metrics.forward(batch_size=4, images=4, steps=20, seconds=3.0)  # 150 ms a step
    metrics.forward(batch_size=1, images=1, steps=10, seconds=0.05)  # 5 ms a step
    metrics.oom_split()
    assert metrics.flush(5)
    snap = await snapshot(server, keys)
    assert snap.counters.forwards == {4: (2, 4.0), 1: (1, 0.05)}
    assert snap.counters.images == 13 and snap.counters.oom_splits == 1
    assert snap.recent_images == 13 and snap.images_per_s == pytest.approx(13 / 60)
    samples = scrape(snap)
    assert samples["fusefleet_forward_seconds_count{batch_size=4}"] == 2
    assert samples["fusefleet_forward_seconds_sum{batch_size=4}"] == 4.0
    assert samples["fusefleet_forward_seconds_count{batch_size=1}"] == 1
    assert samples["fusefleet_images_total"] == 13 and samples["fusefleet_oom_splits_total"] == 1
    assert samples["fusefleet_step_seconds_bucket{le=0.008}"] == 1  # 5 ms
    assert samples["fusefleet_step_seconds_bucket{le=0.064}"] == 2  # 50 ms
    assert samples["fusefleet_step_seconds_bucket{le=0.256}"] == 3  # 150 ms
    assert samples["fusefleet_step_seconds_count"] == 3
    assert samples["fusefleet_step_seconds_sum"] == pytest.approx(0.205)
    metrics.close()


async def test_prompt_cache_lookups_reach_the_metrics(
    client: fakeredis.FakeRedis, server: fakeredis.FakeServer
) -> None:
    keys = k.RedisKeys("m")
    metrics = WorkerMetrics(client, keys)
    metrics.prompt_cache(hits=3, misses=2)
    metrics.prompt_cache(hits=0, misses=1)
    assert metrics.flush(5)
    snap = await snapshot(server, keys)
    assert snap.counters.prompt_cache == {"hit": 3, "miss": 3}
    samples = scrape(snap)
    assert samples["fusefleet_prompt_cache_lookups_total{outcome=hit}"] == 3
    assert samples["fusefleet_prompt_cache_lookups_total{outcome=miss}"] == 3
    metrics.close()


async def test_the_batch_knees_of_live_workers_are_a_gauge(
    client: fakeredis.FakeRedis, server: fakeredis.FakeServer
) -> None:
    keys = k.RedisKeys("m")
    now_ms = time.time() * 1000
    client.zadd(keys.workers, {"w1": now_ms, "w2": now_ms, "gone": now_ms - 60_000})
    for worker, knee in (("w1", 8), ("w2", 4), ("gone", 1)):
        served = ModelCapabilities(model="sd", pipeline="P", tasks=(), batch_knees=(BatchKnee(cost=4096, knee=knee),))
        client.hset(keys.capabilities, worker, WorkerCapabilities.of((served,)).model_dump_json())
    samples = scrape(await snapshot(server, keys))
    assert samples["fusefleet_batch_knee{model=sd,pixels=4096}"] == 4  # the lowest live one


def silent_server() -> tuple[socket.socket, int]:
    """A TCP server that accepts connections and never answers: a stalled Redis."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener, listener.getsockname()[1]


def test_a_stalled_redis_never_holds_up_the_forward(caplog: pytest.LogCaptureFixture) -> None:
    listener, port = silent_server()
    try:
        # each write then fails within (1 + retries) x socket_timeout
        stalled = redis.Redis(port=port, socket_timeout=0.3, socket_connect_timeout=0.3, retry=Retry(NoBackoff(), 1))
        metrics = WorkerMetrics(stalled, k.RedisKeys("m"))
        started = time.monotonic()
        for _ in range(100):
            metrics.forward(batch_size=2, images=2, steps=4, seconds=0.1)
            metrics.oom_split()
        assert time.monotonic() - started < 0.1  # no call waited on Redis
        assert not metrics.flush(0.05)  # the write is stuck meanwhile...
        assert metrics.flush(5)  # ...until the socket timeout ends it: dropped, not retried
        assert "metrics write failed" in caplog.text
        metrics.close()
    finally:
        listener.close()


def test_worker_metrics_in_a_thread_that_is_not_the_first(client: fakeredis.FakeRedis) -> None:
    """Recorded from several threads at once (the forward and the finisher): nothing lost."""
    keys = k.RedisKeys("m")
    metrics = WorkerMetrics(client, keys)

    def record() -> None:
        for _ in range(50):
            metrics.forward(batch_size=1, images=1, steps=1, seconds=0.001)

    threads = [threading.Thread(target=record) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert metrics.flush(5)
    assert parse_counters(client.hgetall(keys.metrics)).images == 200
    metrics.close()


def test_a_busy_worker_writes_its_metrics_at_most_once_an_interval(
    client: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first forward is written at once; those of the next ``WRITE_EVERY_S`` wait in the tally and go in one
    call (here the interval is long, so only ``flush`` ends it): one Redis call a second, not one a forward."""
    monkeypatch.setattr(worker_metrics, "WRITE_EVERY_S", 60.0)
    keys = k.RedisKeys("m")
    metrics = WorkerMetrics(client, keys)
    add, writes = metrics._add, []
    monkeypatch.setattr(metrics, "_add", lambda **kw: (writes.append(kw), add(**kw)))
    metrics.forward(batch_size=1, images=1, steps=1, seconds=0.01)
    deadline = time.monotonic() + 5
    while parse_counters(client.hgetall(keys.metrics)).images != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(10):
        metrics.forward(batch_size=1, images=1, steps=1, seconds=0.01)
    time.sleep(0.2)  # an unthrottled thread writes these within microseconds
    assert parse_counters(client.hgetall(keys.metrics)).images == 1 and len(writes) == 1
    assert metrics.flush(5)  # flush does not wait out the interval
    assert parse_counters(client.hgetall(keys.metrics)).images == 11 and len(writes) == 2
    metrics.forward(batch_size=1, images=1, steps=1, seconds=0.01)
    metrics.close(5)  # nor does close
    assert parse_counters(client.hgetall(keys.metrics)).images == 12 and len(writes) == 3


async def test_slots_busy_leave_out_batches_storing(client: fakeredis.FakeRedis, server: fakeredis.FakeServer) -> None:
    keys = k.RedisKeys("m")
    now_ms = int(time.time() * 1000)
    client.zadd(keys.workers, {"w1": now_ms, "w2": now_ms})
    client.zadd(keys.inflight, {"B1": now_ms, "B2": now_ms, "B3": now_ms})
    client.zadd(keys.storing, {"B2": now_ms})
    snap = await snapshot(server, keys)
    assert snap.busy_batches == ("B1", "B3") and snap.batches_in_flight == 3
    samples = scrape(snap)
    assert samples["fusefleet_worker_slots_busy"] == 2 and samples["fusefleet_workers_live"] == 2
    assert snap.counters == FleetCounters()  # nothing counted yet: every counter at 0
    assert samples["fusefleet_requests_finished_total{status=aborted}"] == 0
