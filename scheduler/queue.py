"""The scheduler's waiting requests in the order they are served: one interface, two orders (``scheduling_policy``).

Contract: ``RequestQueue`` holds what the scheduler read from the request stream and has not dispatched, pure (no
I/O, no clock). ``add`` puts a request behind those of its level (``front=True``, a requeued one: ahead of them,
requeued ones by ``arrival``); ``head(n)`` is the policy's window in service order, highest level first, FIFO
within a level; ``remove`` takes one out; ``waiting_of(model)`` counts the waiting requests of a model (their
key's ``model``); ``pop_expired(now)`` removes every request whose deadline is at or
before ``now``, earliest first, and ``next_deadline()`` says when the next falls due (the heap holds at most twice
the waiting requests with a deadline, plus 64). ``FcfsQueue`` (``fcfs``, one level), ``PriorityQueue``
(``priority``, one FIFO per level) and ``FairQueue`` (``fair``: the priority levels, deficit round robin over flows
of (model, API key) inside each, FIFO within a flow) are the orders, ``QUEUES`` names them. The story:
docs/architecture.md#the-schedulers-round-and-queue.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from bisect import insort
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from itertools import islice

from shared.compat import key_model
from shared.settings import SchedulingPolicy, Settings


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """One request read from the stream and not yet dispatched."""

    id: str
    entry_id: str  # its stream entry, acknowledged once the request leaves the queue for good
    key: Hashable  # the compatibility key (shared.compat.CompatKey in production)
    arrived_at: float  # when the scheduler first saw it
    cost: int = 1  # what it adds to a batch's memory (shared.compat.pixel_cost in production)
    priority: int = 0  # the request's priority (RequestSpec.priority)
    deadline: float | None = None  # when it must have started (RequestSpec.deadline); None = no deadline
    arrival: tuple[int, int] = (0, 0)  # its first stream entry id (ms, seq): the order of requeued requests
    owner: str = ""  # the API key's name ('' = none): with the key's ``model``, its flow in the fair order
    share: float = 1.0  # the API key's share: times its model's, its flow's weight in the fair order


class _Level:
    """One level's requests in service order: the requeued ones first, by original arrival (equal arrivals in the
    order they were added); then the others, in the order they were added."""

    __slots__ = ("requeued", "waiting")

    def __init__(self) -> None:
        self.requeued: list[QueuedRequest] = []  # few: only step-mode preemption puts requests back
        self.waiting: dict[str, QueuedRequest] = {}

    def push(self, request: QueuedRequest, front: bool) -> None:
        if front:
            insort(self.requeued, request, key=lambda r: r.arrival)
        else:
            self.waiting[request.id] = request

    def drop(self, request: QueuedRequest) -> None:
        if self.waiting.pop(request.id, None) is None:
            self.requeued = [r for r in self.requeued if r.id != request.id]

    def __iter__(self) -> Iterator[QueuedRequest]:
        yield from self.requeued
        yield from self.waiting.values()

    def __bool__(self) -> bool:
        return bool(self.waiting or self.requeued)


class RequestQueue(ABC):
    """The waiting requests: add, remove by id, the head in service order, and deadline expiry. An implementation
    says only which level a request is served at; every level is ordered the same way (``_Level``)."""

    def __init__(self) -> None:
        self._requests: dict[str, QueuedRequest] = {}  # by id
        self._levels: dict[int, _Level] = {}  # level -> its requests in service order
        self._deadlines: list[tuple[float, str, str]] = []  # heap of (deadline, id, entry id); removals are lazy
        self._dead = 0  # entries of the heap whose request left (or was replaced): compacted past half of it
        self._by_model: Counter[str | None] = Counter()  # waiting requests by their key's model

    @abstractmethod
    def level(self, request: QueuedRequest) -> int:
        """The level ``request`` is served at (higher first)."""

    def _new_level(self) -> _Level:
        """An empty level: FIFO (``FairQueue`` orders its levels by flow)."""
        return _Level()

    # --- the interface ---------------------------------------------------------------------------------------
    def add(self, request: QueuedRequest, *, front: bool = False) -> None:
        """Queue ``request`` behind those of its level, or ahead of them with ``front`` (a requeued request, placed
        among the requeued ones of its level by ``arrival``); a request already waiting under its id is replaced."""
        self.remove(request.id)
        self._requests[request.id] = request
        level = self._levels.get(self.level(request))
        if level is None:
            level = self._levels[self.level(request)] = self._new_level()
        level.push(request, front)
        self._by_model[key_model(request.key)] += 1
        if request.deadline is not None:
            heapq.heappush(self._deadlines, (request.deadline, request.id, request.entry_id))

    def remove(self, request_id: str) -> QueuedRequest | None:
        """Take a request out (dispatched, dropped, aborted or expired); None when it is not waiting."""
        request = self._requests.pop(request_id, None)
        if request is not None:
            self._drop(request)
            if request.deadline is not None:
                self._dead += 1
                if 2 * self._dead > len(self._deadlines) + 64:  # mostly dead: forget them (amortised O(1))
                    self._compact()
        return request

    def head(self, n: int) -> list[QueuedRequest]:
        """The first ``n`` requests in service order."""
        return list(islice(self._ordered(), n))

    def get(self, request_id: str) -> QueuedRequest | None:
        return self._requests.get(request_id)

    def waiting_of(self, model: str | None) -> int:
        """How many waiting requests are for ``model`` (their key's ``model``; None: keys without one)."""
        return self._by_model[model]

    def pop_expired(self, now: float) -> list[QueuedRequest]:
        """Remove and return every request whose deadline is at or before ``now``, earliest deadline first."""
        expired: list[QueuedRequest] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            due = heapq.heappop(self._deadlines)
            if self._waiting(due):
                request = self._requests.pop(due[1])
                self._drop(request)
                expired.append(request)
            else:
                self._dead -= 1
        return expired

    def next_deadline(self) -> float | None:
        """The earliest deadline of a waiting request; None when none has one."""
        while self._deadlines and not self._waiting(self._deadlines[0]):
            heapq.heappop(self._deadlines)
            self._dead -= 1
        return self._deadlines[0][0] if self._deadlines else None

    def clear(self) -> None:
        self._requests.clear()
        self._levels.clear()
        self._deadlines.clear()
        self._dead = 0
        self._by_model.clear()

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    def _ordered(self) -> Iterator[QueuedRequest]:
        """Every waiting request in service order."""
        for level in sorted(self._levels, reverse=True):
            yield from self._levels[level]

    def _drop(self, request: QueuedRequest) -> None:
        """Take a request (already out of ``_requests``) out of its level."""
        level = self.level(request)
        self._levels[level].drop(request)
        if not self._levels[level]:
            del self._levels[level]
        model = key_model(request.key)
        self._by_model[model] -= 1
        if not self._by_model[model]:
            del self._by_model[model]

    def _compact(self) -> None:
        """Rebuild the deadline heap from its live entries only (one each: a request re-added unchanged leaves
        two equal entries)."""
        self._deadlines = list({due for due in self._deadlines if self._waiting(due)})
        heapq.heapify(self._deadlines)
        self._dead = 0

    def _waiting(self, due: tuple[float, str, str]) -> bool:
        """Whether a deadline entry still belongs to a waiting request (not removed, not replaced since)."""
        request = self._requests.get(due[1])
        return request is not None and request.entry_id == due[2] and request.deadline == due[0]


class FcfsQueue(RequestQueue):
    """First come, first served: arrival order, priorities ignored (one level)."""

    def level(self, request: QueuedRequest) -> int:
        return 0


class PriorityQueue(RequestQueue):
    """One FIFO per priority level, the highest non-empty level first."""

    def level(self, request: QueuedRequest) -> int:
        return request.priority


Shares = Callable[[str | None, str], float]
"""A flow's weight in the fair order from its model (the key's ``model``) and owner (the API key's name)."""


def _equal_shares(model: str | None, owner: str) -> float:
    return 1.0


class _FairLevel(_Level):
    """One level in the fair order: the requeued ones first (as ``_Level``), then deficit round robin over flows
    (a flow = (model, owner)) in its virtual-time form. Each request is stamped at ``push`` with the round DRR would
    serve it in: ``max(the level's round, its flow's next round)``, and its flow's next round moves on by
    1 / share (the cost of a request is 1, whatever its images). Service order = by (stamp, order added): FIFO within
    a flow, flows interleaved by weight. The level's round only moves forward when its first request in service
    order leaves (dispatched, or aborted / expired while first), to that request's stamp: a far request leaving
    does not move it. A flow's state goes with its last waiting request (an idle flow banks no credit)."""

    __slots__ = ("_flows", "_heads", "_next", "_order", "_round", "_shares", "_flow_of")

    def __init__(self, shares: Shares) -> None:
        super().__init__()
        self._shares = shares
        self._round = 0.0
        self._order = 0  # requests pushed so far: ties of equal stamps in the order added
        self._flows: dict[tuple[str | None, str], dict[str, tuple[float, int, QueuedRequest]]] = {}
        self._next: dict[tuple[str | None, str], float] = {}  # a waiting flow's next round
        self._heads: list[tuple[float, int, tuple[str | None, str]]] = []  # flows' first requests; lazy removals
        self._flow_of: dict[str, tuple[str | None, str]] = {}  # waiting (not requeued) request id -> its flow

    def push(self, request: QueuedRequest, front: bool) -> None:
        if front:
            super().push(request, front)
            return
        flow = (key_model(request.key), request.owner)
        stamp = max(self._round, self._next.get(flow, self._round))
        share = request.share * self._shares(*flow)
        self._next[flow] = stamp + 1.0 / (share if share > 0 else 1e-9)
        self._order += 1
        requests = self._flows.setdefault(flow, {})
        requests[request.id] = (stamp, self._order, request)
        self._flow_of[request.id] = flow
        if len(requests) == 1:
            heapq.heappush(self._heads, (stamp, self._order, flow))

    def drop(self, request: QueuedRequest) -> None:
        flow = self._flow_of.pop(request.id, None)
        if flow is None:
            super().drop(request)
            return
        requests = self._flows[flow]
        was_first = next(iter(requests)) == request.id
        stamp, order, _ = requests.pop(request.id)
        if not requests:
            del self._flows[flow], self._next[flow]  # no credit banked
        elif was_first:
            first_stamp, first_order, _ = next(iter(requests.values()))
            heapq.heappush(self._heads, (first_stamp, first_order, flow))
        if was_first:
            first = self._first()
            if first is None or (stamp, order) < first[:2]:  # it was the level's first: the round moves on
                self._round = max(self._round, stamp)
        if len(self._heads) > 2 * len(self._flows) + 64:
            self._heads = [head for head in self._heads if self._live(head)]
            heapq.heapify(self._heads)

    def _live(self, head: tuple[float, int, tuple[str | None, str]]) -> bool:
        requests = self._flows.get(head[2])
        return requests is not None and bool(requests) and next(iter(requests.values()))[:2] == head[:2]

    def _first(self) -> tuple[float, int, tuple[str | None, str]] | None:
        while self._heads and not self._live(self._heads[0]):
            heapq.heappop(self._heads)
        return self._heads[0] if self._heads else None

    def __iter__(self) -> Iterator[QueuedRequest]:
        yield from self.requeued
        ordered = heapq.merge(*(requests.values() for requests in self._flows.values()), key=lambda s: s[:2])
        for _, _, request in ordered:
            yield request

    def __bool__(self) -> bool:
        return bool(self._flows or self.requeued)


class FairQueue(PriorityQueue):
    """The priority levels, and inside each deficit round robin over flows (model, API key) weighted by
    ``shares(model, owner)`` (default: equal), FIFO within a flow (``_FairLevel``)."""

    def __init__(self, shares: Shares | None = None) -> None:
        super().__init__()
        self._shares = shares or _equal_shares

    def _new_level(self) -> _Level:
        return _FairLevel(self._shares)


QUEUES: dict[SchedulingPolicy, type[RequestQueue]] = {
    "priority": PriorityQueue,
    "fcfs": FcfsQueue,
    "fair": FairQueue,
}
"""The queue of each ``scheduling_policy`` setting (``shared.settings.SchedulingPolicy``: a new order is its class
here, its entry here and its name there; every name has a queue, ``tests/unit/test_queue.py``)."""


def queue_of(settings: Settings) -> RequestQueue:
    """The queue of ``settings.scheduling_policy``; the fair order weighs each model by its ``share``
    (``model_batching``, the config file's ``[models.<name>] share``; default 1)."""
    if settings.scheduling_policy == "fair":
        shares = {name: own.share for name, own in settings.model_batching.items()}
        return FairQueue(lambda model, owner: shares.get(model or "", 1.0))
    return QUEUES[settings.scheduling_policy]()
