"""Async access to the request state in Redis, through the keys and Lua scripts of ``shared.keys``."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, cast

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from api.coalescer import Coalescer
from api.input_images import StoredInputs
from api.outage import REDIS_FAILURES, StoreUnavailable
from shared.contracts import RequestSpec, RequestState, RequestStatus, WorkerCapabilities
from shared.fleet_state import parse_capabilities
from shared.keys import (
    ABORT,
    FORGET,
    IDEMPOTENCY_CLAIM,
    IDEMPOTENCY_SETTLE,
    RATE_LIMIT,
    SUBMIT,
    RedisKeys,
    abort_keys,
)
from shared.results import ResultStore, ResultStoreError
from shared.shards import ID_BYTES
from shared.state import STATE_FIELDS, parse_state
from shared.submit_call import SubmitGroup, SubmitOutcome, SubmitRow, submit_call, submit_outcomes

_T = TypeVar("_T")
_A = TypeVar("_A")
CAPABILITIES_TTL_S = 2.0  # how long the api trusts what it read of the workers' announcements
SettleAction = Literal["done", "release", "take"]
"""How ``idempotency_settle.lua`` settles an Idempotency-Key's record."""


@dataclass(frozen=True, slots=True)
class IdempotencyClaim:
    """What ``idempotency_claim.lua`` answered: ``claimed`` (submit), ``done`` (queued before as ``request_ids``),
    ``pending`` (another call submits it: retry after ``retry_after_s``), ``stale`` (its claimer is taken for dead,
    its ``request_ids`` maybe queued) or ``conflict`` (the key was used with other bodies)."""

    state: Literal["claimed", "done", "pending", "stale", "conflict"]
    request_ids: tuple[str, ...] = ()
    retry_after_s: float = 0.0


OWNER_FIELD = "key"
"""The request hash field holding the name of the API key that submitted it (``submit.lua``)."""


RefusalReason = Literal["invalid", "queue_full", "rate_limited", "max_queued", "input_budget"]
"""Why a submission was refused: a 422 (limits, capabilities, input images), a full queue (503), one of the
API key's limits (429: its rate, its max queued), or the input budget (429, or 413: ``api.input_budget``)."""
COALESCED_SUBMISSIONS = 64
"""Most submissions in one ``submit.lua`` call (``api.coalescer``: concurrent ones share a round trip)."""
COALESCED_INPUT_BYTES = 1 << 20
"""Most input image bytes in one coalesced call (a submission holding more goes alone)."""
COALESCED_READS = 128
"""Most request states in one pipeline of reads."""
_OWNED_STATE_FIELDS = (*STATE_FIELDS, OWNER_FIELD)
VIDEO_LIST_PRUNE = 4
"""Oldest entries of a video list checked (and dropped when their request is gone) at each addition."""
VIDEO_PAGE_READS = 4
"""Most reads of one ``GET /v1/videos`` page (each past the first follows ids found gone, and drops them)."""


def _owned_state(values: Sequence[bytes | str | None], owner: str | None) -> RequestState | None:
    """The state of an HMGET of ``_OWNED_STATE_FIELDS``; None when the request is gone or, with ``owner``, not that
    API key's."""
    raw = {field: value for field, value in zip(_OWNED_STATE_FIELDS, values, strict=True) if value is not None}
    if "spec" not in raw or "status" not in raw or (owner is not None and raw.get(OWNER_FIELD) != owner):
        return None
    return parse_state({str(k): str(v) for k, v in raw.items()})


class SubmissionCounters(Protocol):
    """What the api counts of submissions (``api.metrics.ApiMetrics``)."""

    def count_submitted(self, count: int) -> None: ...

    def count_refused(self, reason: RefusalReason) -> None: ...


@dataclass(frozen=True, slots=True)
class Submitter:
    """Who submits (with API keys): the key's name, recorded on each request, and its max queued (None: none)."""

    name: str
    max_queued: int | None = None
    share: float = 1.0  # its weight in the fair order (``scheduling_policy = fair``)


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where a request's events go: its URL and the stream events it subscribes to (``shared.webhooks``)."""

    url: str
    on: str


@dataclass(frozen=True, slots=True)
class Forgotten:
    """A finished request was deleted; these result keys' objects are deleted (or left to the sweeper)."""

    result_keys: tuple[str, ...]


async def bounded(call: Awaitable[_T], timeout_s: float) -> _T:
    """``call``'s result within ``timeout_s``; ``StoreUnavailable`` when Redis fails or does not answer in time."""
    try:
        async with asyncio.timeout(timeout_s):
            return await call
    except REDIS_FAILURES as exc:
        raise StoreUnavailable(exc) from exc


class StateReads:
    """Concurrent reads of request states on one client, whatever shard's keys they are (``api.coalescer``): one
    pipeline of ``HMGET``s (a cluster client splits it by node). Every shard's ``RequestStore`` of an api process
    shares one, so its long polls ending together cost one round trip however the requests spread over shards."""

    def __init__(self, redis: aioredis.Redis, call_timeout_s: float) -> None:
        self._redis = redis
        self._call_timeout_s = call_timeout_s
        self._coalescer = Coalescer(self._read, COALESCED_READS)

    @property
    def flushes(self) -> int:
        """The pipelines sent so far."""
        return self._coalescer.flushes

    async def __call__(self, read: tuple[str, str | None]) -> RequestState | None:
        """The state in hash ``read[0]``, None when gone or (with an owner ``read[1]``) not that API key's."""
        return await self._coalescer(read)

    async def _read(self, reads: Sequence[tuple[str, str | None]]) -> list[RequestState | None]:
        pipe = self._redis.pipeline(transaction=False)
        for hash_key, _ in reads:
            pipe.hmget(hash_key, _OWNED_STATE_FIELDS)
        replies = await bounded(pipe.execute(), self._call_timeout_s)
        return [_owned_state(values, owner) for values, (_, owner) in zip(replies, reads, strict=True)]


class Submissions:
    """Concurrent submissions on one client, whatever shard's (``api.coalescer``): one pipeline of ``submit.lua``
    calls, one a shard's store, each carrying that store's submissions as its groups (so every script still touches
    one slot; a cluster client splits the pipeline by node). Every shard's ``RequestStore`` of an api process shares
    one, so its concurrent submissions cost one round trip however they spread over shards."""

    def __init__(self, redis: aioredis.Redis, call_timeout_s: float) -> None:
        self._redis = redis
        self._script = redis.register_script(SUBMIT)
        self._call_timeout_s = call_timeout_s
        self._coalescer: Coalescer[tuple[RequestStore, SubmitGroup], SubmitOutcome | BaseException] = Coalescer(
            self._submit,
            COALESCED_SUBMISSIONS,
            weight=lambda item: sum(row.input_bytes for row in item[1].rows),
            max_weight=COALESCED_INPUT_BYTES,
        )

    @property
    def flushes(self) -> int:
        """The pipelines sent so far."""
        return self._coalescer.flushes

    async def __call__(self, item: tuple[RequestStore, SubmitGroup]) -> SubmitOutcome:
        """Submit group ``item[1]`` in store ``item[0]``'s shard: what it came to."""
        outcome = await self._coalescer(item)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _submit(
        self, items: Sequence[tuple[RequestStore, SubmitGroup]]
    ) -> list[SubmitOutcome | BaseException]:
        rows_of: dict[RequestStore, list[int]] = {}  # each store's items (stores hash by identity), in order
        for i, (store, _) in enumerate(items):
            rows_of.setdefault(store, []).append(i)
        replies = await self._run([store.submit_call([items[i][1] for i in rows]) for store, rows in rows_of.items()])
        out: dict[int, SubmitOutcome | BaseException] = {}
        for rows, reply in zip(rows_of.values(), replies, strict=True):
            if isinstance(reply, BaseException):  # that shard's call failed (its script refused, say): its own
                failure = StoreUnavailable(reply) if isinstance(reply, REDIS_FAILURES) else reply
                out.update((i, failure) for i in rows)
            else:
                out.update(zip(rows, submit_outcomes(reply), strict=True))
        return [out[i] for i in range(len(items))]

    async def _run(self, calls: Sequence[tuple[list[str], list[str | bytes | int]]]) -> list[Any]:
        """Each call's reply, or the error it raised, in one pipeline (a call whose script the server had not
        loaded, which ran nothing, is made again once the script is loaded)."""
        return await bounded(self._run_loading(calls), self._call_timeout_s)

    async def _run_loading(self, calls: Sequence[tuple[list[str], list[str | bytes | int]]]) -> list[Any]:
        replies = await self._pipeline(calls)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            await self._redis.script_load(SUBMIT)
            for i, reply in zip(missing, await self._pipeline([calls[i] for i in missing]), strict=True):
                replies[i] = reply
        return replies

    async def _pipeline(self, calls: Sequence[tuple[list[str], list[str | bytes | int]]]) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(self._script.sha, len(keys), *keys, *args)  # EVALSHA itself: no SCRIPT EXISTS first
        return list(await pipe.execute(raise_on_error=False))


class RequestStore:
    """Submits, reads, aborts and deletes requests; reads their images from the result store.

    ``redis`` decodes replies to ``str``. The scripts are registered here (no network); redis-py loads them on
    first use. ``results`` is synchronous: its calls run in a worker thread. ``max_input_bytes`` is the input
    budget (``api.input_budget``; None: input bytes are counted, not limited).

    Every call ends within ``call_timeout_s`` (waiting for a pooled connection, connecting and every round trip
    included) and raises ``StoreUnavailable`` when Redis or the result store fails or does not answer in time.
    ``reads`` and ``submissions``: the state reads and submissions it shares with the other shards' stores on
    ``redis`` (None: its own).
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
        reads: StateReads | None = None,
        submissions: Submissions | None = None,
    ) -> None:
        self._redis = redis
        self.results = results
        self._keys = keys
        self._max_queue_len = max_queue_len
        self._result_ttl_s = result_ttl_s
        self._call_timeout_s = call_timeout_s
        self._max_input_bytes = max_input_bytes
        self._capabilities: tuple[float, list[WorkerCapabilities]] | None = None
        self._capabilities_read: asyncio.Future[list[WorkerCapabilities]] | None = None  # the read under way
        self.counters: SubmissionCounters | None = None  # set by api.metrics at start-up
        self._submissions = submissions if submissions is not None else Submissions(redis, call_timeout_s)
        self._reads = reads if reads is not None else StateReads(redis, call_timeout_s)
        self._abort = redis.register_script(ABORT)
        self._forget = redis.register_script(FORGET)
        self._rate_limit = redis.register_script(RATE_LIMIT)
        self._idempotency_claim = redis.register_script(IDEMPOTENCY_CLAIM)
        self._idempotency_settle = redis.register_script(IDEMPOTENCY_SETTLE)

    def new_request_id(self, model: str) -> str:
        """A fresh request id for a new request of ``model`` (one keyspace: random hex, whatever the model)."""
        return secrets.token_hex(ID_BYTES)

    async def submit(
        self,
        specs: Sequence[RequestSpec],
        inputs: Sequence[StoredInputs | None] | None = None,
        submitter: Submitter | None = None,
        webhooks: Sequence[Webhook | None] | None = None,
    ) -> SubmitOutcome:
        """Queue all ``specs`` (with their input images, ``inputs[i]`` for ``specs[i]``, under ``submitter``'s key,
        with their webhooks, ``webhooks[i]``) in one atomic step, or nothing when the queue would overflow, the key
        exceed its max queued or the inputs the input budget. Concurrent submissions of this process share one
        script call (``api.coalescer``), each accepted or refused on its own."""
        rows = tuple(
            SubmitRow(
                spec.id,
                spec.model_dump_json(),
                spec.created_at,
                stored.image if stored else b"",
                stored.mask if stored and stored.mask else b"",
                webhook.url if webhook else "",
                webhook.on if webhook else "",
            )
            for spec, stored, webhook in zip(
                specs, inputs or [None] * len(specs), webhooks or [None] * len(specs), strict=True
            )
        )
        group = SubmitGroup(rows)
        if submitter is not None:
            group = SubmitGroup(rows, submitter.name, submitter.max_queued, submitter.share)
        return await self._bounded(self._submissions((self, group)))  # its wait for a flush in flight counts, too

    def submit_call(self, groups: Sequence[SubmitGroup]) -> tuple[list[str], list[str | bytes | int]]:
        """``(KEYS, ARGV)`` of one ``submit.lua`` call of ``groups`` in this store's keys, under its limits."""
        return submit_call(
            self._keys,
            groups,
            max_queue_len=self._max_queue_len,
            set_ttl_s=self._result_ttl_s,
            max_input_bytes=self._max_input_bytes,
        )

    async def take_tokens(self, name: str, rate_per_s: float, burst: int, cost: int) -> float:
        """Take ``cost`` tokens from API key ``name``'s bucket (``burst`` tokens, refilled at ``rate_per_s``):
        0.0 when taken, else the seconds until they would be there (nothing taken)."""
        args: list[str | int] = [repr(rate_per_s), burst, cost]
        wait_ms = await self._bounded(self._rate_limit(keys=[self._keys.api_key_bucket(name)], args=args))
        return int(wait_ms) / 1000

    async def claim_idempotency(
        self, digest: str, fingerprint: str, request_ids: Sequence[str], ttl_s: int, pending_ms: int
    ) -> IdempotencyClaim:
        """Claim the record of an Idempotency-Key (by ``digest``, ``api.idempotency``) for ``request_ids``, or learn
        what became of the call that did (``idempotency_claim.lua``)."""
        args: list[str | int] = [fingerprint, " ".join(request_ids), ttl_s, pending_ms]
        reply = await self._bounded(self._idempotency_claim(keys=[self._keys.idempotency(digest)], args=args))
        state, *rest = (part.decode() if isinstance(part, bytes) else str(part) for part in reply)
        detail = rest[0] if rest else ""
        return IdempotencyClaim(
            state,  # type: ignore[arg-type]
            tuple(detail.split()) if state in ("done", "stale") else (),
            int(detail) / 1000 if state == "pending" else 0.0,
        )

    async def settle_idempotency(
        self,
        digest: str,
        held_ids: Sequence[str],
        action: SettleAction,
        request_ids: Sequence[str] = (),
        ttl_s: int = 0,
    ) -> bool:
        """Settle the record that holds ``held_ids`` (``idempotency_settle.lua``): False when it holds them no more."""
        args: list[str | int] = [" ".join(held_ids), action, " ".join(request_ids), ttl_s]
        reply = await self._bounded(self._idempotency_settle(keys=[self._keys.idempotency(digest)], args=args))
        return int(reply) == 1

    async def get(self, request_id: str, owner: str | None = None) -> RequestState | None:
        """The state of a request, or None when it is unknown (never submitted, or expired) or, with ``owner``,
        not submitted with that API key. Concurrent reads of this process share one pipeline (``api.coalescer``)."""
        return await self._bounded(self._reads((self._keys.request(request_id), owner)))


    def _video_list(self, owner: str | None) -> str:
        return self._keys.videos if owner is None else self._keys.api_key_videos(owner)

    async def add_video(self, request_id: str, created_at: float, owner: str | None) -> None:
        """Add an accepted video job to ``owner``'s video list (``GET /v1/videos``), scored by its creation (ms), and
        drop the oldest ``VIDEO_LIST_PRUNE`` entries whose request is gone (expired or deleted): the list holds its
        live jobs plus at most the few that ended since its last addition or page."""
        videos = self._video_list(owner)
        pipe = self._redis.pipeline(transaction=False)
        pipe.zadd(videos, {request_id: int(created_at * 1000)})
        pipe.zrange(videos, 0, VIDEO_LIST_PRUNE - 1)
        _, oldest = await self._bounded(pipe.execute())
        await self._drop_gone(videos, [str(request_id) for request_id in oldest])

    async def _drop_gone(self, videos: str, request_ids: Sequence[str]) -> list[str]:
        """Remove from list ``videos`` the ids whose request hash is gone; the ids that are gone."""
        if not request_ids:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for request_id in request_ids:
            pipe.exists(self._keys.request(request_id))
        exists = await self._bounded(pipe.execute())
        gone = [request_id for request_id, there in zip(request_ids, exists, strict=True) if not there]
        if gone:
            await self._bounded(self._redis.zrem(videos, *gone))
        return gone

    async def is_video(self, request_id: str, owner: str | None) -> bool:
        """Whether ``request_id`` is a video job of ``owner`` (in its video list)."""
        return await self._bounded(self._redis.zscore(self._video_list(owner), request_id)) is not None

    async def drop_video(self, request_id: str, owner: str | None) -> None:
        """Take a deleted video job off ``owner``'s video list."""
        await self._bounded(self._redis.zrem(self._video_list(owner), request_id))

    async def video_page(
        self, owner: str | None, after: str | None, limit: int, newest_first: bool
    ) -> tuple[list[RequestState], bool] | None:
        """Up to ``limit`` video jobs of ``owner`` after job ``after`` (None: from the first), newest or oldest
        first, and whether more follow; None when ``after`` is not in the list. Jobs whose request is gone are
        dropped from the list on the way (at most ``VIDEO_PAGE_READS`` reads of ``limit + 1`` ids)."""
        videos = self._video_list(owner)
        start = 0
        if after is not None:
            rank = await self._bounded(
                self._redis.zrevrank(videos, after) if newest_first else self._redis.zrank(videos, after)
            )
            if rank is None:
                return None
            start = cast(int, rank) + 1
        return await self._video_page_at(videos, owner, start, limit, newest_first)

    async def video_page_after(
        self, owner: str | None, created_at: float, request_id: str, limit: int, newest_first: bool
    ) -> tuple[list[RequestState], bool]:
        """``video_page`` after a job listed elsewhere (another shard's, ``api.shard_router``): the jobs after one
        created at ``created_at`` with id ``request_id`` in the list's order (its creation in ms, then its id)."""
        videos = self._video_list(owner)
        ms = int(created_at * 1000)
        pipe = self._redis.pipeline(transaction=False)
        pipe.zcount(videos, f"({ms}", "+inf") if newest_first else pipe.zcount(videos, "-inf", f"({ms}")
        pipe.zrangebyscore(videos, ms, ms)
        before, ties = await self._bounded(pipe.execute())
        start = int(before) + sum(
            1 for tie in ties if (str(tie) >= request_id if newest_first else str(tie) <= request_id)
        )
        return await self._video_page_at(videos, owner, start, limit, newest_first)

    async def _video_page_at(
        self, videos: str, owner: str | None, start: int, limit: int, newest_first: bool
    ) -> tuple[list[RequestState], bool]:
        states: list[RequestState] = []
        for _ in range(VIDEO_PAGE_READS):
            want = limit + 1 - len(states)  # one more than the page: whether more follow
            ids = [
                str(i)
                for i in await self._bounded(self._redis.zrange(videos, start, start + want - 1, desc=newest_first))
            ]
            pipe = self._redis.pipeline(transaction=False)
            for request_id in ids:
                pipe.hmget(self._keys.request(request_id), _OWNED_STATE_FIELDS)
            read = [_owned_state(values, owner) for values in await self._bounded(pipe.execute())] if ids else []
            states += [state for state in read if state is not None]
            if len(states) > limit or len(ids) < want:
                return states[:limit], len(states) > limit
            gone = await self._drop_gone(videos, [i for i, state in zip(ids, read, strict=True) if state is None])
            start += len(ids) - len(gone)
        return states[:limit], True

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
        empty while no worker is known (then nothing can be refused up front). Calls that find the cache stale
        while a read is under way wait for that read rather than each making its own (a burst of submissions when
        the cache lapses is one read, not one per submission)."""
        now = asyncio.get_running_loop().time()
        if self._capabilities is not None and now - self._capabilities[0] <= CAPABILITIES_TTL_S:
            return self._capabilities[1]
        reading = self._capabilities_read
        if reading is None:
            reading = self._capabilities_read = asyncio.ensure_future(self._read_capabilities(now))
            reading.add_done_callback(self._capabilities_read_done)
        return await asyncio.shield(reading)  # one caller cancelled (its request gone) does not cancel the others'

    async def _read_capabilities(self, now: float) -> list[WorkerCapabilities]:
        pipe = self._redis.pipeline(transaction=False)
        pipe.zrange(self._keys.workers, 0, -1)
        pipe.hgetall(self._keys.capabilities)
        workers, announced = await self._bounded(pipe.execute())
        parsed = [parse_capabilities(announced.get(worker)) for worker in workers]
        self._capabilities = (now, [capabilities for capabilities in parsed if capabilities is not None])
        return self._capabilities[1]

    def _capabilities_read_done(self, reading: asyncio.Future[list[WorkerCapabilities]]) -> None:
        if self._capabilities_read is reading:
            self._capabilities_read = None
        if not reading.cancelled():
            reading.exception()  # retrieved here: a failed read whose callers all left is not logged as unretrieved

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
        return await bounded(call, self._call_timeout_s)
