"""``fusefleet status``: the fleet as Redis has it, one line per worker; a clear error when Redis is away."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import fakeredis
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from fusefleet.cli import cli
from fusefleet.local_redis import RedisPointer, local_settings
from fusefleet.status import FleetStatus, render
from gpu_worker.families import FAMILIES
from gpu_worker.metrics import WorkerMetrics
from shared.contracts import BatchKnee, ModelCapabilities, Task, WorkerCapabilities
from shared.fleet_state import FleetReader
from shared.keys import RedisKeys
from shared.redis_conn import redacted
from shared.settings import Settings
from tests.support.redis_server import free_port

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_status_lists_the_queue_and_every_worker() -> None:
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    keys = RedisKeys("t")
    await redis.xadd(keys.requests, {"id": "r1", "spec": "{}"})
    await redis.zadd(keys.inflight, {"b1": 1})
    now_ms = int(time.time() * 1000)
    await redis.zadd(keys.workers, {"gpu0@host": now_ms, "gpu1@host": now_ms - 60_000})
    flux = WorkerCapabilities(
        model="black-forest-labs/FLUX.1-dev",
        pipeline="FluxPipeline",
        tasks=(Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE),
        traits=FAMILIES["flux"].traits,
    )
    await redis.hset(keys.capabilities, "gpu0@host", flux.model_dump_json())
    snapshot = await FleetReader(redis, keys, worker_ttl_s=5, timeout_s=2).read()
    assert snapshot is not None and snapshot.workers_live == 1
    text = render(FleetStatus(snapshot))
    assert "queue: 1 waiting" in text and "batches in flight: 1 on 1 live workers (1 busy)" in text
    assert "gpu0@host: live, idle" in text and "FluxPipeline [flux, fused; text-to-image, image-to-image]" in text
    assert "gpu1@host: stale, idle, last beat 60" in text and "(announced nothing)" in text


async def test_status_shows_what_each_worker_holds_resident() -> None:
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    keys = RedisKeys("t")
    await redis.zadd(keys.workers, {"mux@host": int(time.time() * 1000)})
    sd = ModelCapabilities(model="sd", pipeline="StableDiffusionPipeline", tasks=(Task.TEXT_TO_IMAGE,), load_s=1.25)
    px = ModelCapabilities(model="px", pipeline="PixArtSigmaPipeline", tasks=(Task.TEXT_TO_IMAGE,), resident=False)
    await redis.hset(keys.capabilities, "mux@host", WorkerCapabilities.of((sd, px)).model_dump_json())
    snapshot = await FleetReader(redis, keys, worker_ttl_s=5, timeout_s=2).read()
    assert snapshot is not None
    text = render(FleetStatus(snapshot))
    assert "sd StableDiffusionPipeline [" in text and "text-to-image] (resident, load 1.2 s)" in text
    assert "px PixArtSigmaPipeline [" in text and "text-to-image] (not loaded)" in text


async def test_status_shows_each_models_batch_knees() -> None:
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    keys = RedisKeys("t")
    await redis.zadd(keys.workers, {"gpu0@host": int(time.time() * 1000)})
    knees = (BatchKnee(cost=512 * 512, knee=8), BatchKnee(cost=1024 * 768, knee=1))
    sd = ModelCapabilities(
        model="sd", pipeline="StableDiffusionPipeline", tasks=(Task.TEXT_TO_IMAGE,), batch_knees=knees
    )
    await redis.hset(keys.capabilities, "gpu0@host", WorkerCapabilities.of((sd,)).model_dump_json())
    snapshot = await FleetReader(redis, keys, worker_ttl_s=5, timeout_s=2).read()
    assert snapshot is not None
    assert "(resident) batch knee 512x512: 8, 786432 px: 1" in render(FleetStatus(snapshot))


async def test_status_shows_who_runs_what_and_the_recent_throughput() -> None:
    server = fakeredis.FakeServer()
    redis = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
    keys = RedisKeys("t")
    now_ms = int(time.time() * 1000)
    await redis.zadd(keys.workers, {"gpu0@host": now_ms, "gpu1@host": now_ms})
    await redis.zadd(keys.inflight, {"b" * 32: now_ms, "c" * 32: now_ms})  # b... runs on gpu0, c... waits
    await redis.hset(keys.batch("b" * 32), "ids", "r1 r2")
    await redis.hset(keys.batch("c" * 32), "ids", "r3")
    await redis.hset(keys.request("r1"), mapping={"status": "running", "worker": "gpu0@host", "step": 3, "total": 8})
    await redis.hset(keys.request("r2"), mapping={"status": "succeeded", "worker": "gpu0@host"})
    await redis.hset(keys.request("r3"), mapping={"status": "scheduled"})
    metrics = WorkerMetrics(fakeredis.FakeRedis(server=server, decode_responses=True), keys)
    metrics.forward(batch_size=2, images=30, steps=8, seconds=0.4)
    assert metrics.flush(5)
    status = await read_status_of(redis, keys)
    text = render(status)
    assert "gpu0@host: live, busy: batch bbbbbbbb (2 requests, step 3/8)" in text
    assert "gpu1@host: live, idle" in text
    assert "published, not claimed yet: cccccccc" in text
    assert "throughput: 0.50 images/s over the last 60 s (30 images)" in text
    metrics.close()


async def read_status_of(redis: fakeredis.FakeAsyncRedis, keys: RedisKeys) -> FleetStatus:
    reader = FleetReader(redis, keys, worker_ttl_s=5, timeout_s=2)
    snapshot = await reader.read()
    assert snapshot is not None
    running = await reader.running(snapshot.busy_batches)
    assert running is not None
    return FleetStatus(snapshot, tuple(running))


def test_status_says_when_redis_does_not_answer_and_never_prints_its_password(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    port = free_port()  # nothing listens there
    monkeypatch.setenv("FUSEFLEET_REDIS_URL", f"redis://ops:s3cret-pw@127.0.0.1:{port}/0")
    monkeypatch.setenv("FUSEFLEET_REDIS_SOCKET_TIMEOUT_S", "1")
    result = CliRunner().invoke(cli, ["status", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"Redis at redis://ops:***@127.0.0.1:{port}/0 (FUSEFLEET_REDIS_URL) does not answer" in result.output
    assert "s3cret-pw" not in result.output


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:pw@redis:6379/0", "redis://:***@redis:6379/0"),
        ("rediss://user:p%40ss:w@host/2", "rediss://user:***@host/2"),
        ("redis://:p@ss@host:1/0", "redis://:***@host:1/0"),
        ("redis://user@[::1]:6379/0", "redis://user@[::1]:6379/0"),
        ("unix://:pw@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
        ("redis://host/0?password=pw&db=1", "redis://host/0?password=***&db=1"),
    ],
)
def test_redacted_hides_every_password_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_a_settings_error_echoes_no_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEFLEET_REDIS_URL", "redis://:Zq9-secret@redis:6379/0")
    monkeypatch.setenv("FUSEFLEET_RESULT_STORE", "s3")  # without a bucket: every service refuses to start
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert "needs s3_bucket" in str(refused.value) and "redis://" not in str(refused.value)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_status_reads_the_redis_a_running_up_left_in_its_state_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FUSEFLEET_REDIS_URL", raising=False)
    pointer = RedisPointer.in_dir(tmp_path)
    assert local_settings(tmp_path)[1] == "default"  # no file
    pointer.write("redis://127.0.0.1:7777/0", pid=os.getpid())  # a live process
    settings, source = local_settings(tmp_path)
    assert settings.redis_url == "redis://127.0.0.1:7777/0" and source == f"fusefleet up, {pointer.path}"
    pointer.write("redis://127.0.0.1:7777/0", pid=dead_pid())  # left by an up that was killed
    assert local_settings(tmp_path) == (local_settings(tmp_path / "none")[0], "default")
    pointer.write("redis://127.0.0.1:7777/0", pid=os.getpid())
    monkeypatch.setenv("FUSEFLEET_REDIS_URL", "redis://elsewhere:6379/3")  # the environment wins
    settings, source = local_settings(tmp_path)
    assert settings.redis_url == "redis://elsewhere:6379/3" and source == "FUSEFLEET_REDIS_URL"
    pointer.remove(pid=os.getpid() + 1)  # not the pid it names: kept (a later up's)
    assert pointer.path.exists()
    pointer.remove(pid=os.getpid())
    assert not pointer.path.exists()
