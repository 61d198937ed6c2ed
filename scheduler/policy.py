"""The scheduler's batching policy: pure functions from what is waiting to what to do next. The story (why strict
FIFO head-of-line, levels, the admission wait, step-mode joins and preemption) is docs/architecture.md#the-flow
(step 2) and docs/step_mode.md#the-fleet-in-step-mode; what follows is the functions' contract, kept here in full.

All three do no I/O, keep no state and never read a clock: ``now`` and every ``arrived_at`` are monotonic seconds
from the caller, so equal inputs give equal answers. ``waiting`` is in service order (``scheduler.queue``: highest
``level`` first, arrival order within one). The head is its first live request; aborted requests never start,
block or join a batch, and each one seen is reported in ``dropped_ids`` for the caller to discard. A batch holds
the head's level only: other levels are neither in it nor close it, and count for nothing below.

``decide(waiting, free_slots, now, config)`` -> ``Dispatch`` or ``Wait``. The candidate is the head plus the live
requests of its level after it with an equal compatibility key, stopping at the first live one whose key differs,
capped at ``max_num_seqs``, at ``max_batch_cost // head.cost`` requests (compatible requests cost the same) and at
the head's ``knee`` where known (at least one). No live request or no free slot: ``Wait(until=None)``. Full,
closed (an incompatible live request follows) or ``max_wait_s == 0``: dispatched at once. Otherwise the wait ends
at ``min(head.arrived_at + max_wait_s, last_arrival + stable_s)`` (``last_arrival``: the latest among the live
requests of the head's level): ``now >= deadline`` dispatches, anything earlier is ``Wait(until=deadline)``.

``place(waiting, open_sets, config)`` -> ``Join`` or None (then ``decide``). A usable set is not sealed, has the
head's (step) key and room ``config.cap(head) - set.rows > 0``; the one with the most room wins, ties to the lowest
worker name; none: None. The join is the head plus its level's live requests after it with an equal key (strict:
stopping at the first that differs; grouped: skipping it), up to that room, dispatched at once.

``preempt(waiting, open_sets, free_slots, config)`` -> ``Preempt`` (evict that request of that worker's set) or
None. Only for a live head with no free slot (``free_slots <= 0``) and no set to join; only from an open set of
its key where one eviction makes room (``rows - 1 < cap(head)``), and only a request of a LOWER level than the
head's; None while a set of its key has an eviction pending (``evicting``). The victim is the lowest level over
all candidate sets; ties: the one that joined last, then the lowest worker name, then the lowest request id.

``swap(waiting, open_sets, free_slots, config)`` -> ``Swap`` (send that waiting request to that worker's set with
the eviction of that running one, both at its next step boundary) or None: the fair order's sharing within a
level. Only when no free slot is left and the head cannot join a set (as ``preempt``). ``running(flow)`` counts the
members of every open set by ``flow`` (None: unknown, never counted or evicted), and the requests sent to it that
are not members yet (``pending``: counted, never evicted). The live waiting requests of the
head's level are tried in service order (a request whose flow and key were tried already is skipped): one may take
the room of a member of its level and of another flow that runs at least ``SWAP_MARGIN`` more requests than its
own, in an open set of its key with no eviction pending where one eviction makes room (``rows - 1 < cap``); the
first that may, takes it from the flow that runs the most; ties: the one that joined last, then the lowest worker
name, then the lowest request id. After a swap the flows are even or one apart, so they never swap back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.settings import Settings


@dataclass(frozen=True, slots=True)
class WaitingRequest:
    """One request the scheduler has read but not yet dispatched."""

    id: str
    key: Hashable  # the compatibility key (shared.compat.CompatKey in production)
    arrived_at: float  # monotonic seconds when the scheduler first saw it
    aborted: bool = False
    cost: int = 1  # what the request adds to a batch's memory (shared.compat.pixel_cost in production)
    level: int = 0  # its level in the service order (scheduler.queue); a batch holds one level
    knee: int | None = None  # the largest batch of its model and cost that still gains throughput (None: unknown)
    flow: Hashable = None  # its flow in the fair order, (model, API key name), for ``swap`` (None: unknown)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The knobs of the policy, in seconds."""

    max_num_seqs: int
    max_wait_s: float
    stable_s: float
    grouped: bool = False  # True: skip incompatible requests instead of stopping at the first one
    max_batch_cost: int | None = None  # the per-batch budget of summed request costs (None = unbounded)
    by_model: Mapping[str, PolicyConfig] = field(default_factory=dict)  # a model's own knobs (its key's ``model``)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_wait_s < 0 or self.stable_s < 0:
            raise ValueError(f"waits must be >= 0, got max_wait_s={self.max_wait_s}, stable_s={self.stable_s}")

    @classmethod
    def from_settings(cls, settings: Settings) -> PolicyConfig:
        """The policy of a fleet configured by ``settings``: each model of ``model_batching`` with its own knobs."""
        own = {name: cls._of_settings(settings.batching_for(name)) for name in settings.model_batching}
        return cls._of_settings(settings, own)

    @classmethod
    def _of_settings(cls, settings: Settings, by_model: Mapping[str, PolicyConfig] | None = None) -> PolicyConfig:
        return cls(
            max_num_seqs=settings.max_num_seqs,
            max_wait_s=settings.request_batch_max_wait_ms / 1000.0,
            stable_s=settings.wait_stable_ms / 1000.0,
            grouped=settings.batch_order == "grouped",
            max_batch_cost=settings.max_batch_pixels,
            by_model=by_model or {},
        )

    def of(self, head: WaitingRequest) -> PolicyConfig:
        """The knobs of a batch led by ``head``: its model's own (``by_model``, by its key's ``model``), else these."""
        return self.by_model.get(str(getattr(head.key, "model", "")), self) if self.by_model else self

    @property
    def widest(self) -> int:
        """The largest ``max_num_seqs`` of any model."""
        return max([self.max_num_seqs, *(own.max_num_seqs for own in self.by_model.values())])

    def cap(self, head: WaitingRequest) -> int:
        """Most requests in a batch led by ``head``: ``max_num_seqs``, lowered to fit the budget and to the head's
        batch knee where its workers announced one (``gpu_worker.batch_knee``), at least 1."""
        cap = self.max_num_seqs if head.knee is None else min(self.max_num_seqs, head.knee)
        if self.max_batch_cost is None:
            return max(1, cap)
        return max(1, min(cap, self.max_batch_cost // max(1, head.cost)))


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Publish ``request_ids`` as one batch now."""

    request_ids: tuple[str, ...]  # the batch, in arrival order
    dropped_ids: tuple[str, ...]  # aborted requests seen, to be discarded (acked) by the caller


@dataclass(frozen=True, slots=True)
class Wait:
    """Dispatch nothing now."""

    until: float | None  # clock value to call decide() again at; None = only on new input
    dropped_ids: tuple[str, ...]


Decision = Dispatch | Wait


@dataclass(frozen=True, slots=True)
class Member:
    """A request running in an open set (``P:step:levels:{worker}``), for ``preempt``."""

    id: str
    level: int  # its level in the service order (as WaitingRequest.level)
    joined_at: float = 0.0  # when it joined the set (any clock, compared between members only)
    flow: Hashable = None  # its flow in the fair order (as WaitingRequest.flow; None: unknown, never swapped out)


@dataclass(frozen=True, slots=True)
class OpenSet:
    """A worker's running step-mode set, as last read (``P:step:sets``, ``P:step:rows``)."""

    worker: str
    key: Hashable  # the step key of its requests (compared with WaitingRequest.key)
    rows: int  # requests in it or sent to it
    sealed: bool = False  # it takes no more joins
    members: tuple[Member, ...] = ()  # its running requests (read for ``preempt`` only)
    evicting: bool = False  # an eviction was sent to it and is not done yet
    pending: tuple[Hashable, ...] = ()  # the flows of requests sent to it and not yet among its members (``swap``)


@dataclass(frozen=True, slots=True)
class Join:
    """Send ``request_ids`` as one batch to ``worker``'s running set now."""

    worker: str
    request_ids: tuple[str, ...]  # the batch, in service order
    dropped_ids: tuple[str, ...]  # aborted requests seen, to be discarded (acked) by the caller


@dataclass(frozen=True, slots=True)
class Preempt:
    """Ask ``worker``'s running set to evict ``request_id`` at its next step boundary (it is requeued)."""

    worker: str
    request_id: str


@dataclass(frozen=True, slots=True)
class Swap:
    """Send waiting request ``joiner`` to ``worker``'s full running set with the eviction of ``request_id``, whose
    room it takes at the set's next step boundary (``step_swap.lua``)."""

    worker: str
    request_id: str
    joiner: str


SWAP_MARGIN = 2
"""A flow of a level may take a row from another that runs at least this many more requests than it: one fewer
would swap a row back and forth between two flows one apart."""


def _candidate(
    waiting: Sequence[WaitingRequest], head: WaitingRequest, limit: int, grouped: bool
) -> tuple[list[WaitingRequest], bool]:
    """The head plus the following live requests of its level with its key, at most ``limit``; and whether the
    batch is closed (strict order: a live incompatible request of the level follows it)."""
    batch = [head]
    for request in waiting:
        if len(batch) >= limit:
            return batch, False
        if request is head or request.aborted or request.level != head.level:
            continue
        if request.key != head.key:
            if grouped:
                continue
            return batch, True
        batch.append(request)
    return batch, False


def decide(waiting: Sequence[WaitingRequest], free_slots: int, now: float, config: PolicyConfig) -> Decision:
    """What the scheduler should do at clock ``now`` with ``waiting`` (service order) and ``free_slots``."""
    dropped = tuple(r.id for r in waiting if r.aborted)
    head = next((r for r in waiting if not r.aborted), None)
    if head is None or free_slots <= 0:
        return Wait(until=None, dropped_ids=dropped)
    config = config.of(head)

    live = [r for r in waiting if not r.aborted and r.level == head.level]
    cap = config.cap(head)
    batch, closed = _candidate(live, head, cap, config.grouped)

    ids = tuple(r.id for r in batch)
    if len(batch) == cap or closed or config.max_wait_s == 0:
        return Dispatch(request_ids=ids, dropped_ids=dropped)

    # grouped: only arrivals that could join this batch extend its quiet window
    last_arrival = max(r.arrived_at for r in (batch if config.grouped else live))
    deadline = min(head.arrived_at + config.max_wait_s, last_arrival + config.stable_s)
    if now >= deadline:
        return Dispatch(request_ids=ids, dropped_ids=dropped)
    return Wait(until=deadline, dropped_ids=dropped)


def place(waiting: Sequence[WaitingRequest], open_sets: Sequence[OpenSet], config: PolicyConfig) -> Join | None:
    """The head's batch joined to the open set of its key with the most room; None when no set can take it."""
    head = next((r for r in waiting if not r.aborted), None)
    if head is None:
        return None
    config = config.of(head)
    cap = config.cap(head)
    usable = [s for s in open_sets if not s.sealed and s.key == head.key and s.rows < cap]
    if not usable:
        return None
    chosen = min(usable, key=lambda s: (s.rows, s.worker))  # the most room (cap - rows), then the lowest name
    batch, _ = _candidate(waiting, head, cap - chosen.rows, config.grouped)
    return Join(
        worker=chosen.worker,
        request_ids=tuple(r.id for r in batch),
        dropped_ids=tuple(r.id for r in waiting if r.aborted),
    )


def preempt(
    waiting: Sequence[WaitingRequest], open_sets: Sequence[OpenSet], free_slots: int, config: PolicyConfig
) -> Preempt | None:
    """The running request to evict so that the head takes its room; None when the head can start otherwise, or
    no set of its key runs a request of a lower level (see the module's docstring)."""
    head = next((r for r in waiting if not r.aborted), None)
    if head is None or free_slots > 0 or place(waiting, open_sets, config) is not None:
        return None
    same = [s for s in open_sets if not s.sealed and s.key == head.key]
    if any(s.evicting for s in same):
        return None
    cap = config.of(head).cap(head)
    candidates = [(m, s.worker) for s in same if s.rows - 1 < cap for m in s.members if m.level < head.level]
    if not candidates:
        return None
    member, worker = min(candidates, key=lambda c: (c[0].level, -c[0].joined_at, c[1], c[0].id))
    return Preempt(worker=worker, request_id=member.id)


def swap(
    waiting: Sequence[WaitingRequest], open_sets: Sequence[OpenSet], free_slots: int, config: PolicyConfig
) -> Swap | None:
    """The waiting request of the head's level to send into a full set, and the member of a flow that runs at
    least ``SWAP_MARGIN`` more requests whose room it takes; None when none may (see the module's docstring)."""
    head = next((r for r in waiting if not r.aborted), None)
    if head is None or free_slots > 0 or place(waiting, open_sets, config) is not None:
        return None
    flows = [flow for s in open_sets for flow in (*(m.flow for m in s.members), *s.pending)]
    running = Counter(flow for flow in flows if flow is not None)
    tried: set[tuple[Hashable, Hashable]] = set()
    for request in waiting:
        if request.aborted or request.level != head.level or (request.flow, request.key) in tried:
            continue
        tried.add((request.flow, request.key))
        cap = config.of(request).cap(request)
        own = running[request.flow] if request.flow is not None else 0
        candidates = [
            (m, s.worker)
            for s in open_sets
            if not s.sealed and not s.evicting and s.key == request.key and s.rows - 1 < cap
            for m in s.members
            if m.level == request.level
            and m.flow is not None
            and m.flow != request.flow
            and running[m.flow] >= own + SWAP_MARGIN
        ]
        if candidates:
            member, worker = min(candidates, key=lambda c: (-running[c[0].flow], -c[0].joined_at, c[1], c[0].id))
            return Swap(worker=worker, request_id=member.id, joiner=request.id)
    return None
