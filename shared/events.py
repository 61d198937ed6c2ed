"""Request events on the wire: their names and payloads (the api sends them, the client and webhooks read them).

Every status change of a request is a Lua script that also appends an entry to the request's event stream
(``shared.keys``: ``P:req:{id}:events``), so the events are atomic with the state and in its order. An entry becomes
one event, a name and a JSON payload that names its request (``id``); pure, no I/O. Where an event is in its
stream (its SSE ``id``, ``Last-Event-ID``) is the api's: ``api.events``.

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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

from pydantic import BaseModel

from shared.contracts import RequestStatus
from shared.wire import RequestView

EventName = Literal["queued", "scheduled", "running", "progress", "requeued", "succeeded", "failed", "aborted"]
EVENT_NAMES: tuple[EventName, ...] = get_args(EventName)
TERMINAL_EVENTS: frozenset[str] = frozenset(status.value for status in RequestStatus if status.terminal)


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
