"""The api of a sharded fleet (docs/architecture.md#shards): one request store, completion waiter, event feed and
fleet reader per shard, each built from ``Shards.settings_of(shard)`` and working inside that shard unchanged, behind
one object of each kind that the routes use as they use a shard's own.

- **By model**: a submission goes to its model's shard, or for a model of several shards to the one its new id
  was made in (``Shards.new_request_id_of``, ``api.submission``): each row to the shard its id names. Rows of one
  submission that span shards (several models, or one model of several shards) are queued shard by shard,
  each shard's part in one atomic step: when one part is refused, the parts queued before it are aborted (best
  effort) and the refusal is the answer, so the rows run all or none.
- **By id**: every read, abort, delete, result and wait goes to the shard its id names (``Shards.shard_of_request``);
  an id of no shard of this fleet is an unknown one, answered without a Redis call.
- **Fleet-wide**: the workers' capabilities (``GET /v1/models``, the up-front checks) are the union over shards
  (a model of several shards listed once, its workers in all of them counted);
  ``/v1/fleet`` and ``/metrics`` read every shard's snapshot and sum them (``shared.fleet_state.merge_snapshots``,
  as ``fusefleet status``'s totals do). An API key's rate bucket and the records of Idempotency-Keys stay in the
  fleet's own keys (``HOME``); a key's ``max_queued`` holds per shard (counted atomically with each shard's
  enqueue).

A fleet of one shard (no ``model_shards``) uses that shard's objects themselves (``api.app``): nothing here runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from typing import TypeVar

from api.events_feed import EventFeed, FeedEvent
from api.input_images import StoredInputs
from api.outage import StoreUnavailable
from api.store import (
    Forgotten,
    IdempotencyClaim,
    RequestStore,
    SettleAction,
    SubmissionCounters,
    Submitter,
    Webhook,
)
from api.waiter import CompletionWaiter
from shared.contracts import RequestSpec, RequestState, RequestStatus, WorkerCapabilities
from shared.fleet_state import FleetReader, FleetSnapshot, RunningBatch, merge_snapshots
from shared.shards import Shards
from shared.submit_call import SubmitOutcome

_V = TypeVar("_V")


def _by_shard(shards: Shards, request_ids: Iterable[str]) -> dict[str | None, list[str]]:
    """``request_ids`` grouped by the shard each names (None: no shard of this fleet), in first-seen order."""
    groups: dict[str | None, list[str]] = {}
    for request_id in request_ids:
        groups.setdefault(shards.shard_of_request(request_id), []).append(request_id)
    return groups


class ShardedStore:
    """``RequestStore``'s calls over a fleet's shards: submissions by model, the rest by id, capabilities united.

    ``stores`` holds one store per shard (``Shards.names``); ``home`` is a store of the fleet's own keys (the API
    keys' rate buckets), the ``HOME`` shard's when the fleet has one.
    """

    def __init__(self, shards: Shards, stores: Mapping[str, RequestStore], home: RequestStore) -> None:
        self.shards = shards
        self.stores = dict(stores)
        self._home = home
        self.counters: SubmissionCounters | None = None  # set by api.metrics at start-up

    def new_request_id(self, model: str) -> str:
        """A fresh request id for a new request of ``model``, in (one of) its shard(s): ``Shards.new_request_id_of``."""
        return self.shards.new_request_id_of(model)

    def of_request(self, request_id: str) -> RequestStore | None:
        """The store of the shard ``request_id`` names (also a result key, which starts with its request's id); None
        when it names none of this fleet's (no request has it)."""
        shard = self.shards.shard_of_request(request_id)
        return self.stores[shard] if shard is not None else None

    async def submit(
        self,
        specs: Sequence[RequestSpec],
        inputs: Sequence[StoredInputs | None] | None = None,
        submitter: Submitter | None = None,
        webhooks: Sequence[Webhook | None] | None = None,
    ) -> SubmitOutcome:
        """``RequestStore.submit`` in each shard ``specs``' ids name (made by ``Shards.new_request_id_of``), shard by
        shard; at the first refusal (or failure) the parts already queued are aborted, so the rows run all or none."""
        parts: dict[str, list[int]] = {}
        for i, spec in enumerate(specs):
            shard = self.shards.shard_of_request(spec.id)
            if shard is None or shard not in self.shards.shards_of_model(spec.model):
                raise ValueError(f"request {spec.id!r} has no id of a shard of its model {spec.model!r}")
            parts.setdefault(shard, []).append(i)
        queued: list[str] = []
        try:
            for shard, rows in parts.items():
                outcome = await self.stores[shard].submit(
                    [specs[i] for i in rows],
                    [inputs[i] for i in rows] if inputs is not None else None,
                    submitter,
                    [webhooks[i] for i in rows] if webhooks is not None else None,
                )
                if outcome != "accepted":
                    await self._abort_queued(queued)
                    return outcome
                queued += [specs[i].id for i in rows]
        except (StoreUnavailable, asyncio.CancelledError):
            await self._abort_queued(queued)
            raise
        return "accepted"

    async def _abort_queued(self, request_ids: Sequence[str]) -> None:
        """Abort the rows of a refused submission that other shards had queued (best effort: left running, they end
        like any request)."""
        now = time.time()

        async def abort(request_id: str) -> None:
            with contextlib.suppress(StoreUnavailable):
                await self.abort(request_id, now)

        await asyncio.gather(*(abort(request_id) for request_id in request_ids))

    async def take_tokens(self, name: str, rate_per_s: float, burst: int, cost: int) -> float:
        """``RequestStore.take_tokens`` in the fleet's own keys: one bucket per API key, whatever the shard."""
        return await self._home.take_tokens(name, rate_per_s, burst, cost)

    async def claim_idempotency(
        self, digest: str, fingerprint: str, request_ids: Sequence[str], ttl_s: int, pending_ms: int
    ) -> IdempotencyClaim:
        """``RequestStore.claim_idempotency`` in the fleet's own keys: one record per key, whatever the shards its
        rows go to."""
        return await self._home.claim_idempotency(digest, fingerprint, request_ids, ttl_s, pending_ms)

    async def settle_idempotency(
        self,
        digest: str,
        held_ids: Sequence[str],
        action: SettleAction,
        request_ids: Sequence[str] = (),
        ttl_s: int = 0,
    ) -> bool:
        return await self._home.settle_idempotency(digest, held_ids, action, request_ids, ttl_s)

    async def get(self, request_id: str, owner: str | None = None) -> RequestState | None:
        store = self.of_request(request_id)
        return await store.get(request_id, owner) if store is not None else None

    async def owns(self, request_id: str, owner: str | None) -> bool:
        store = self.of_request(request_id)
        return await store.owns(request_id, owner) if store is not None else owner is None

    async def abort(self, request_id: str, now: float) -> RequestStatus | None:
        store = self.of_request(request_id)
        return await store.abort(request_id, now) if store is not None else None

    async def forget(self, request_id: str) -> Forgotten | RequestStatus | None:
        store = self.of_request(request_id)
        return await store.forget(request_id) if store is not None else None

    async def result(self, key: str) -> bytes | None:
        store = self.of_request(key)
        return await store.result(key) if store is not None else None

    async def result_url(self, key: str) -> str | None:
        store = self.of_request(key)
        return await store.result_url(key) if store is not None else None

    async def add_video(self, request_id: str, created_at: float, owner: str | None) -> None:
        """``RequestStore.add_video`` in the job's shard: each shard lists its own video jobs."""
        store = self.of_request(request_id)
        if store is not None:
            await store.add_video(request_id, created_at, owner)

    async def is_video(self, request_id: str, owner: str | None) -> bool:
        store = self.of_request(request_id)
        return await store.is_video(request_id, owner) if store is not None else False

    async def drop_video(self, request_id: str, owner: str | None) -> None:
        store = self.of_request(request_id)
        if store is not None:
            await store.drop_video(request_id, owner)

    async def video_page(
        self, owner: str | None, after: str | None, limit: int, newest_first: bool
    ) -> tuple[list[RequestState], bool] | None:
        """``RequestStore.video_page`` over every shard's video list, merged in the lists' order (creation in ms, then
        id): each shard's page after the cursor (``after``'s own shard after ``after`` itself, the others after its
        creation and id), the first ``limit`` of their union. None when ``after`` is not a listed job."""
        if after is None:
            pages = await _gathered(
                store.video_page(owner, None, limit, newest_first) for store in self.stores.values()
            )
        else:
            listing = self.of_request(after)
            cursor = await listing.get(after, owner) if listing is not None else None
            own = await listing.video_page(owner, after, limit, newest_first) if listing and cursor else None
            if cursor is None or own is None:
                return None
            created_at = cursor.spec.created_at
            others = (store for store in self.stores.values() if store is not listing)
            pages = [
                own,
                *await _gathered(
                    store.video_page_after(owner, created_at, after, limit, newest_first) for store in others
                ),
            ]
        merged = sorted(
            (state for page in pages if page is not None for state in page[0]),
            key=lambda state: (int(state.spec.created_at * 1000), state.spec.id),
            reverse=newest_first,
        )
        return merged[:limit], len(merged) > limit or any(page[1] for page in pages if page is not None)

    async def fleet_capabilities(self) -> list[WorkerCapabilities]:
        """What the live workers of every shard announce, shard by shard (``RequestStore.fleet_capabilities``)."""
        announced = await _gathered(store.fleet_capabilities() for store in self.stores.values())
        return [worker for shard in announced for worker in shard]

    async def ping(self) -> bool:
        """Whether every shard's Redis answers."""
        return all(await _gathered(store.ping() for store in self.stores.values()))


class ShardedWaiter:
    """``CompletionWaiter``'s calls over a fleet's shards, one waiter (one subscription) per shard, each wait on
    the waiter of its id's shard.

    ``epoch`` is one number for every shard's subscription at once: it changes whenever any shard's does (and is
    None while any is down), so a submission that reads it before and passes it to ``accepted`` is noted only when no
    shard's subscription changed in between, each id under its shard's epoch.
    """

    def __init__(self, shards: Shards, waiters: Mapping[str, CompletionWaiter]) -> None:
        self.shards = shards
        self.waiters = dict(waiters)
        self._generation: tuple[tuple[int, ...], int] | None = None  # the shards' epochs, and their number
        self._generations = 0

    def _of(self, request_id: str) -> CompletionWaiter | None:
        shard = self.shards.shard_of_request(request_id)
        return self.waiters[shard] if shard is not None else None

    @property
    def epoch(self) -> int | None:
        epochs = tuple(waiter.epoch for waiter in self.waiters.values())
        if any(epoch is None for epoch in epochs):
            return None
        known = tuple(epoch for epoch in epochs if epoch is not None)
        if self._generation is None or self._generation[0] != known:
            self._generations += 1
            self._generation = (known, self._generations)
        return self._generation[1]

    def accepted(self, request_ids: list[str], epoch: int | None, owner: str | None) -> None:
        if epoch is None or epoch != self.epoch:
            return
        for shard, ids in _by_shard(self.shards, request_ids).items():
            if shard is not None:
                waiter = self.waiters[shard]
                waiter.accepted(ids, waiter.epoch, owner)

    def unfinished_here(self, request_id: str, owner: str | None) -> bool:
        waiter = self._of(request_id)
        return waiter is not None and waiter.unfinished_here(request_id, owner)

    def register(self, request_id: str) -> asyncio.Future[bool]:
        """The future of ``CompletionWaiter.register`` in the id's shard; one that never resolves for an id of no
        shard (the route reads it, finds nothing and answers 404)."""
        waiter = self._of(request_id)
        if waiter is None:
            return asyncio.get_running_loop().create_future()
        return waiter.register(request_id)

    def discard(self, request_id: str, future: asyncio.Future[bool]) -> None:
        waiter = self._of(request_id)
        if waiter is not None:
            waiter.discard(request_id, future)

    async def start(self, timeout_s: float) -> None:
        """Start every shard's waiter (their first subscription attempts at once, each within ``timeout_s``)."""
        await asyncio.gather(*(waiter.start(timeout_s=timeout_s) for waiter in self.waiters.values()))

    async def stop(self) -> None:
        await asyncio.gather(*(waiter.stop() for waiter in self.waiters.values()))


_DONE = object()


class ShardedFeed:
    """``EventFeed``'s calls over a fleet's shards: each request's events read in its shard; a stream of requests
    of several shards follows each shard's on its own (one waiting connection per shard) and interleaves their
    events as they come (each request's in order)."""

    def __init__(self, shards: Shards, feeds: Mapping[str, EventFeed]) -> None:
        self.shards = shards
        self.feeds = dict(feeds)

    def _parts(self, positions: Mapping[str, str]) -> dict[str, dict[str, str]]:
        return {
            shard: {request_id: positions[request_id] for request_id in ids}
            for shard, ids in _by_shard(self.shards, positions).items()
            if shard is not None
        }

    async def unknown(self, request_ids: Sequence[str], owner: str | None = None) -> list[str]:
        groups = _by_shard(self.shards, request_ids)
        found = await _gathered(
            self.feeds[shard].unknown(ids, owner) for shard, ids in groups.items() if shard is not None
        )
        unknown = {request_id for ids in found for request_id in ids} | set(groups.get(None, ()))
        return [request_id for request_id in request_ids if request_id in unknown]

    async def caught_up(self, positions: Mapping[str, str]) -> bool:
        parts = self._parts(positions)
        return all(await _gathered(self.feeds[shard].caught_up(part) for shard, part in parts.items()))

    async def follow(self, positions: Mapping[str, str]) -> AsyncIterator[FeedEvent]:
        parts = self._parts(positions)
        if len(parts) <= 1:
            for shard, part in parts.items():
                async for event in self.feeds[shard].follow(part):
                    yield event
            return
        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)  # a slow client holds every shard's reads back

        async def pump(feed: EventFeed, part: Mapping[str, str]) -> None:
            try:
                async for event in feed.follow(part):
                    await queue.put(event)
                await queue.put(_DONE)
            except Exception as exc:  # noqa: BLE001 - any failure ends the stream, said to the client
                await queue.put(exc)  # never a silent end: the stream would wait for this shard forever

        tasks = [asyncio.create_task(pump(self.feeds[shard], part)) for shard, part in parts.items()]
        try:
            left = len(tasks)
            while left:
                item = await queue.get()
                if item is _DONE:
                    left -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    assert isinstance(item, FeedEvent)
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class ShardedFleet:
    """``FleetReader``'s calls over a fleet's shards: one snapshot summed from every shard's (``merge_snapshots``;
    None when any shard's read fails)."""

    def __init__(self, readers: Sequence[FleetReader]) -> None:
        self.readers = tuple(readers)
        self._owners: dict[str, int] = {}  # busy batch id -> the reader whose shard held it at the last read

    async def read(self) -> FleetSnapshot | None:
        snapshots = await asyncio.gather(*(reader.read() for reader in self.readers))
        if any(snapshot is None for snapshot in snapshots):
            return None
        self._owners = {
            batch: index for index, snapshot in enumerate(snapshots) if snapshot for batch in snapshot.busy_batches
        }
        return merge_snapshots([snapshot for snapshot in snapshots if snapshot is not None])

    async def running(self, batch_ids: tuple[str, ...]) -> list[RunningBatch] | None:
        """Each batch as the shard holding it tells, or None when any read fails. A batch the last ``read`` found
        is asked of its shard alone; any other of every shard (a batch id is in one shard; the others find no
        requests in it: size 0)."""
        everyone = range(len(self.readers))
        asked: dict[int, list[str]] = {index: [] for index in everyone}
        for batch_id in batch_ids:
            owner = self._owners.get(batch_id)
            for index in everyone if owner is None else (owner,):
                asked[index].append(batch_id)
        shards = [index for index in everyone if asked[index]]
        told = await asyncio.gather(*(self.readers[index].running(tuple(asked[index])) for index in shards))
        if any(batches is None for batches in told):
            return None
        found: dict[str, RunningBatch] = {}
        for batches in told:
            for batch in batches or ():
                if batch.size or batch.batch_id not in found:
                    found[batch.batch_id] = batch
        return [found[batch_id] for batch_id in batch_ids]


async def _gathered(calls: Iterable[Awaitable[_V]]) -> list[_V]:
    """The answers of ``calls``, run at once (the first failure raised)."""
    return list(await asyncio.gather(*calls))


Store = RequestStore | ShardedStore
"""What the routes submit through and read requests with (``app.state.store``)."""
Waiter = CompletionWaiter | ShardedWaiter
"""What long polls wait with (``app.state.waiter``)."""
Feed = EventFeed | ShardedFeed
"""What event streams read (``app.state.events``)."""
Fleet = FleetReader | ShardedFleet
"""What ``/v1/fleet`` and ``/metrics`` read the fleet with (``app.state.fleet``)."""
