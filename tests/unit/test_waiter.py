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


async def _subscribed(waiter: CompletionWaiter) -> int:
    """The waiter's epoch once the server confirmed its subscription."""
    for _ in range(200):
        if waiter.epoch is not None:
            return waiter.epoch
        await asyncio.sleep(0.01)
    raise AssertionError("the subscription was never confirmed")


@pytest.mark.anyio
async def test_a_request_accepted_while_subscribed_is_unfinished_here_until_its_ending_comes() -> None:
    """The long poll skips its first read only for such a request, and only for the owner that submitted it."""
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    waiter = CompletionWaiter(redis, "t:finished")
    await waiter.start()
    try:
        epoch = await _subscribed(waiter)
        waiter.accepted(["a", "b"], epoch, "alice")
        assert waiter.unfinished_here("a", "alice") and waiter.unfinished_here("b", "alice")
        assert not waiter.unfinished_here("a", "bob") and not waiter.unfinished_here("a", None)
        assert not waiter.unfinished_here("c", "alice")  # accepted elsewhere: read it
        ended = waiter.register("a")
        await redis.publish("t:finished", "a")
        assert await asyncio.wait_for(ended, timeout=2) is True
        assert not waiter.unfinished_here("a", "alice") and waiter.unfinished_here("b", "alice")
    finally:
        await waiter.stop()
        await redis.aclose()


@pytest.mark.anyio
async def test_an_ending_that_came_before_the_note_and_a_submission_before_the_subscription_are_read() -> None:
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    waiter = CompletionWaiter(redis, "t:finished")
    waiter.accepted(["early"], waiter.epoch, None)  # not subscribed yet: epoch None
    await waiter.start()
    try:
        epoch = await _subscribed(waiter)
        assert not waiter.unfinished_here("early", None)
        woken = waiter.register("fast")
        await redis.publish("t:finished", "fast")  # its ending reaches the listener before the route notes it
        await asyncio.wait_for(woken, timeout=2)
        waiter.accepted(["fast"], epoch, None)
        assert not waiter.unfinished_here("fast", None)
    finally:
        await waiter.stop()
        await redis.aclose()


@pytest.mark.anyio
async def test_a_lost_subscription_drops_every_note_and_wakes_their_waits_to_read() -> None:
    """Endings published while the subscription is down are missed: no note may be trusted after it."""
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    waiter = CompletionWaiter(redis, "t:finished")
    await waiter.start()
    try:
        epoch = await _subscribed(waiter)
        waiter.accepted(["a"], epoch, None)
        waiting = waiter.register("a")
        waiter._lost()  # what the listener does when the connection fails or the server confirms a resubscription
        assert await asyncio.wait_for(waiting, timeout=2) is False
        assert not waiter.unfinished_here("a", None)
        waiter.accepted(["b"], epoch, None)  # submitted under the lapsed epoch
        assert not waiter.unfinished_here("b", None)
    finally:
        await waiter.stop()
        await redis.aclose()
