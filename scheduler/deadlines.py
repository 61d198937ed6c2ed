"""Request deadlines: which requests in flight are past theirs (pure), and what their error says.

A request with ``timeout_s`` has a deadline, ``RequestSpec.deadline`` (``created_at + timeout_s``, wall-clock
seconds). Past it, the active scheduler ends it through ``expire.lua``:

* waiting in the scheduler (queued): its queue gives it up (``scheduler.queue.RequestQueue.pop_expired``, looked at
  every round and woken for) and it fails with ``Timeout`` (``NOT_STARTED``);
* in a batch: ``schedule.lua`` recorded its deadline in its hash; about every second (with the reaper) the scheduler
  reads the requests of the batches in flight and ``overdue`` picks those past it. One still ``scheduled`` (not
  started) fails with ``Timeout``; one ``running`` is flagged aborted with error ``Timeout`` (``RAN_PAST``): its
  worker stops the forward at its next step once every row of that forward is aborted (else when the forward
  ends), and it ends ``aborted``, its error saying why.

``Timeout`` is ``shared.contracts.TIMEOUT_ERROR``.

Deadlines come from the api's clock and are judged by the active scheduler's (``time.time``): hosts are expected
to be NTP-synchronised; a skew between them lengthens or shortens every timeout by as much.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.contracts import RequestStatus

NOT_STARTED = "not started within its timeout_s"
RAN_PAST = "still running at its deadline (timeout_s after submission): aborted"
_IN_FLIGHT = frozenset({RequestStatus.SCHEDULED, RequestStatus.RUNNING})


@dataclass(frozen=True, slots=True)
class InFlightRequest:
    """What the deadline sweep reads of one request of a batch in flight."""

    id: str
    status: RequestStatus | None  # None when its hash is gone
    deadline: float | None  # wall-clock seconds; None = no deadline
    abort: bool  # already flagged (by a client's abort or an earlier sweep)


def overdue(requests: Iterable[InFlightRequest], now: float) -> list[str]:
    """Ids of the scheduled or running requests, not flagged yet, whose deadline is at or before ``now``."""
    return [
        r.id
        for r in requests
        if r.deadline is not None and r.deadline <= now and r.status in _IN_FLIGHT and not r.abort
    ]
