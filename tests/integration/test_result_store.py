"""The result stores end to end, on real fleets (api, scheduler with its sweeper, a worker returning full-size
images at once): every backend stores, serves, deletes and expires images; the Redis store's size cap drops the
oldest results and says so; S3 can hand out presigned URLs; and the Redis memory a finished request costs, per
backend (the figures of docs/deploy.md: run this module with ``-s`` to print them)."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
import redis
from PIL import Image

from fusefleet.client import Client
from tests.support import fleet as support_fleet
from tests.support.fleet import Fleet
from tests.support.processes import wait_for
from tests.support.redis_server import RedisServer
from tests.support.s3_server import S3Server, s3_server

pytestmark = pytest.mark.timeout(300)

FAST_ENV = {
    "FUSEFLEET_RUNNER": "tests.support.runners:FullSizeRunner",
    "FUSEFLEET_MAX_NUM_SEQS": "8",
    "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "50",
    "FUSEFLEET_RESULT_SWEEP_INTERVAL_S": "0.5",
    "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
}
S3_PREFIX = "results/"
MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def stored_keys(fleet: Fleet, env: dict[str, str], s3: S3Server) -> set[str]:
    """The result keys whose objects exist in the fleet's result store."""
    kind = env.get("FUSEFLEET_RESULT_STORE", "redis")
    if kind == "filesystem":
        root = Path(env["FUSEFLEET_RESULT_DIR"])
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".partial" not in p.name}
    if kind == "s3":
        return {key.removeprefix(S3_PREFIX) for key in s3.keys(S3_PREFIX) if key.startswith(S3_PREFIX)}
    prefix = fleet.keys.result("")
    return {key.removeprefix(prefix) for key in fleet.redis.scan_iter(match=prefix + "*", count=1000)}


def backend_env(kind: str, tmp_path: Path, s3: S3Server) -> dict[str, str]:
    if kind == "filesystem":
        return {"FUSEFLEET_RESULT_STORE": "filesystem", "FUSEFLEET_RESULT_DIR": str(tmp_path / "results")}
    if kind == "s3":
        return s3.env(prefix=S3_PREFIX)
    return {"FUSEFLEET_RESULT_STORE": "redis"}


def fast_fleet(redis_server: RedisServer, log_dir: Path, **env: str) -> AbstractContextManager[Fleet]:
    log_dir.mkdir(parents=True, exist_ok=True)
    return support_fleet.running_fleet(redis_server.url, log_dir, {**FAST_ENV, **env})


def result_keys(fleet: Fleet, request_id: str) -> set[str]:
    return set(str(fleet.redis.hget(fleet.keys.request(request_id), "results") or "").split())


@pytest.mark.parametrize("kind", ["redis", "filesystem", "s3"])
def test_store_serve_delete_and_expire(redis_server: RedisServer, tmp_path: Path, s3: S3Server, kind: str) -> None:
    env = backend_env(kind, tmp_path, s3)
    with fast_fleet(redis_server, tmp_path / "logs", FUSEFLEET_RESULT_TTL_S="6", **env) as fleet:
        ids = {
            fmt: fleet.submit(n=2, output_format=fmt, **({"output_compression": 70} if fmt != "png" else {}))
            for fmt in MEDIA_TYPES
        }
        states = fleet.wait_done(list(ids.values()), timeout=60)
        assert {state["status"] for state in states.values()} == {"succeeded"}, states
        everything = set().union(*(result_keys(fleet, rid) for rid in ids.values()))
        assert len(everything) == 6 and stored_keys(fleet, env, s3) >= everything
        for fmt, rid in ids.items():
            for url in states[rid]["images"]:
                response = fleet.http.get(url)
                assert response.status_code == 200, response.text
                assert response.headers["content-type"] == MEDIA_TYPES[fmt]
                with Image.open(io.BytesIO(response.content)) as image:
                    assert (image.format or "").lower() == fmt and image.size == (64, 64)

        deleted = ids["png"]
        gone = result_keys(fleet, deleted)
        assert fleet.http.delete(f"/v1/requests/{deleted}").status_code == 204
        assert fleet.http.get(f"/v1/requests/{deleted}").status_code == 404
        assert fleet.http.get(f"/v1/requests/{deleted}/images/0").status_code == 404
        assert not stored_keys(fleet, env, s3) & gone, "DELETE left objects behind"

        # the rest expire with their requests (result_ttl_s): state and objects, swept within a sweep interval
        wait_for(
            lambda: not stored_keys(fleet, env, s3) & everything,
            30,
            f"expired images to be swept ({fleet.logs_hint()})",
            interval=0.25,
        )
        assert all(fleet.http.get(f"/v1/requests/{rid}").status_code == 404 for rid in ids.values())
        assert not fleet.redis.zcard(fleet.keys.results_journal)


def test_redis_size_cap_drops_the_oldest_and_says_so(redis_server: RedisServer, tmp_path: Path) -> None:
    one_image = 64 * 64 * 3 + 4096  # a 64x64 noise PNG is about this big at most
    with fast_fleet(
        redis_server, tmp_path / "logs", FUSEFLEET_RESULT_REDIS_MAX_BYTES=str(3 * one_image)
    ) as fleet:
        ids = []
        for i in range(5):  # one after the other: the oldest is known
            ids.append(fleet.submit(prompt=f"image {i}"))
            fleet.wait_done(ids[-1:], timeout=60)
        used = int(fleet.redis.get(fleet.keys.redis_results_used) or 0)
        assert 0 < used <= 3 * one_image
        oldest, newest = fleet.get(ids[0]), fleet.get(ids[-1])
        assert oldest["status"] == "succeeded" and oldest["images"] == [] and oldest["images_evicted_at"]
        answer = fleet.http.get(f"/v1/requests/{ids[0]}/images/0")
        assert answer.status_code == 410 and "result_redis_max_bytes" in answer.json()["detail"]
        assert newest["images_evicted_at"] is None and fleet.image(ids[-1])


def test_s3_redirects_to_presigned_urls(redis_server: RedisServer, tmp_path: Path, s3: S3Server) -> None:
    env = {**s3.env(prefix=S3_PREFIX), "FUSEFLEET_RESULT_DELIVERY": "redirect"}
    with fast_fleet(redis_server, tmp_path / "logs", **env) as fleet:
        rid = fleet.submit(output_format="webp")
        fleet.wait_done([rid], timeout=60)
        answer = fleet.http.get(f"/v1/requests/{rid}/images/0")
        assert answer.status_code == 307
        location = answer.headers["location"]
        assert location.startswith(s3.endpoint_url) and "Signature=" in location
        image = httpx.get(location, timeout=10)
        assert image.status_code == 200 and image.headers["content-type"] == "image/webp"
        assert Image.open(io.BytesIO(image.content)).size == (64, 64)
        with Client(fleet.base_url) as client:  # the Python client follows the redirect
            assert client.image(rid, 0) == image.content


MEMORY_REQUESTS = 48
SIDE = 512


class HeldMemory(NamedTuple):
    """What Redis holds, two ways. ``keys``: the exact ``MEMORY USAGE`` of every key (``SAMPLES 0``), which moves
    only with the data. ``allocated``: ``used_memory`` less client buffers and the script cache, which adds the
    keyspace's table overhead and a fixed ~130 KiB a run grows by (allocations of the moment, tables sized
    once). (Lua's own heap,
    ``used_memory_vm_eval``, is not part of ``used_memory`` on Redis 7+ or Valkey: subtracting it, as this test
    once did, moved the figure with Lua's garbage collector.)"""

    keys: int
    allocated: int

    @classmethod
    def of(cls, client: redis.Redis) -> HeldMemory:
        memory = client.info("memory")
        allocated = int(memory["used_memory"]) - int(memory.get("mem_clients_normal", 0))
        allocated -= int(memory.get("used_memory_scripts", 0))
        keys = sum(int(client.memory_usage(key, samples=0) or 0) for key in client.scan_iter(count=1000))
        return cls(keys, allocated)

    def per_request(self, before: HeldMemory, requests: int) -> HeldMemory:
        return HeldMemory((self.keys - before.keys) // requests, (self.allocated - before.allocated) // requests)


def redis_memory_per_request(server: RedisServer, log_dir: Path, **env: str) -> tuple[HeldMemory, int]:
    """Redis memory per finished SIDE px request (``HeldMemory``: state, image keys, batch records, and for the
    Redis store the image bytes), and the size of one stored image."""
    client = redis.Redis.from_url(server.url, decode_responses=True)
    with fast_fleet(server, log_dir, FUSEFLEET_RESULT_SWEEP_INTERVAL_S="3600", **env) as fleet:
        warm = fleet.submit_batch([{"prompt": "warm-up", "width": SIDE, "height": SIDE}] * 8)
        fleet.wait_done(warm, timeout=120)
        time.sleep(0.5)
        before = HeldMemory.of(client)
        ids: list[str] = []
        for start in range(0, MEMORY_REQUESTS, 16):
            chunk = [{"prompt": f"r{start + i}", "width": SIDE, "height": SIDE} for i in range(16)]
            ids += fleet.submit_batch(chunk)
        fleet.wait_done(ids, timeout=240)
        time.sleep(0.5)
        after = HeldMemory.of(client)
        image = fleet.image(ids[0])
    client.close()
    return after.per_request(before, MEMORY_REQUESTS), len(image)


def test_redis_memory_per_finished_request(tmp_path: Path) -> None:
    """Images out of Redis: a finished 512 px request costs Redis a few KB of state, not the image."""
    figures: dict[str, tuple[HeldMemory, int]] = {}
    for kind, env in {
        "redis": {"FUSEFLEET_RESULT_STORE": "redis"},
        "filesystem": {"FUSEFLEET_RESULT_STORE": "filesystem", "FUSEFLEET_RESULT_DIR": str(tmp_path / "results")},
    }.items():
        server = RedisServer(tmp_path / f"redis-{kind}").start()  # a Redis of its own: nothing else in its memory
        try:
            figures[kind] = redis_memory_per_request(server, tmp_path / f"logs-{kind}", **env)
        finally:
            server.stop()
    for kind, (held, image_bytes) in figures.items():
        print(f"\nRedis memory per finished {SIDE}x{SIDE} request, {kind} result store: keys {held.keys / 1024:.1f} "
              f"KiB, used_memory {held.allocated / 1024:.1f} KiB (one PNG: {image_bytes / 1024:.0f} KiB)")
    (redis_held, image_bytes), (filesystem_held, _) = figures["redis"], figures["filesystem"]
    assert redis_held.keys > 0.8 * image_bytes and redis_held.allocated > 0.8 * image_bytes  # the image is in Redis
    assert filesystem_held.keys < 3072, figures  # state and keys only: 2.3 KiB measured
    # and nothing else grows by much more: 5-5.6 KiB measured, of which ~2.7 KiB is a run's fixed growth (allocations
    # of the moment, tables sized once: 2.9 KiB a request over 192 requests)
    assert filesystem_held.allocated < 16384, figures


def test_each_s3_server_starts_empty() -> None:
    """moto keeps buckets in process-wide state: a server started after another must not show its objects (a test
    that lists the bucket would see a neighbour's results)."""
    with s3_server(bucket="isolation") as first:
        first.client.put_object(Bucket=first.bucket, Key=f"{S3_PREFIX}left-behind.png", Body=b"x")
        assert first.keys() == {f"{S3_PREFIX}left-behind.png"}
    with s3_server(bucket="isolation") as second:
        assert second.keys() == set()
