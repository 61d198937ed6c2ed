"""Live request events for ``fusefleet.client``: ``Event``, and the readers behind ``Client.events`` / ``watch`` and
their ``AsyncClient`` twins.

The api sends each request's events as Server-Sent Events (``GET /v1/requests/{id}/events``, several requests on
``GET /v1/events?ids=``; names and payloads in ``shared.events``), closing the stream after the terminal event. A
reader follows one stream until every request it watches had its terminal event: a stream that drops before
(connection lost, api restarted, Redis unavailable: a 503) is opened again with the ``Last-Event-ID`` of the last
event received, so no event is lost or repeated, for up to ``reconnect_s`` seconds of consecutive failure; then
the last error is raised. A 204 answer means the reader has everything (it is past every terminal event). An
unknown request (``NotFound``) or a refused call (``RequestRejected``) is raised at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from httpx_sse import ServerSentEvent, SSEError, aconnect_sse, connect_sse
from pydantic import ValidationError

from fusefleet.client_errors import (
    ApiError,
    ApiUnreachable,
    FusefleetError,
    Unavailable,
    error_from_response,
    unreachable,
)
from shared.events import EVENT_MODELS, EVENT_NAMES, EventData, EventName, is_terminal
from shared.wire import RequestView

RECONNECT_S = 60.0
"""How long a reader keeps opening a dropped stream again (consecutive failures) before raising."""
READ_TIMEOUT_S = 60.0
"""Longest silence on a stream (the api sends a comment every ``event_ping_s``, 15 s) before it is opened again."""
MAX_BACKOFF_S = 5.0
NOTHING_LEFT = 204
"""The api's answer to a reconnect past every terminal event: the reader is done."""


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a request: ``name`` (queued, scheduled, running, progress, succeeded, failed, aborted), the
    request it is about, its payload (``shared.events``; the request's ``RequestView`` for a terminal event), and
    ``last_event_id``: pass it back (``last_event_id=``) to resume the stream after this event."""

    name: EventName
    request_id: str
    data: EventData
    last_event_id: str

    @property
    def terminal(self) -> bool:
        return is_terminal(self.name)

    @property
    def view(self) -> RequestView | None:
        """The request's final state, for a terminal event (status, image URLs, error); else None."""
        return self.data if isinstance(self.data, RequestView) else None


def parse_event(sse: ServerSentEvent, last_event_id: str) -> Event | None:
    """The ``Event`` of one Server-Sent Event; None for an event this client does not know (a newer api's);
    ``ApiError`` for a known event whose data is not what the api sends."""
    if sse.event not in EVENT_NAMES:
        return None
    name: EventName = sse.event
    try:
        data = EVENT_MODELS[name].model_validate_json(sse.data)
    except ValidationError as exc:
        raise ApiError(f"unexpected data of a {name} event: {exc}") from None
    return Event(name, data.id, data, sse.id or last_event_id)


def stream_path(request_ids: Sequence[str]) -> tuple[str, dict[str, str]]:
    """Where the events of ``request_ids`` are: one request's stream, or the multi-request one."""
    if len(request_ids) == 1:
        return f"/v1/requests/{quote(request_ids[0], safe='')}/events", {}
    return "/v1/events", {"ids": ",".join(request_ids)}


class Subscription:
    """What a reader keeps across reconnections: the position, the requests still open, the failure budget."""

    def __init__(self, request_ids: Sequence[str], last_event_id: str | None, reconnect_s: float) -> None:
        if not request_ids:
            raise ValueError("give at least one request id")
        self.request_ids = list(dict.fromkeys(request_ids))
        self.path, self.params = stream_path(self.request_ids)
        self.last_event_id = last_event_id or ""
        self.open = set(self.request_ids)
        self.reconnect_s = reconnect_s
        self._failing_since: float | None = None
        self._failures = 0
        self._failure: FusefleetError | None = None

    def headers(self) -> dict[str, str]:
        return {"Last-Event-ID": self.last_event_id} if self.last_event_id else {}

    def take(self, sse: ServerSentEvent) -> Event | None:
        """Record one received event; the event to hand out, if any. A new position is progress: the failure
        budget starts again."""
        event = parse_event(sse, self.last_event_id)
        if sse.id and sse.id != self.last_event_id:
            self.last_event_id = sse.id
            self._failing_since, self._failures = None, 0
        if event is None:
            return None
        if event.terminal:
            self.open.discard(event.request_id)
        return event

    @property
    def done(self) -> bool:
        return not self.open

    def opened(self, response: httpx.Response) -> bool:
        """Whether the stream has nothing left to send (a 204); the typed error of a refused one (body read)."""
        if response.status_code == NOTHING_LEFT:
            return True
        if not response.is_success:
            raise error_from_response(response)
        return False

    @contextmanager
    def attempt(self, base_url: str) -> Iterator[None]:
        """One opening of the stream: what ends it before ``done`` (a drop, httpx's error, the api's) is kept for
        ``pause``; a body that is not an event stream is raised at once."""
        self._failure = None
        try:
            yield
        except httpx.TransportError as exc:
            self._failure = unreachable(base_url, exc)
        except SSEError as exc:
            raise FusefleetError(f"not an event stream: {exc}") from exc
        except FusefleetError as exc:
            self._failure = exc
        else:
            if not self.done:
                self._failure = self.dropped(base_url)

    def pause(self) -> float | None:
        """Seconds to wait before opening the stream again after the last ``attempt`` failed (None when it did
        not); raises its failure once the budget is spent."""
        return None if self._failure is None else self.delay(self._failure)

    def delay(self, exc: FusefleetError) -> float:
        """Seconds to wait before opening the stream again after ``exc``; raises ``exc`` once the budget is spent."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        self._failures += 1
        if not isinstance(exc, Unavailable | ApiUnreachable) or now - self._failing_since > self.reconnect_s:
            raise exc
        backoff = min(0.25 * 2.0 ** min(self._failures - 1, 16), MAX_BACKOFF_S)  # capped: no float overflow
        retry_after = exc.retry_after if isinstance(exc, Unavailable) else None
        return min(retry_after, MAX_BACKOFF_S) if retry_after is not None else backoff

    def dropped(self, base_url: str) -> ApiUnreachable:
        return ApiUnreachable(f"the event stream of {', '.join(sorted(self.open))} at {base_url} closed early")


def _timeout(timeout: float) -> httpx.Timeout:
    return httpx.Timeout(timeout, read=max(timeout, READ_TIMEOUT_S), pool=None)


def read_events(http: httpx.Client, base_url: str, timeout: float, follow: Subscription) -> Iterator[Event]:
    """The events of ``follow``'s requests, reconnecting as the module says (``Client.events`` / ``watch``)."""
    while not follow.done:
        with follow.attempt(base_url):
            with connect_sse(
                http, "GET", follow.path, params=follow.params, headers=follow.headers(), timeout=_timeout(timeout)
            ) as source:
                if not source.response.is_success:
                    source.response.read()
                if follow.opened(source.response):
                    return
                for sse in source.iter_sse():
                    if (event := follow.take(sse)) is not None:
                        yield event
        if (pause := follow.pause()) is not None:
            time.sleep(pause)


async def aread_events(
    http: httpx.AsyncClient, base_url: str, timeout: float, follow: Subscription
) -> AsyncIterator[Event]:
    """``read_events`` for ``AsyncClient``."""
    while not follow.done:
        with follow.attempt(base_url):
            async with aconnect_sse(
                http, "GET", follow.path, params=follow.params, headers=follow.headers(), timeout=_timeout(timeout)
            ) as source:
                if not source.response.is_success:
                    await source.response.aread()
                if follow.opened(source.response):
                    return
                async for sse in source.aiter_sse():
                    if (event := follow.take(sse)) is not None:
                        yield event
        if (pause := follow.pause()) is not None:
            await asyncio.sleep(pause)
