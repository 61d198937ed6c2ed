"""The shards' leases spread over a sharded fleet's scheduler processes (docs/architecture.md#shards).

A scheduler process runs, for every shard, what it runs for a fleet of one (``scheduler.app``); each shard's batching
service and webhook dispatcher contend for that shard's leases. ``ShardLeaders`` spreads them: every process
announces itself in the fleet's own keys (``P:scheduler:processes``, a sorted set of process tokens scored by when
each announcement lapses), gives every shard's scheduler lease its one token (so ``GET`` of a lease says which
process leads the shard), and every ``scheduler_lease_ms / 3`` reads the live processes and the leases and decides
with ``spread`` which shards it is to lead: its leaders contend only for those (``LeaderLoop``'s ``wanted``), and a
lead no longer wanted hands its lease back at its next renewal. So N processes lead the shards between them, at most
``ceil(shards / N)`` each, each standing by for the others' shards; a lone process leads them all.

An announcement lapses after two thirds of the lease TTL, before the leases of a killed process do: by the time its
leases lapse the others count it gone and contend for its shards, which one takes within one renewal (``ttl / 3``)
of the lapse. Scores are each process's wall clock (hosts kept in time by NTP: a skew well under the TTL). A
process seen gone too soon (a late announcement) changes nothing held: a lease is only ever handed back by a
process above its share, never taken from a live holder.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence

import redis

from shared.keys import RedisKeys
from shared.retry import repeat_until
from shared.settings import Settings
from shared.shards import Shards

log = logging.getLogger(__name__)

ANNOUNCE_TTL_SHARE = 2 / 3
"""An announcement lapses after this share of ``scheduler_lease_ms``: before the leases of a killed process."""


def spread(me: str, live: Collection[str], holders: Mapping[str, str | None], shards: Sequence[str]) -> frozenset[str]:
    """The shards process ``me`` is to lead, given the ``live`` processes (``me`` among them, whether or not listed)
    and each shard's lease ``holders`` (a process token; None or absent: nobody holds it).

    Each process's share is ``ceil(len(shards) / live processes)``. A process holding more than its share keeps all
    but its last one (in ``shards``' order: the same one every round until it is gone), handing one back at a time.
    One holding fewer contends for as many of the free shards (unheld, or held by a process no longer live, whose
    lease is about to lapse) as its share leaves room for, starting from its rank among the live processes, so
    processes short of their share go for different shards. It keeps every shard it holds otherwise."""
    processes = sorted({*live, me})
    share = math.ceil(len(shards) / len(processes))
    mine = [shard for shard in shards if holders.get(shard) == me]
    if len(mine) > share:
        return frozenset(mine[:-1])
    free = [shard for shard in shards if holders.get(shard) not in processes]
    start = processes.index(me) % len(free) if free else 0
    contended = (free[start:] + free[:start])[: share - len(mine)]
    return frozenset(mine) | frozenset(contended)


class ShardLeaders:
    """This process's part in the spread: its announcements, and which shards it is to lead (``wants``), decided
    every ``scheduler_lease_ms / 3`` by ``spread`` over what Redis says (``run``, a thread: ``start``)."""

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        *,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        shards = Shards(settings)
        self.token = token or uuid.uuid4().hex
        self.shards = shards.names
        self._redis = client
        self._processes = RedisKeys(settings.key_prefix).scheduler_processes
        self._leases = {shard: RedisKeys(shards.settings_of(shard).key_prefix).scheduler_lease for shard in self.shards}
        self._every_s = settings.scheduler_lease_ms / 3000
        self._announce_ms = int(settings.scheduler_lease_ms * ANNOUNCE_TTL_SHARE)
        self._key_ttl_ms = settings.scheduler_lease_ms  # the set itself goes once every process is gone
        self._clock = clock
        self._wanted: frozenset[str] = frozenset()

    def wants(self, shard: str) -> bool:
        """Whether this process is to lead ``shard`` now (as last decided; nothing before the first round)."""
        return shard in self._wanted

    def wanted_of(self, shard: str) -> Callable[[], bool]:
        """``wants`` of ``shard``, for its leaders' ``LeaderLoop``."""
        return lambda: self.wants(shard)

    def round(self) -> frozenset[str]:
        """Announce this process, read the live processes and every shard's lease holder (one round trip), and
        decide (``spread``): the shards this process is to lead from now."""
        now_ms = int(self._clock() * 1000)
        pipe = self._redis.pipeline(transaction=False)
        pipe.zremrangebyscore(self._processes, "-inf", now_ms)
        pipe.zadd(self._processes, {self.token: now_ms + self._announce_ms})
        pipe.pexpire(self._processes, self._key_ttl_ms)
        pipe.zrange(self._processes, 0, -1)
        for shard in self.shards:
            pipe.get(self._leases[shard])
        replies = pipe.execute()
        live = [str(token) for token in replies[3]]
        held = replies[4:]
        holders = {shard: None if token is None else str(token) for shard, token in zip(self.shards, held, strict=True)}
        wanted = spread(self.token, live, holders, self.shards)
        if wanted != self._wanted:
            shown = ", ".join(repr(shard) for shard in self.shards if shard in wanted) or "none"
            log.info("scheduler %s of %d live leads shards: %s", self.token[:8], len(set(live) | {self.token}), shown)
        self._wanted = wanted
        return wanted

    def run(self, stop: threading.Event) -> None:
        """Decide every ``scheduler_lease_ms / 3`` until ``stop`` is set; a failed round (Redis away) keeps the last
        decision (the leases themselves lapse without Redis) and is tried again with a backoff. Withdraws the
        announcement on the way out, so the others count this process gone at once."""
        # start() made the first round
        repeat_until(stop, self._every_s, self.round, what="shard spread round", backoff_cap_s=self._every_s)
        try:
            self._redis.zrem(self._processes, self.token)
        except Exception as exc:  # noqa: BLE001 - it lapses by itself
            log.warning("could not withdraw scheduler %s's announcement: %s", self.token[:8], exc)

    def start(self, stop: threading.Event) -> threading.Thread:
        """Decide once now (so the leaders start with a decision, when Redis answers), then ``run`` in a thread."""
        try:
            self.round()
        except Exception as exc:  # noqa: BLE001 - run tries again
            log.warning("shard spread: first round failed (%s: %s)", type(exc).__name__, exc)
        thread = threading.Thread(target=self.run, args=(stop,), name="shard-leaders", daemon=True)
        thread.start()
        return thread
