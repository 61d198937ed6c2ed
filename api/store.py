"""Async access to the request state in Redis, through the keys and Lua scripts of ``shared.keys``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from api.input_images import StoredInputs
from api.outage import REDIS_FAILURES, StoreUnavailable
from shared.contracts import RequestSpec, RequestState, RequestStatus, WorkerCapabilities
from shared.fleet_state import parse_capabilities
from shared.keys import ABORT, FORGET, RATE_LIMIT, SUBMIT, RedisKeys, abort_keys, submit_keys
from shared.results import ResultStore, ResultStoreError
from shared.state import STATE_FIELDS, parse_state

_T = TypeVar("_T")
_A = TypeVar("_A")
CAPABILITIES_TTL_S = 2.0  # how long the api trusts what it read of the workers' announcements
OWNER_FIELD = "key"
"""The request hash field holding the name of the API key that submitted it (``submit.lua``)."""


RefusalReason = Literal["invalid", "queue_full", "rate_limited", "max_queued", "input_budget"]
"""Why a submission was refused: a 422 (limits, capabilities, input images), a full queue (503), one of the
API key's limits (429: its rate, its max queued), or the input budget (429, or 413: ``api.input_budget``)."""
SubmitOutcome = Literal["accepted", "queue_full", "max_queued", "input_budget"]
"""What ``RequestStore.submit`` did: queued everything, or nothing because the queue, the key or the input budget
is full."""
_SUBMIT_OUTCOMES: dict[int, SubmitOutcome] = {1: "accepted", 0: "queue_full", -1: "max_queued", -2: "input_budget"}


class SubmissionCounters(Protocol):
    """What the api counts of submissions (``api.metrics.ApiMetrics``)."""

    def count_submitted(self, count: int) -> None: ...

    def count_refused(self, reason: RefusalReason) -> None: ...


@dataclass(frozen=True, slots=True)
class Submitter:
    """Who submits (with API keys): the key's name, recorded on each request, and its max queued (None: none)."""

    name: str
    max_queued: int | None = None


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where a request's events go: its URL and the stream events it subscribes to (``shared.webhooks``)."""

    url: str
    on: str


@dataclass(frozen=True, slots=True)
class Forgotten:
    """A finished request was deleted; these result keys' objects are deleted (or left to the sweeper)."""

    result_keys: tuple[str, ...]


class RequestStore:
    """Submits, reads, aborts and deletes requests; reads their images from the result store.

    ``redis`` decodes replies to ``str``. The scripts are registered here (no network); redis-py loads them on
    first use. ``results`` is synchronous: its calls run in a worker thread. ``max_input_bytes`` is the input
    budget (``api.input_budget``; None: input bytes are counted, not limited).

    Every call ends within ``call_timeout_s`` (waiting for a pooled connection, connecting and every round trip
    included) and raises ``StoreUnavailable`` when Redis or the result store fails or does not answer in time.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        results: ResultStore,
        keys: RedisKeys,
        *,
        max_queue_len: int,
        result_ttl_s: int,
        call_timeout_s: float,
        max_input_bytes: int | None = None,
    ) -> None:
        self._redis = redis
        self.results = results
        self._keys = keys
        self._max_queue_len = max_queue_len
        self._result_ttl_s = result_ttl_s
        self._call_timeout_s = call_timeout_s
        self._max_input_bytes = max_input_bytes
        self._capabilities: tuple[float, list[WorkerCapabilities]] | None = None
        self.counters: SubmissionCounters | None = None  # set by api.metrics at start-up
        self._submit = redis.register_script(SUBMIT)
        self._abort = redis.register_script(ABORT)
        self._forget = redis.register_script(FORGET)
        self._rate_limit = redis.register_script(RATE_LIMIT)

    async def submit(
        self,
        specs: Sequence[RequestSpec],
        inputs: Sequence[StoredInputs | None] | None = None,
        submitter: Submitter | None = None,
        webhooks: Sequence[Webhook | None] | None = None,
    ) -> SubmitOutcome:
        """Queue all ``specs`` (with their input images, ``inputs[i]`` for ``specs[i]``, under ``submitter``'s key,
        with their webhooks, ``webhooks[i]``) in one atomic step, or nothing when the queue would overflow, the key
        exceed its max queued or the inputs the input budget."""
        name, limited, max_queued = "", "", 0  # no key; a key without a max queued: its name only
        if submitter is not None:
            name = submitter.name
            if submitter.max_queued is not None:
                limited, max_queued = "1", submitter.max_queued
        keys = submit_keys(self._keys, [spec.id for spec in specs], self._keys.api_key_unfinished(name))
        budget = "" if self._max_input_bytes is None else self._max_input_bytes
        args: list[str | bytes | int | float] = [
            self._max_queue_len,
            name,
            limited,
            max_queued,
            self._result_ttl_s,
            budget,
        ]
        for spec, stored in zip(specs, inputs or [None] * len(specs), strict=True):
            image = stored.image if stored else b""
            mask = stored.mask if stored and stored.mask else b""
            args += [spec.id, spec.model_dump_json(), repr(spec.created_at), image, mask]
        if webhooks is not None and any(webhooks):
            for webhook in webhooks:
                args += [webhook.url, webhook.on] if webhook else ["", ""]
        outcome = await self._bounded(self._submit(keys=keys, args=args))
        return _SUBMIT_OUTCOMES[int(outcome)]

    async def take_tokens(self, name: str, rate_per_s: float, burst: int, cost: int) -> float:
        """Take ``cost`` tokens from API key ``name``'s bucket (``burst`` tokens, refilled at ``rate_per_s``):
        0.0 when taken, else the seconds until they would be there (nothing taken)."""
        args: list[str | int] = [repr(rate_per_s), burst, cost]
        wait_ms = await self._bounded(self._rate_limit(keys=[self._keys.api_key_bucket(name)], args=args))
        return int(wait_ms) / 1000

    async def get(self, request_id: str, owner: str | None = None) -> RequestState | None:
        """The state of a request, or None when it is unknown (never submitted, or expired) or, with ``owner``,
        not submitted with that API key."""
        fields = (*STATE_FIELDS, OWNER_FIELD)
        values = await self._bounded(self._redis.hmget(self._keys.request(request_id), fields))
        raw = {field: value for field, value in zip(fields, values, strict=True) if value is not None}
        if "spec" not in raw or "status" not in raw or (owner is not None and raw.get(OWNER_FIELD) != owner):
            return None
        return parse_state({str(k): str(v) for k, v in raw.items()})

    async def owns(self, request_id: str, owner: str | None) -> bool:
        """Whether API key ``owner`` submitted the request (always, with no ``owner``: the api has no keys)."""
        if owner is None:
            return True
        return bool(await self._bounded(self._redis.hget(self._keys.request(request_id), OWNER_FIELD)) == owner)

    async def result(self, key: str) -> bytes | None:
        """The bytes of result-store key ``key`` (from ``RequestState.result_keys``), or None when gone."""
        return await self._in_result_store(self.results.get, key)

    async def result_url(self, key: str) -> str | None:
        """A presigned URL of ``key`` where the result store has them, else None."""
        return await self._in_result_store(self.results.url, key)

    async def forget(self, request_id: str) -> Forgotten | RequestStatus | None:
        """Delete a finished request: its state at once, its images from the result store (the sweeper retries
        what cannot be deleted now). A request that has not finished is left alone: its status is returned.
        None when unknown."""
        reply = await self._bounded(
            self._forget(keys=[self._keys.results_journal, *self._keys.request_keys(request_id)], args=[])
        )
        if not reply:
            return None
        if reply[0] != "deleted":
            return RequestStatus(reply[0])
        keys = tuple(str(key) for key in reply[1:])
        if keys:
            with contextlib.suppress(StoreUnavailable):  # already due in the journal: the sweeper deletes them
                await self._in_result_store(self.results.delete, keys)
                await self._bounded(self._redis.zrem(self._keys.results_journal, *keys))
        return Forgotten(keys)

    async def abort(self, request_id: str, now: float) -> RequestStatus | None:
        """Abort a request; the status after the call (see ``shared.keys.ABORT``), or None when unknown."""
        args: list[str | int] = [repr(now), self._result_ttl_s, self._keys.finished, request_id, self._max_queue_len]
        status = await self._bounded(self._abort(keys=abort_keys(self._keys, request_id), args=args))
        return RequestStatus(status) if status else None

    async def fleet_capabilities(self) -> list[WorkerCapabilities]:
        """What the live workers announce about their model (cached for ``CAPABILITIES_TTL_S``; one round trip);
        empty while no worker is known (then nothing can be refused up front)."""
        now = asyncio.get_running_loop().time()
        if self._capabilities is None or now - self._capabilities[0] > CAPABILITIES_TTL_S:
            pipe = self._redis.pipeline(transaction=False)
            pipe.zrange(self._keys.workers, 0, -1)
            pipe.hgetall(self._keys.capabilities)
            workers, announced = await self._bounded(pipe.execute())
            parsed = [parse_capabilities(announced.get(worker)) for worker in workers]
            self._capabilities = (now, [capabilities for capabilities in parsed if capabilities is not None])
        return self._capabilities[1]

    async def ping(self) -> bool:
        """Whether Redis answers (within the call timeout)."""
        try:
            return bool(await self._bounded(self._redis.ping()))
        except StoreUnavailable:
            return False

    async def _in_result_store(self, call: Callable[[_A], _T], argument: _A) -> _T:
        """``call(argument)`` on the (synchronous) result store, in a worker thread, bounded like Redis calls."""
        try:
            async with asyncio.timeout(self._call_timeout_s):
                return await asyncio.to_thread(call, argument)
        except (ResultStoreError, RedisError, OSError) as exc:
            raise StoreUnavailable(exc, f"the result store ({self.results.kind})") from exc

    async def _bounded(self, call: Awaitable[_T]) -> _T:
        try:
            async with asyncio.timeout(self._call_timeout_s):
                return await call
        except REDIS_FAILURES as exc:
            raise StoreUnavailable(exc) from exc
