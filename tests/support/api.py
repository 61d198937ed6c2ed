"""The api served in-process on fakeredis (with Lua), for unit tests of every API surface."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import fakeredis
import httpx

from api.app import create_app
from shared import keys as k
from shared.contracts import RequestSpec
from shared.keys import RedisKeys
from shared.results import ResultStore, build_result_store, result_key
from shared.settings import Settings


@dataclass
class Api:
    http: httpx.AsyncClient
    server: fakeredis.FakeServer
    redis: fakeredis.FakeAsyncRedis
    binary: fakeredis.FakeAsyncRedis
    keys: RedisKeys
    settings: Settings
    results: ResultStore
    app: Any = None  # the FastAPI app (its ``state``: the waiter...)

    async def finish(
        self,
        request_id: str,
        outcome: str = "succeeded",
        images: Sequence[bytes] = (),
        error: tuple[str, str] = ("", ""),
    ) -> str:
        return await finish_like_worker(self.redis, self.results, self.keys, request_id, outcome, images, error)


def fake_results(server: fakeredis.FakeServer, settings: Settings) -> ResultStore:
    """The result store ``settings`` names, its Redis backend on the fake server."""
    return build_result_store(settings, fakeredis.FakeRedis(server=server))


async def finish_like_worker(
    redis: fakeredis.FakeAsyncRedis,
    results: ResultStore,
    keys: RedisKeys,
    request_id: str,
    outcome: str = "succeeded",
    images: Sequence[bytes] = (),
    error: tuple[str, str] = ("", ""),
    token: str = "c1",
) -> str:
    """What a worker does to end a request (``redis`` decodes replies): run it under claim ``token`` unless it
    runs already, journal and store ``images`` in the result store, then ``FINISH``. The status after it."""
    key = keys.request(request_id)
    if await redis.hget(key, "status") != "running":
        await redis.hset(key, mapping={"status": "running", "claim": token, "started_at": time.time()})
    spec = RequestSpec.model_validate_json(str(await redis.hget(key, "spec")))
    result_keys = [result_key(request_id, token, i, spec.output_format) for i in range(len(images))]
    await redis.register_script(k.RESULTS_RECORD)(keys=[keys.results_journal], args=[60_000, *result_keys])
    for result, data in zip(result_keys, images, strict=True):
        await anyio.to_thread.run_sync(results.put, result, data)
    args: list[Any] = [time.time(), 60, keys.finished, token, request_id, outcome, *error, ""]
    args += [len(result_keys), *result_keys]
    statuses = await redis.register_script(k.FINISH)(keys=k.finish_keys(keys, request_id), args=args)
    return str(statuses[0])


async def api_harness(settings: Settings) -> AsyncIterator[Api]:
    """The app on fakeredis (with Lua), served in-process; also used by the other ``test_api_*`` modules."""
    server = fakeredis.FakeServer()
    redis = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
    binary = fakeredis.FakeAsyncRedis(server=server, decode_responses=False)
    results = fake_results(server, settings)
    app = create_app(settings, redis=redis, results=results)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            yield Api(http, server, redis, binary, RedisKeys(settings.key_prefix), settings, results, app)
    await redis.aclose()
    await binary.aclose()


def unit_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Small limits and a LoRA folder holding one adapter, ``style``; ``overrides`` win."""
    lora_dir = tmp_path / "loras"
    (lora_dir / "style").mkdir(parents=True, exist_ok=True)
    values: dict[str, Any] = {
        "key_prefix": "t",
        "model": None,  # explicit values win over FUSEFLEET_* variables of the environment
        "lora_dir": lora_dir,
        "max_image_side": 512,
        "max_inference_steps": 50,
        "max_images_per_request": 4,
        "max_prompt_chars": 100,
        "max_queue_len": 5,
        **overrides,
    }
    return Settings(**values)
