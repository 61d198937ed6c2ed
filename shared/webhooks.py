"""Webhooks: what a request subscribes to, what the fleet POSTs, how it is signed and how often it is retried.

Contract, shared by the api, the Lua scripts and the dispatcher (``scheduler.webhooks``): ``WebhookEvent`` names
what a request may subscribe to (``webhook_event`` maps a stream event to it, ``subscription`` writes the
``webhook_on`` field the scripts test); ``OutboxEntry`` is one entry of the ``P:webhooks`` outbox; ``envelope`` is
a delivery's JSON body, ``signature_header`` its ``Fusefleet-Signature`` and ``verify`` the receiver's check;
``attempt_record`` / ``failed_attempts`` keep an event's failed attempts in the request hash and ``retry_delay_s``
spaces them. The events, body, signature, retries and where each field lives: docs/operations.md#webhooks.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from shared.contracts import TERMINAL_STATUSES

WebhookEvent = Literal["start", "progress", "completed"]
WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = get_args(WebhookEvent)
DEFAULT_EVENTS: tuple[WebhookEvent, ...] = ("completed",)
STREAM_EVENTS: dict[WebhookEvent, tuple[str, ...]] = {
    "start": ("running",),
    "progress": ("progress",),
    "completed": tuple(sorted(status.value for status in TERMINAL_STATUSES)),
}
"""Which entries of a request's event stream each webhook event is."""

URL_FIELD = "webhook"
ON_FIELD = "webhook_on"
ATTEMPT_FIELD = "webhook_attempt"
ERROR_FIELD = "webhook_error"
"""Request hash fields (docs/operations.md#webhooks); Lua scripts name ``webhook_on`` and ``webhook_progress_ms``."""

SIGNATURE_HEADER = "Fusefleet-Signature"
SIGNATURE_VERSION = "v1"
SIGNATURE_TOLERANCE_S = 300
"""How old a signature ``verify`` accepts by default (a receiver's replay window)."""
MAX_RETRY_DELAY_S = 600.0
"""The longest wait between two attempts, however many failed."""


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One entry of the webhook outbox: ``event`` (a stream event) of ``request_id`` at ``event_id`` in its event
    stream, with the event's own ``fields`` (``worker``; ``step``, ``total``)."""

    outbox_id: str
    request_id: str
    event: str
    event_id: str
    fields: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, outbox_id: str, raw: Mapping[str, str] | None) -> OutboxEntry | None:
        """The entry as XREADGROUP returns it; None when it is not one (deleted meanwhile, or malformed)."""
        if not raw or not raw.get("id") or not raw.get("event") or not raw.get("entry"):
            return None
        rest = {name: value for name, value in raw.items() if name not in ("id", "event", "entry")}
        return cls(outbox_id, raw["id"], raw["event"], raw["entry"], rest)


def attempt_record(event_id: str, failed_attempts: int) -> str:
    """The ``webhook_attempt`` field of a request whose event ``event_id`` failed ``failed_attempts`` times."""
    return f"{event_id} {failed_attempts}"


def failed_attempts(recorded: str, event_id: str) -> int:
    """The failed attempts a ``webhook_attempt`` field (``recorded``) counts for ``event_id`` (0 when it records
    another event's, or nothing readable)."""
    recorded_id, _, count = recorded.partition(" ")
    if recorded_id != event_id or not count.isdigit():
        return 0
    return int(count)


def subscription(events: Iterable[WebhookEvent] | None) -> str:
    """The ``webhook_on`` field of a request subscribing to ``events`` (None: ``DEFAULT_EVENTS``)."""
    chosen = set(events or DEFAULT_EVENTS)
    names = [name for event in WEBHOOK_EVENTS if event in chosen for name in STREAM_EVENTS[event]]
    return f" {' '.join(names)} "


def webhook_event(stream_event: str) -> WebhookEvent:
    """The webhook event a stream event is delivered as (``ValueError`` for one that is none)."""
    for event, names in STREAM_EVENTS.items():
        if stream_event in names:
            return event
    raise ValueError(f"{stream_event!r} is no webhook event")


def envelope(event: WebhookEvent, request_id: str, event_id: str, timestamp: int, data: Mapping[str, Any]) -> bytes:
    """The body of a delivery: ``{"event", "request_id", "event_id", "timestamp", "data"}`` as compact JSON.

    ``event_id`` is the event's id in the request's event stream (the SSE ``id``): a receiver that sees one
    ``(request_id, event_id)`` twice (deliveries are at least once) drops the second. ``timestamp`` is the one
    signed (``signature_header``): a retry is signed anew."""
    body = {"event": event, "request_id": request_id, "event_id": event_id, "timestamp": timestamp, "data": data}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(secret: str, timestamp: int, body: bytes) -> str:
    """``t=<timestamp>,v1=<hex HMAC-SHA256 of "<timestamp>.<body>">``, the ``Fusefleet-Signature`` of ``body``."""
    return f"t={timestamp},{SIGNATURE_VERSION}={_digest(secret, timestamp, body)}"


def verify(secret: str, header: str, body: bytes, now: float, tolerance_s: float = SIGNATURE_TOLERANCE_S) -> bool:
    """Whether ``header`` (a ``Fusefleet-Signature``) signs ``body`` with ``secret`` and is at most ``tolerance_s``
    old at ``now`` (unix seconds). What a receiver does (docs/operations.md#webhooks has it standalone)."""
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        parts.setdefault(name, []).append(value)
    try:
        timestamp = int(parts.get("t", [""])[0])
    except ValueError:
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = _digest(secret, timestamp, body)
    return any(hmac.compare_digest(expected, given) for given in parts.get(SIGNATURE_VERSION, []))


def retry_delay_s(failed_attempts: int, initial_s: float) -> float:
    """How long to wait after ``failed_attempts`` (>= 1) failed attempts: ``initial_s`` doubling, at most
    ``MAX_RETRY_DELAY_S``."""
    doublings = min(max(failed_attempts, 1) - 1, 32)
    return min(MAX_RETRY_DELAY_S, initial_s * float(2**doublings))
