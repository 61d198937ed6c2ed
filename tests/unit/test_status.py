"""``fusefleet status``: the fleet as Redis has it, one line per worker; a clear error when Redis is away."""

from __future__ import annotations

import time

import fakeredis
import pytest
from typer.testing import CliRunner

from fusefleet.cli import cli
from fusefleet.status import render
from gpu_worker.families import FAMILIES
from shared.contracts import Task, WorkerCapabilities
from shared.fleet_state import FleetReader
from shared.keys import RedisKeys
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
    text = render(snapshot)
    assert "queue: 1 waiting" in text and "batches in flight: 1 on 1 live workers" in text
    assert "gpu0@host: live" in text and "FluxPipeline [flux, fused; text-to-image, image-to-image]" in text
    assert "gpu1@host: stale, last beat 60" in text and "(announced nothing)" in text


def test_status_says_when_redis_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    monkeypatch.setenv("FUSEFLEET_REDIS_URL", url)
    monkeypatch.setenv("FUSEFLEET_REDIS_SOCKET_TIMEOUT_S", "1")
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 1
    assert f"Redis at {url} does not answer" in result.output
