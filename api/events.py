"""Request events as the api sends them: names, payloads, and positions in the streams (``Last-Event-ID``).

Every status change of a request is a Lua script that also appends an entry to the request's event stream
(``shared.keys``: ``P:req:{id}:events``), so the events are atomic with the state and in its order. This module is
the pure part of serving them (no I/O): an entry becomes one Server-Sent Event, a name and a JSON payload that
names its request (``id``); a position is an entry id (``<ms>-<seq>``), the SSE ``id`` of the event.

========== ================================================ ===============================================
event      when                                             data
========== ================================================ ===============================================
queued     accepted                                         ``{"id"}``
scheduled  put in a batch                                   ``{"id", "batch_id", "batch_size"}``
running    a worker claimed it (again after a worker died)  ``{"id", "worker"}``
progress   a denoising step (throttled, see progress.lua)   ``{"id", "step", "total"}``
requeued   step mode: evicted from ``worker``'s running     ``{"id", "worker", "step"}``
           set for a higher priority (at ``step``), queued
           again at the front of its level; it restarts
succeeded  terminal: the request's state, its image URLs    the ``RequestView`` (``GET /v1/requests/{id}``)
failed     terminal: the request's state, its error         the ``RequestView``
aborted    terminal                                         the ``RequestView``
========== ================================================ ===============================================

The stream of several requests (``GET /v1/events?ids=a,b,c``) sends the same events; its SSE ``id`` is the
position of every request, in the order of ``ids``, comma separated, empty for a request with no event sent yet
(``1718000000000-0,,1718000000123-1``): ``Last-Event-ID`` then resumes each request where it was.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal, get_args

from pydantic import BaseModel

from api.schemas import RequestView
from shared.contracts import RequestStatus

EventName = Literal["queued", "scheduled", "running", "progress", "requeued", "succeeded", "failed", "aborted"]
EVENT_NAMES: tuple[EventName, ...] = get_args(EventName)
TERMINAL_EVENTS: frozenset[str] = frozenset(status.value for status in RequestStatus if status.terminal)
START = "0"
"""The position before a stream's first entry: read from the start."""
_POSITION = re.compile(r"\d{1,20}(-\d{1,20})?")


class QueuedEvent(BaseModel):
    """``queued``: the request was accepted."""

    id: str


class ScheduledEvent(BaseModel):
    """``scheduled``: the request joined batch ``batch_id`` of ``batch_size`` requests."""

    id: str
    batch_id: str
    batch_size: int


class RunningEvent(BaseModel):
    """``running``: ``worker`` claimed the batch (once more after a worker was lost)."""

    id: str
    worker: str


class ProgressEvent(BaseModel):
    """``progress``: denoising step ``step`` of ``total`` is done."""

    id: str
    step: int
    total: int


class RequeuedEvent(BaseModel):
    """``requeued``: step mode evicted the request from ``worker``'s running set at ``step`` so that a request of a
    higher priority takes its room (``requeue.lua``); it is queued again, at the front of its level, and restarts."""

    id: str
    worker: str
    step: int


EventData = QueuedEvent | ScheduledEvent | RunningEvent | ProgressEvent | RequeuedEvent | RequestView
EVENT_MODELS: dict[EventName, type[EventData]] = {
    "queued": QueuedEvent,
    "scheduled": ScheduledEvent,
    "running": RunningEvent,
    "progress": ProgressEvent,
    "requeued": RequeuedEvent,
    "succeeded": RequestView,
    "failed": RequestView,
    "aborted": RequestView,
}
"""The payload of each event (``fusefleet.client_events`` parses with it)."""


def event_name(fields: Mapping[str, str]) -> EventName:
    """The event a stream entry records (``ValueError`` for one this api does not know)."""
    name = fields.get("event", "")
    if name not in EVENT_NAMES:
        raise ValueError(f"unknown event {name!r}")
    return name


def is_terminal(name: str) -> bool:
    return name in TERMINAL_EVENTS


def progress_data(request_id: str, name: EventName, fields: Mapping[str, str]) -> EventData:
    """The payload of a non-terminal event from its entry's fields (a terminal one is the request's view)."""
    if is_terminal(name):
        raise ValueError(f"{name} is terminal: its payload is the request's view")
    return EVENT_MODELS[name].model_validate({**fields, "id": request_id})


def position_key(position: str) -> tuple[int, int]:
    """An entry id as numbers, for ordering entries of several streams (``START`` first)."""
    ms, _, seq = position.partition("-")
    return int(ms), int(seq or 0)


def parse_position(value: str) -> str:
    """A position given back by a client (``Last-Event-ID``): an entry id, or ``START`` for ``""``.

    ``ValueError`` when it is not an entry id (``<ms>`` or ``<ms>-<seq>``, decimal)."""
    value = value.strip()
    if not value:
        return START
    if not _POSITION.fullmatch(value):
        raise ValueError(f"not an event id: {value[:40]!r} (an event id is <ms>-<seq>)")
    return value


def parse_positions(value: str | None, count: int) -> list[str]:
    """The per-request positions of a multi-request stream's ``Last-Event-ID`` (``format_positions``), one per
    watched id; all ``START`` without one. ``ValueError`` when it does not hold ``count`` positions."""
    if value is None or not value.strip():
        return [START] * count
    parts = value.split(",")
    if len(parts) != count:
        raise ValueError(f"holds {len(parts)} positions for {count} ids: reconnect with the same ids, in order")
    return [parse_position(part) for part in parts]


def format_positions(positions: Sequence[str]) -> str:
    """The SSE id of a multi-request stream's event: every request's position, comma separated, in ``ids`` order
    (empty for a request with no event sent yet)."""
    return ",".join("" if position == START else position for position in positions)


def unique_ids(values: Sequence[str]) -> list[str]:
    """The request ids of ``?ids=`` (comma separated, and/or repeated), blanks and repeats dropped, in order."""
    ids: dict[str, None] = {}
    for value in values:
        for part in value.split(","):
            if part.strip():
                ids[part.strip()] = None
    return list(ids)
