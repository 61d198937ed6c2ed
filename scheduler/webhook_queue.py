"""The webhook dispatcher's pure core: which outbox entries to deliver now, in which order, and when to retry.

The outbox (``P:webhooks``, its entries ``shared.webhooks.OutboxEntry``) holds the events of every request in the
order the Lua scripts wrote them, so one request's entries are in the order of its events. ``DeliveryQueue`` keeps
that order per request:

* one request's deliveries go one at a time: its next event is not sent before the one in flight was delivered or
  dropped, so a receiver sees ``start`` before ``completed`` even when ``start`` needed a retry;
* a failed attempt is tried again after ``retry_delay_s`` (doubling), still ahead of the request's later events;
  after ``max_attempts`` failed attempts it is dropped and the request's next event goes;
* a waiting ``progress`` event with a later event of its request behind it is superseded (acknowledged unsent): when
  deliveries back up, a receiver gets the latest progress, not every step;
* requests are independent: one request's failing receiver delays no other request.

Times are the caller's monotonic clock, in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.webhooks import OutboxEntry, retry_delay_s


@dataclass(slots=True)
class Pending:
    """An entry waiting to be delivered (or in flight): ``failed`` attempts so far, not to be tried before ``due``."""

    entry: OutboxEntry
    failed: int = 0
    due: float = 0.0


class DeliveryQueue:
    """The entries a dispatcher holds, per request, in outbox order (see the module docstring)."""

    def __init__(self, *, max_attempts: int, retry_initial_s: float) -> None:
        self.max_attempts = max_attempts
        self.retry_initial_s = retry_initial_s
        self._waiting: dict[str, list[Pending]] = {}  # request id -> its entries, in outbox order
        self._in_flight: dict[str, Pending] = {}  # request id -> the entry being delivered
        self._held: set[str] = set()  # outbox ids, waiting or in flight

    def __len__(self) -> int:
        return len(self._held)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def add(self, entry: OutboxEntry) -> bool:
        """Hold ``entry`` behind its request's earlier ones; False when it is held already (read again)."""
        if entry.outbox_id in self._held:
            return False
        self._held.add(entry.outbox_id)
        self._waiting.setdefault(entry.request_id, []).append(Pending(entry))
        return True

    def take(self, now: float, limit: int) -> tuple[list[Pending], list[OutboxEntry]]:
        """At most ``limit`` entries to deliver now (each request's oldest, when due and nothing of it is in flight;
        they are in flight from here), and the progress entries superseded by a later event (no longer held)."""
        ready: list[Pending] = []
        superseded: list[OutboxEntry] = []
        for request_id in list(self._waiting):
            if request_id in self._in_flight:
                continue
            waiting = self._waiting[request_id]
            while len(waiting) > 1 and waiting[0].entry.event == "progress":
                stale = waiting.pop(0).entry
                self._held.discard(stale.outbox_id)
                superseded.append(stale)
            head = waiting[0]
            if len(ready) < limit and head.due <= now:
                waiting.pop(0)
                if not waiting:
                    del self._waiting[request_id]
                self._in_flight[request_id] = head
                ready.append(head)
        return ready, superseded

    def done(self, entry: OutboxEntry) -> None:
        """``entry`` was delivered or dropped: its request's next entry may go."""
        self._release(entry)

    def failed(self, entry: OutboxEntry, now: float, failed_attempts: int) -> float | None:
        """An attempt at ``entry`` failed, the ``failed_attempts``-th: the seconds until it is tried again (it stays
        its request's next), or None when that was its last attempt (it is no longer held: drop it)."""
        pending = self._release(entry)
        if failed_attempts >= self.max_attempts:
            return None
        delay = retry_delay_s(failed_attempts, self.retry_initial_s)
        pending = pending or Pending(entry)
        pending.failed, pending.due = failed_attempts, now + delay
        self._held.add(entry.outbox_id)
        self._waiting.setdefault(entry.request_id, []).insert(0, pending)
        return delay

    def next_due(self) -> float | None:
        """When the earliest waiting entry that could go (nothing of its request in flight) is due; None if none."""
        dues = [waiting[0].due for rid, waiting in self._waiting.items() if rid not in self._in_flight]
        return min(dues, default=None)

    def clear_waiting(self) -> None:
        """Forget every waiting entry (they are read again from the outbox); those in flight stay held."""
        self._waiting.clear()
        self._held = {pending.entry.outbox_id for pending in self._in_flight.values()}

    def _release(self, entry: OutboxEntry) -> Pending | None:
        self._held.discard(entry.outbox_id)
        pending = self._in_flight.get(entry.request_id)
        if pending is not None and pending.entry.outbox_id == entry.outbox_id:
            del self._in_flight[entry.request_id]
            return pending
        return None
