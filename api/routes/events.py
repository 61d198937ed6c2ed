"""Live request events as Server-Sent Events: one request (``GET /v1/requests/{id}/events``) or several
(``GET /v1/events?ids=a,b,c``).

The events and their payloads are ``shared.events``, their positions ``api.events``; reading them from Redis is
``api.events_feed``. A stream replays what came after ``Last-Event-ID`` (everything without it), then sends each
event as it happens, and closes after the terminal event of its (every) request. A comment goes out every
``event_ping_s`` on a quiet stream; a client that stops reading is dropped after ``SEND_TIMEOUT_S``; when Redis fails
the stream ends with a comment saying so, and the client reconnects with its ``Last-Event-ID`` (503 until Redis is
back).

Each stream holds a slot of the process's ``api.stream_slots.StreamSlots`` from the moment its response starts until
it is done, however it ends: at most ``max_event_streams`` in all (more: 503) and ``max_event_streams_per_key`` per
API key, or per client address without keys (more: 429), both with ``Retry-After``. The response takes the slot
itself, inside the try whose finally gives it back: a route whose response never runs (the client gone, the task
cancelled in between) holds none.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from api.auth import OwnerDep
from api.deps import SettingsDep, app_state
from api.events import format_positions, parse_position, parse_positions, unique_ids
from api.events_feed import FeedEvent
from api.outage import RETRY_AFTER_DOC, StoreUnavailable, retry_after_headers
from api.request_ids import RequestIdDep, is_request_id, unknown_requests
from api.responses import UNAVAILABLE, Responses
from api.shard_router import Feed
from api.stream_slots import Slot, SlotsRefused, StreamSlots
from shared.wire import ErrorMessage

log = logging.getLogger(__name__)
router = APIRouter(tags=["events"])

SEND_TIMEOUT_S = 30.0
"""Longest wait for a client to take one event: one that stops reading is dropped."""
POSITION_PATTERN = r"^\s*(\d{1,19}(-\d{1,19})?)?\s*$"
POSITIONS_PATTERN = r"^[\d,\-\s]*$"
LAST_EVENT_ID = "Last-Event-ID"


async def get_feed(request: Request) -> Feed:
    """The event feed: the fleet's one shard's, or every shard's behind ``api.shard_router``."""
    feed: Feed = request.app.state.events
    return feed


get_slots = app_state("event_slots", StreamSlots)
FeedDep = Annotated[Feed, Depends(get_feed)]
SlotsDep = Annotated[StreamSlots, Depends(get_slots)]

EVENT_STREAM: Responses = {
    200: {
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
        "description": "Server-Sent Events: queued, scheduled, running, progress (in step mode a request may be "
        "requeued, back to queued, and run again), then one of succeeded, failed, aborted (data: JSON naming the "
        "request, `id`); the stream closes after the terminal event (docs/api.md).",
    },
    204: {
        "description": "Nothing left to send: every request ended and Last-Event-ID is at (or past) its terminal "
        "event. EventSource clients stop reconnecting on it."
    },
    404: {"model": ErrorMessage, "description": "Unknown request id (never submitted, expired or deleted)."},
    429: {
        "model": ErrorMessage,
        "description": "The API key (without keys: the client address) has max_event_streams_per_key streams open "
        "on this api process already; close one, or retry after Retry-After seconds.",
        "headers": RETRY_AFTER_DOC,
    },
    **UNAVAILABLE,
}


def _refused(field: tuple[str, ...], message: str, value: Any) -> RequestValidationError:
    """A 422 in FastAPI's ``detail`` shape, naming ``field``."""
    return RequestValidationError([{"type": "value_error", "loc": field, "msg": message, "input": value}])


def holder(request: Request, owner: str | None) -> str:
    """Whose share of the streams a call takes: its API key, or (an api without keys) its client address."""
    if owner is not None:
        return f"API key {owner!r}"
    return f"client {request.client.host if request.client else 'unknown'}"


def _slot(slots: StreamSlots, holder: str) -> Slot:
    """A stream slot for ``holder``, or the answer of the cap it hit: 503 for the process's, 429 for its own (raised
    before the response sends anything, so the app's exception handlers answer it as from a route)."""
    try:
        return slots.take(holder)
    except SlotsRefused as refused:
        if refused.limit == "max_event_streams":
            code, detail = status.HTTP_503_SERVICE_UNAVAILABLE, f"this api process serves {refused.cap} event streams"
        else:
            code, detail = status.HTTP_429_TOO_MANY_REQUESTS, f"{holder} has {refused.cap} event streams open"
        detail += f" already ({refused.limit}); retry later"
        raise HTTPException(code, detail=detail, headers=retry_after_headers()) from None


class _SlotStream(EventSourceResponse):
    """An event stream that takes ``holder``'s slot when it starts and gives it back when it is done, however it
    ends; one that never starts takes none."""

    def __init__(self, content: AsyncIterator[ServerSentEvent], slots: StreamSlots, holder: str, ping_s: float) -> None:
        super().__init__(content, ping=ping_s, send_timeout=SEND_TIMEOUT_S)
        self._slots = slots
        self._holder = holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        slot = _slot(self._slots, self._holder)  # no await before the try: nothing can come between
        try:
            await super().__call__(scope, receive, send)
        finally:
            slot.release()


def _stream(
    feed: Feed,
    slots: StreamSlots,
    holder: str,
    positions: dict[str, str],
    sse_id: Callable[[FeedEvent], str],
    ping_s: float,
) -> Response:
    async def events() -> AsyncIterator[ServerSentEvent]:
        try:
            async for event in feed.follow(positions):
                yield ServerSentEvent(data=event.data.model_dump_json(), event=event.name, id=sse_id(event))
        except StoreUnavailable as exc:
            log.warning("event stream of %s ended: %s", ", ".join(positions), exc)
            yield ServerSentEvent(comment=f"{exc}; reconnect with Last-Event-ID")

    return _SlotStream(events(), slots, holder, ping_s)


@router.get("/v1/requests/{request_id}/events", response_class=Response, responses=EVENT_STREAM)
async def request_events(
    request: Request,
    request_id: RequestIdDep,
    feed: FeedDep,
    slots: SlotsDep,
    settings: SettingsDep,
    owner: OwnerDep,
    last_event_id: Annotated[
        str,
        Header(
            alias="Last-Event-ID",
            pattern=POSITION_PATTERN,
            description="Resume after this event (the `id` of the last event received); without it, from the start.",
        ),
    ] = "",
) -> Response:
    """The request's events as Server-Sent Events, from the start or after ``Last-Event-ID``, live until its
    terminal event (``succeeded`` with its image URLs, ``failed`` with its error, ``aborted``), then the stream
    closes. A request that already ended replays and closes at once; 204 when ``Last-Event-ID`` is its terminal
    event (nothing left to send). Each event's ``id`` is its position."""
    position = parse_position(last_event_id)
    if await feed.unknown([request_id], owner):
        raise unknown_requests([request_id])
    if await feed.caught_up({request_id: position}):
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    who = holder(request, owner)
    return _stream(feed, slots, who, {request_id: position}, lambda event: event.position, settings.event_ping_s)


@router.get("/v1/events", response_class=Response, responses=EVENT_STREAM)
async def many_events(
    request: Request,
    feed: FeedDep,
    slots: SlotsDep,
    settings: SettingsDep,
    owner: OwnerDep,
    ids: Annotated[
        str,
        Query(
            pattern=r"[^,\s]",
            description="The request ids to watch, comma separated (at most `max_event_ids`, 100 by default).",
        ),
    ],
    last_event_id: Annotated[
        str,
        Header(
            alias="Last-Event-ID",
            pattern=POSITIONS_PATTERN,
            description="Resume after this event (its `id`: every request's position, in the order of `ids`).",
        ),
    ] = "",
) -> Response:
    """The events of several requests on one stream (for dashboards), each naming its request (``id`` in the
    data), merged in the order they happened; it closes once every request had its terminal event. An event's SSE
    ``id`` holds every request's position, comma separated in the order of ``ids`` (empty: nothing sent yet), so
    ``Last-Event-ID`` resumes each request where it was; reconnect with the same ``ids``."""
    request_ids = unique_ids([ids])
    if len(request_ids) > settings.max_event_ids:
        raise _refused(
            ("query", "ids"), f"at most {settings.max_event_ids} ids (max_event_ids); got {len(request_ids)}", ids
        )
    if malformed := [request_id for request_id in request_ids if not is_request_id(request_id)]:
        raise unknown_requests(malformed)  # before Redis: an id is part of key names
    if unknown := await feed.unknown(request_ids, owner):
        raise unknown_requests(unknown)
    try:
        positions = parse_positions(last_event_id, len(request_ids))
    except ValueError as exc:
        raise _refused(("header", LAST_EVENT_ID), str(exc), last_event_id) from None
    if await feed.caught_up(dict(zip(request_ids, positions, strict=True))):
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    index = {request_id: i for i, request_id in enumerate(request_ids)}

    def sse_id(event: FeedEvent) -> str:
        positions[index[event.request_id]] = event.position
        return format_positions(positions)

    start = dict(zip(request_ids, positions, strict=True))
    return _stream(feed, slots, holder(request, owner), start, sse_id, settings.event_ping_s)
