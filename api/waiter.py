"""Long-polling support: wake waiting ``GET /v1/requests/{id}?wait_s=`` calls when their request finishes.

One pub/sub subscription per API process listens on ``P:finished`` (published by the Lua scripts when requests
reach a terminal status: a message is one or more request ids, space-separated, one message per script call) and
resolves the futures of the requests waited on. Messages published while the subscription is down are missed, so
each subscription the server confirms wakes every wait (False: read the request again): a long poll whose request
ended meanwhile answers about ``RECONNECT_DELAY_S`` (plus a subscribe and a read) after the loss, not at
``wait_s``. While Redis is down the listener keeps resubscribing; long polls then simply last ``wait_s``.

Requests this process accepted while subscribed (``epoch``, ``accepted``): each subscription confirmed by the server
opens an epoch, and a request submitted during one (its submit script ran after the confirmation) has its ending
published on this connection after it. So while that epoch lasts and no ending of it came, the request has not
finished: ``unfinished_here`` says so, and the long poll skips its first read (one ``HMGET`` a request). An epoch
ends when the subscription is lost or confirmed anew (redis-py may resubscribe by itself: anything may have been
missed in between), and every request noted in it then counts as unknown again: its waits are woken with False
(``register``'s future: True for an ending) so that the route reads it and waits on. The notes are bounded
(``MAX_NOTED``, oldest dropped first: a dropped one is read first, nothing more).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import OrderedDict, defaultdict
from collections.abc import Iterable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)
RECONNECT_DELAY_S = 0.5
START_TIMEOUT_S = 5.0
SUBSCRIBE_TIMEOUT_S = 5.0  # a stalled Redis must not hold the subscription attempt forever
STOP_TIMEOUT_S = 2.0  # redis-py can swallow a cancellation while it waits on a stalled socket: never wait longer
MAX_NOTED = 100_000  # requests accepted here and not seen ending, and endings seen of ids not (yet) noted


class CompletionWaiter:
    """Futures keyed by request id, resolved by messages on the ``finished`` channel."""

    def __init__(self, redis: aioredis.Redis, channel: str) -> None:
        self._redis = redis
        self._channel = channel
        self._waiters: dict[str, list[asyncio.Future[bool]]] = defaultdict(list)
        self._task: asyncio.Task[None] | None = None
        self._attempted = asyncio.Event()
        self._epochs = itertools.count(1)
        self._epoch: int | None = None  # the subscription's, while confirmed and not lost
        self._accepted: OrderedDict[str, tuple[int, str | None]] = OrderedDict()  # id -> (epoch, owner)
        self._ended: OrderedDict[str, None] = OrderedDict()  # ids whose ending came (this epoch or before)

    @property
    def epoch(self) -> int | None:
        """The current subscription's epoch; None while not subscribed. Read it BEFORE submitting requests and pass
        it to ``accepted``: only a submission after the subscription's confirmation is sure to have its ending
        published to it."""
        return self._epoch

    def accepted(self, request_ids: list[str], epoch: int | None, owner: str | None) -> None:
        """Note requests this process submitted (their submit scripts returned) with the ``epoch`` read before."""
        if epoch is None or epoch != self._epoch:
            return
        for request_id in request_ids:
            if request_id in self._ended:  # it ended before we noted it (the listener ran first)
                continue
            self._accepted[request_id] = (epoch, owner)
            if len(self._accepted) > MAX_NOTED:
                self._accepted.popitem(last=False)

    def unfinished_here(self, request_id: str, owner: str | None) -> bool:
        """True only when ``request_id`` was accepted here under ``owner`` in the current epoch and its ending has not
        come: it has certainly not finished (and exists, unless deleted, which only a finished request can be)."""
        noted = self._accepted.get(request_id)
        return noted is not None and self._epoch is not None and noted == (self._epoch, owner)

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

    def register(self, request_id: str) -> asyncio.Future[bool]:
        """A future resolved when ``request_id`` finishes (True) or when its ending may have been missed (False: read
        it now): its note (``accepted``) no longer holds, or a subscription was confirmed anew. Register before
        reading the state (no lost wake-up)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters[request_id].append(future)
        return future

    def discard(self, request_id: str, future: asyncio.Future[bool]) -> None:
        waiters = self._waiters.get(request_id)
        if waiters is not None:
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                del self._waiters[request_id]

    async def _listen(self) -> None:
        lost = False  # warn once per outage, not at every retry
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=False)
            try:
                try:
                    await asyncio.wait_for(pubsub.subscribe(self._channel), timeout=SUBSCRIBE_TIMEOUT_S)
                finally:
                    self._attempted.set()
                if lost:
                    log.info("completion channel subscribed again")
                    lost = False
                async for message in pubsub.listen():
                    kind = message.get("type")
                    if kind == "message":
                        for request_id in str(message["data"]).split():
                            self._wake(request_id)
                    elif kind == "subscribe":  # the server's confirmation: endings published from now on reach us
                        self._lost()  # a resubscription redis-py made by itself may have missed some
                        self._epoch = next(self._epochs)
                        self._read_again()
            except (RedisError, OSError, TimeoutError) as exc:
                self._lost()
                if not lost:
                    log.warning(
                        "completion channel lost (%s); resubscribing every %.1f s, long polls last wait_s meanwhile",
                        exc,
                        RECONNECT_DELAY_S,
                    )
                    lost = True
                await asyncio.sleep(RECONNECT_DELAY_S)
            finally:
                self._lost()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), timeout=STOP_TIMEOUT_S)  # type: ignore[no-untyped-call, unused-ignore]

    def _lost(self) -> None:
        """The subscription is gone (or going): endings may be missed from now on, so no note holds any longer; the
        waits that trusted one are woken (False) to read the state."""
        self._epoch = None
        noted, self._accepted = self._accepted, OrderedDict()
        self._ended.clear()
        self._read_again(noted)

    def _read_again(self, request_ids: Iterable[str] | None = None) -> None:
        """Wake the waits of ``request_ids`` (None: every wait) with False, to read their requests again. Every wait
        on a new subscription's confirmation: an ending published before it may have been missed, and the read each
        wait then makes comes after the confirmation, so a later ending reaches its new future."""
        for request_id in list(self._waiters) if request_ids is None else request_ids:
            for future in self._waiters.get(request_id, []):
                if not future.done():
                    future.set_result(False)

    def _wake(self, request_id: str) -> None:
        self._accepted.pop(request_id, None)
        self._ended[request_id] = None
        if len(self._ended) > MAX_NOTED:
            self._ended.popitem(last=False)
        for future in self._waiters.pop(request_id, []):
            if not future.done():
                future.set_result(True)
