"""The api served in-process on fakeredis (with Lua), for unit tests of every API surface."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fakeredis
import httpx

from api.app import create_app
from shared.keys import RedisKeys
from shared.settings import Settings


@dataclass
class Api:
    http: httpx.AsyncClient
    server: fakeredis.FakeServer
    redis: fakeredis.FakeAsyncRedis
    binary: fakeredis.FakeAsyncRedis
    keys: RedisKeys
    settings: Settings


async def api_harness(settings: Settings) -> AsyncIterator[Api]:
    """The app on fakeredis (with Lua), served in-process; also used by the other ``test_api_*`` modules."""
    server = fakeredis.FakeServer()
    redis = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
    binary = fakeredis.FakeAsyncRedis(server=server, decode_responses=False)
    app = create_app(settings, redis=redis, redis_binary=binary)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            yield Api(http, server, redis, binary, RedisKeys(settings.key_prefix), settings)
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
