"""Long-polling support: wake waiting ``GET /v1/requests/{id}?wait_s=`` calls when their request finishes.

One pub/sub subscription per API process listens on ``P:finished`` (published by the Lua scripts when requests
reach a terminal status: a message is one or more request ids, space-separated, one message per script call) and
resolves the futures of the requests waited on. A missed message (reconnect)
costs nothing but latency: every wait is bounded and the route reads the state again afterwards. While Redis is
down the listener keeps resubscribing; long polls then simply last ``wait_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)
RECONNECT_DELAY_S = 0.5
START_TIMEOUT_S = 5.0
SUBSCRIBE_TIMEOUT_S = 5.0  # a stalled Redis must not hold the subscription attempt forever
STOP_TIMEOUT_S = 2.0  # redis-py can swallow a cancellation while it waits on a stalled socket: never wait longer


class CompletionWaiter:
    """Futures keyed by request id, resolved by messages on the ``finished`` channel."""

    def __init__(self, redis: aioredis.Redis, channel: str) -> None:
        self._redis = redis
        self._channel = channel
        self._waiters: dict[str, list[asyncio.Future[None]]] = defaultdict(list)
        self._task: asyncio.Task[None] | None = None
        self._attempted = asyncio.Event()

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start listening; returns once the first subscription attempt succeeded or failed (at most
        ``timeout_s``), so an API started while Redis is down serves 503s at once instead of waiting."""
        self._task = asyncio.create_task(self._listen(), name="fusefleet-completion-waiter")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._attempted.wait(), timeout=timeout_s)

    async def stop(self) -> None:
        """Stop listening; returns within ``STOP_TIMEOUT_S`` even when the listener is stuck on a stalled Redis."""
        if self._task is not None:
            self._task.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=STOP_TIMEOUT_S)
            if not done:
                log.warning("completion listener did not stop within %.1f s; leaving it behind", STOP_TIMEOUT_S)

    def register(self, request_id: str) -> asyncio.Future[None]:
        """A future resolved when ``request_id`` finishes; register before reading the state (no lost wake-up)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[request_id].append(future)
        return future

    def discard(self, request_id: str, future: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(request_id)
        if waiters is not None:
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                del self._waiters[request_id]

    async def _listen(self) -> None:
        lost = False  # warn once per outage, not at every retry
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                try:
                    await asyncio.wait_for(pubsub.subscribe(self._channel), timeout=SUBSCRIBE_TIMEOUT_S)
                finally:
                    self._attempted.set()
                if lost:
                    log.info("completion channel subscribed again")
                    lost = False
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        for request_id in str(message["data"]).split():
                            self._wake(request_id)
            except (RedisError, OSError, TimeoutError) as exc:
                if not lost:
                    log.warning(
                        "completion channel lost (%s); resubscribing every %.1f s, long polls last wait_s meanwhile",
                        exc,
                        RECONNECT_DELAY_S,
                    )
                    lost = True
                await asyncio.sleep(RECONNECT_DELAY_S)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), timeout=STOP_TIMEOUT_S)  # type: ignore[no-untyped-call]

    def _wake(self, request_id: str) -> None:
        for future in self._waiters.pop(request_id, []):
            if not future.done():
                future.set_result(None)
