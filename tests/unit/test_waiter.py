"""The long polls' waiter (api/waiter.py) on fakeredis: a finished-channel message wakes every id it names."""

from __future__ import annotations

import asyncio

import fakeredis
import pytest

from api.waiter import CompletionWaiter


@pytest.mark.anyio
async def test_one_message_of_several_ids_wakes_each_of_them() -> None:
    """FINISH publishes the ids it ended in one call as one message, space-separated."""
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    waiter = CompletionWaiter(redis, "t:finished")
    await waiter.start()
    try:
        a, b, c = waiter.register("a"), waiter.register("b"), waiter.register("c")
        await redis.publish("t:finished", "a b")
        await asyncio.wait_for(asyncio.gather(a, b), timeout=2)
        assert not c.done()
    finally:
        await waiter.stop()
        await redis.aclose()
