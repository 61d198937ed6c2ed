"""``fusefleet status`` says which models run approximate accelerations (``ModelTraits.approximate``), and what
that means for their rows' peers; an exact model's line says nothing more."""

from __future__ import annotations

import time

import fakeredis
import pytest

from fusefleet.status import FleetStatus, render
from shared.contracts import ModelCapabilities, ModelTraits, Task, WorkerCapabilities
from shared.fleet_state import FleetReader
from shared.keys import RedisKeys

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_status_flags_a_model_with_approximate_accelerations() -> None:
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    keys = RedisKeys("t")
    await redis.zadd(keys.workers, {"gpu0@host": int(time.time() * 1000)})
    cached = ModelTraits(family="flux", approximate="step cache first_block:0.1 (a row may depend on its peers)")
    flux = ModelCapabilities(model="flux", pipeline="FluxPipeline", tasks=(Task.TEXT_TO_IMAGE,), traits=cached)
    sd = ModelCapabilities(model="sd", pipeline="StableDiffusionPipeline", tasks=(Task.TEXT_TO_IMAGE,))
    await redis.hset(keys.capabilities, "gpu0@host", WorkerCapabilities.of((flux, sd)).model_dump_json())
    snapshot = await FleetReader(redis, keys, worker_ttl_s=5, timeout_s=2).read()
    assert snapshot is not None
    text = render(FleetStatus(snapshot))
    assert "(resident) APPROXIMATE: step cache first_block:0.1 (a row may depend on its peers)" in text
    assert text.count("APPROXIMATE") == 1  # sd is exact
