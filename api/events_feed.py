"""Following request event streams in Redis: replay from a position, then wait for new entries (XREAD BLOCK).

``EventFeed.follow`` yields the events of one or several requests, each request's in stream order and those of
several merged by entry id (Redis time), until every request has had its terminal event. It reads with one XREAD
over all the streams still open, so it never polls; between waits it looks at the requests themselves, so a stream
also ends when its request is deleted or expired, or (written before events existed) ended without a terminal
entry, in which case its terminal event is made from its state.

Each open stream holds one Redis connection of the feed's own client while it waits (the routes open at most
``max_event_streams``: ``api.stream_slots``); every call is bounded in time, and a Redis that fails or stalls raises
``StoreUnavailable`` out of ``follow`` within ``block_ms`` + ``call_timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import redis.asyncio as aioredis

from api.events import START, position_key
from api.outage import REDIS_FAILURES, StoreUnavailable
from api.store import OWNER_FIELD, RequestStore
from shared.events import EventData, EventName, event_name, is_terminal, progress_data
from shared.keys import RedisKeys
from shared.streams import by_stream
from shared.wire import RequestView

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MAX_BLOCK_MS = 5000
"""Longest wait of one XREAD; between waits the feed checks that its requests still exist."""
READ_COUNT = 100
"""Most entries read per stream per call (a stream holds a few dozen: progress.lua caps it)."""


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """One event of ``request_id`` at ``position`` (its stream entry id)."""

    request_id: str
    position: str
    name: EventName
    data: EventData

    @property
    def terminal(self) -> bool:
        return is_terminal(self.name)


Standing = Literal["open", "done", "untold"]
"""Where a client stands with a request: events may still come; nothing more (gone, or it has the terminal
event); or it ended without a terminal event in its stream (written before events existed) and that is untold."""


def standing(status: str | None, last_id: str, last_event: str, position: str) -> Standing:
    """A client at ``position`` of a request in ``status`` whose stream ends with entry ``last_id`` (``START``:
    none) recording ``last_event``."""
    if status is None:
        return "done"
    if not is_terminal(status) or position_key(last_id) > position_key(position):
        return "open"  # not ended, or its terminal entry is still to be read
    if is_terminal(last_event) or position_key(position) > position_key(last_id):
        return "done"  # it has the terminal event (the stream's, or the one told past its end)
    return "untold"


def after(position: str) -> str:
    """The position right after ``position``: where a terminal event made from the state is told."""
    ms, seq = position_key(position)
    return f"{ms}-{seq + 1}"


class EventFeed:
    """Reads the event streams of requests (``shared.keys``: ``P:req:{id}:events``) for the SSE routes.

    ``redis`` decodes replies and is the feed's own client (its pool holds the waiting streams' connections);
    ``store`` reads a request's view for its terminal event. ``block_ms`` is kept below the client's socket
    timeout (``call_timeout_s``), which would otherwise end every quiet wait as an error.
    """

    def __init__(self, redis: aioredis.Redis, store: RequestStore, keys: RedisKeys, *, call_timeout_s: float) -> None:
        self._redis = redis
        self._store = store
        self._keys = keys
        self._call_timeout_s = call_timeout_s
        self.block_ms = max(1, int(min(MAX_BLOCK_MS, call_timeout_s * 500)))

    async def unknown(self, request_ids: Sequence[str], owner: str | None = None) -> list[str]:
        """The ids of ``request_ids`` with no request (never submitted, expired or deleted) or, with ``owner``, with
        a request of another API key (``api.auth``: answered as unknown); one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for request_id in request_ids:
            if owner is None:
                pipe.exists(self._keys.request(request_id))
            else:
                pipe.hget(self._keys.request(request_id), OWNER_FIELD)
        found = await self._bounded(pipe.execute())
        return [
            request_id
            for request_id, value in zip(request_ids, found, strict=True)
            if (not value if owner is None else value != owner)
        ]

    async def follow(self, positions: Mapping[str, str]) -> AsyncIterator[FeedEvent]:
        """The events of the requests of ``positions`` after their position (an entry id, ``"0"`` = all), until
        each had its terminal event or is gone. ``StoreUnavailable`` when Redis fails."""
        live = dict(positions)
        while live:
            entries = await self._read(live, None)
            if not entries:
                async for settled in self._settle(live):
                    yield settled
                if not live:
                    break
                entries = await self._read(live, self.block_ms)
            for request_id, position, fields in entries:
                if request_id not in live:
                    continue  # ended earlier in this read
                live[request_id] = position
                event = await self._event(request_id, position, fields)
                if event is None:
                    continue
                if event.terminal:
                    del live[request_id]
                yield event

    async def _read(self, live: Mapping[str, str], block_ms: int | None) -> list[tuple[str, str, dict[str, str]]]:
        """New entries of the ``live`` requests' streams, ordered by entry id: ``(request id, entry id, fields)``."""
        by_key = {self._keys.request_events(request_id): request_id for request_id in live}
        streams: dict[Any, Any] = {key: live[request_id] for key, request_id in by_key.items()}
        extra_s = (block_ms or 0) / 1000
        reply = await self._bounded(self._redis.xread(streams, count=READ_COUNT, block=block_ms), extra_s)
        entries = [
            (by_key[key], entry_id, fields or {})  # never None: XREAD reads no group's pending entries
            for key, messages in by_stream(reply).items()
            for entry_id, fields in messages
        ]
        return sorted(entries, key=lambda entry: position_key(entry[1]))

    async def _event(self, request_id: str, position: str, fields: Mapping[str, str]) -> FeedEvent | None:
        """The event of one entry; None for an entry this api does not know, or a terminal one whose request was
        deleted in the meantime."""
        try:
            name = event_name(fields)
        except ValueError as exc:
            log.warning("request %s: skipping event entry %s: %s", request_id, position, exc)
            return None
        if not is_terminal(name):
            return FeedEvent(request_id, position, name, progress_data(request_id, name, fields))
        state = await self._store.get(request_id)
        if state is None:
            return None
        return FeedEvent(request_id, position, name, RequestView.from_state(state))

    async def caught_up(self, positions: Mapping[str, str]) -> bool:
        """Whether nothing is left to send from ``positions``: every request is gone, or ended and the client
        has its terminal event (the route answers 204, which stops a browser's EventSource from reconnecting)."""
        standings = await self._standings(positions)
        return all(standing == "done" for standing, _ in standings.values())

    async def _settle(self, live: dict[str, str]) -> AsyncIterator[FeedEvent]:
        """Nothing new to read: drop the requests that are gone, and the ended ones whose terminal event the
        client already has or their stream never got (a terminal event made from the state is yielded then)."""
        for request_id, (standing, position) in (await self._standings(live)).items():
            if standing == "open":
                continue
            del live[request_id]
            if standing == "untold" and (state := await self._store.get(request_id)) is not None:
                name = event_name({"event": state.status.value})
                yield FeedEvent(request_id, position, name, RequestView.from_state(state))

    async def _standings(self, positions: Mapping[str, str]) -> dict[str, tuple[Standing, str]]:
        """Each request's ``standing`` after its position, with the position of its untold terminal event."""
        pipe = self._redis.pipeline(transaction=True)  # the status and the stream's last entry of one moment
        for request_id in positions:
            pipe.hget(self._keys.request(request_id), "status")
            pipe.xrevrange(self._keys.request_events(request_id), count=1)
        replies = await self._bounded(pipe.execute())
        out: dict[str, tuple[Standing, str]] = {}
        for i, (request_id, position) in enumerate(positions.items()):
            status, last = replies[2 * i], replies[2 * i + 1]
            last_id, last_event = (last[0][0], last[0][1].get("event", "")) if last else (START, "")
            out[request_id] = standing(status, last_id, last_event, position), after(last_id)
        return out

    async def _bounded(self, call: Awaitable[_T], extra_s: float = 0.0) -> _T:
        try:
            async with asyncio.timeout(self._call_timeout_s + extra_s):
                return await call
        except REDIS_FAILURES as exc:
            raise StoreUnavailable(exc) from exc
