"""The long polls' waiter (api/waiter.py) on fakeredis: a finished-channel message wakes every id it names."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import fakeredis
import pytest
import redis.asyncio as aioredis

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


class _ScriptedPubSub:
    """A subscription whose server the test plays: ``subscribe`` is confirmed at once, ``fail`` drops the connection
    (the listener's next read raises), ``publish`` delivers a message."""

    def __init__(self) -> None:
        self._inbox: asyncio.Queue[dict[str, object] | Exception] = asyncio.Queue()

    async def subscribe(self, channel: str) -> None:
        self._inbox.put_nowait({"type": "subscribe", "channel": channel, "data": 1})

    async def listen(self) -> AsyncIterator[dict[str, object]]:
        while True:
            item = await self._inbox.get()
            if isinstance(item, Exception):
                raise item
            yield item

    def publish(self, data: str) -> None:
        self._inbox.put_nowait({"type": "message", "data": data})

    def fail(self) -> None:
        self._inbox.put_nowait(ConnectionError("Connection closed by server."))

    async def aclose(self) -> None:
        pass


class _ScriptedRedis:
    def __init__(self) -> None:
        self.subscriptions: list[_ScriptedPubSub] = []

    def pubsub(self, **_: object) -> _ScriptedPubSub:
        self.subscriptions.append(_ScriptedPubSub())
        return self.subscriptions[-1]


@pytest.mark.anyio
async def test_a_new_subscription_wakes_every_wait_to_read_what_it_may_have_missed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ending published while the subscription was down never comes: a wait on a request that was not noted here
    (accepted by another api, or already read once) must still read it again, after the new confirmation."""
    monkeypatch.setattr("api.waiter.RECONNECT_DELAY_S", 0.01)
    redis = _ScriptedRedis()
    waiter = CompletionWaiter(cast(aioredis.Redis, redis), "t:finished")
    await waiter.start()
    try:
        first = await _subscribed(waiter)
        elsewhere = waiter.register("elsewhere")  # not noted: only its ending (or a new subscription) wakes it
        redis.subscriptions[0].fail()  # CLIENT KILL TYPE pubsub; "elsewhere" ends while nobody listens
        assert await asyncio.wait_for(elsewhere, timeout=2) is False  # woken by the new subscription: read it
        assert waiter.epoch is not None and waiter.epoch > first and len(redis.subscriptions) == 2
        later = waiter.register("later")  # registered after the confirmation: its ending reaches it
        await asyncio.sleep(0.05)
        assert not later.done()
        redis.subscriptions[1].publish("later")
        assert await asyncio.wait_for(later, timeout=2) is True
    finally:
        await waiter.stop()
