"""Leadership through a lease in Redis: one active process of several, the others standing by.

``Lease`` is the lease itself: ``SET key token NX PX ttl``, renewed by its owner, released only by its owner.
``LeaderLoop(lease, lead)`` is the loop both leaders of a scheduler process run (the batching service,
``scheduler.service``; the webhook dispatcher, ``scheduler.webhooks``): stand by until the lease is ours (trying
every ttl / 3), ``lead`` while it is, and step down when it is lost, then stand by again, until ``stop`` is set. The
lead renews the lease every ttl / 3 through its ``Renewal`` (``LeaderLoop.renewal``) and returns when a renewal
fails. A Redis outage or a bug in a round never ends the loop: it is logged, and the loop stands by for a backoff
(0.1 s doubling, at most ``OUTAGE_BACKOFF_CAP_S``; reset by a round that ended well, or one that led for more than
``healthy_lead_s`` before it failed). On the way out the lease is released, if it is still ours.

A loop given ``wanted`` (the shard spread of ``scheduler.shard_leaders``: whether this process should lead now)
contends only while it answers True, and a lead whose ``wanted`` turns False hands its lease back at its next
renewal (released at once, so a process with fewer leases takes it).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

import redis

from shared import keys as k
from shared.retry import Backoff, is_transient

log = logging.getLogger(__name__)

OUTAGE_BACKOFF_CAP_S = 5.0
"""The longest pause between two attempts to reach Redis again."""


class Lease:
    """One contender for a lease: ``token`` says who holds it (a fresh one by default; a scheduler process of a
    sharded fleet gives every shard's lease its own one token, so who leads which shard can be read:
    ``scheduler.shard_leaders``)."""

    def __init__(self, client: redis.Redis, key: str, ttl_ms: int, token: str | None = None) -> None:
        self._redis = client
        self.key = key
        self.ttl_ms = ttl_ms
        self.token = token or uuid.uuid4().hex
        self._renew = client.register_script(k.RENEW)
        self._release = client.register_script(k.RELEASE)

    @property
    def renew_every_s(self) -> float:
        """How often its owner renews it, and a contender tries again: a third of its TTL."""
        return self.ttl_ms / 3000

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it (or keep it if we do)."""
        if self._redis.set(self.key, self.token, nx=True, px=self.ttl_ms):
            return True
        return self.renew()

    def renew(self) -> bool:
        """Extend our lease; False when it lapsed or another process took it."""
        return bool(self._renew(keys=[self.key], args=[self.token, self.ttl_ms]))

    def release(self) -> None:
        """Give the lease up at once (clean shutdown), if it is still ours."""
        self._release(keys=[self.key], args=[self.token])


class Renewal:
    """A lead's renewals of its lease, every ``Lease.renew_every_s`` from when it was made; ``wanted`` (when given)
    answering False at a renewal hands the lease back instead."""

    def __init__(
        self, lease: Lease, name: str, clock: Callable[[], float], wanted: Callable[[], bool] | None = None
    ) -> None:
        self._lease = lease
        self.name = name
        self.renewed_at = clock()
        self._wanted = wanted

    def until_due_s(self, now: float) -> float:
        """Seconds from ``now`` until the next renewal is due (<= 0: due)."""
        return self._lease.renew_every_s - (now - self.renewed_at)

    def due(self, now: float) -> bool:
        """Whether the lease is to be renewed at ``now``."""
        return self.until_due_s(now) <= 0

    def renew(self, now: float) -> bool:
        """Renew the lease; False (logged) when it was lost or handed back (released: no longer ``wanted``): the lead
        returns, and its loop stands by."""
        if self._wanted is not None and not self._wanted():
            self._lease.release()
            log.info("%s hands its lease back (another process leads fewer); standing by", self.name)
            return False
        if not self._lease.renew():
            log.warning("%s lease lost; standing by", self.name)
            return False
        self.renewed_at = now
        return True


@dataclass(eq=False)
class LeaderLoop:
    """Stand by, lead, step down, until stopped (see the module's docstring): ``lead(stop)`` leads until the lease is
    lost (it returns) or ``stop`` is set; ``standby``, when given, runs before each attempt to take the lease;
    ``wanted``, when given, says whether to contend at all (and to keep the lease at each renewal); ``name`` names
    the leader in the log lines."""

    lease: Lease
    lead: Callable[[threading.Event], None]
    _: KW_ONLY
    name: str
    clock: Callable[[], float] = time.monotonic
    standby: Callable[[], None] | None = None
    healthy_lead_s: float | None = None
    wanted: Callable[[], bool] | None = None

    def renewal(self) -> Renewal:
        """The renewals of a lead starting now."""
        return Renewal(self.lease, self.name, self.clock, self.wanted)

    def run(self, stop: threading.Event) -> None:
        """Lead whenever the lease is ours, until ``stop`` is set; never raises for a Redis outage or a bug in a
        round (it backs off and tries again). Releases the lease on the way out."""
        backoff = Backoff(cap_s=OUTAGE_BACKOFF_CAP_S)
        try:
            while not stop.is_set():
                led_since: float | None = None
                try:
                    if self.standby is not None:
                        self.standby()
                    if self.wanted is not None and not self.wanted():
                        stop.wait(self.lease.renew_every_s)  # another process is to lead: do not contend
                    elif self.lease.try_acquire():
                        log.info("%s %s is active", self.name, self.lease.token[:8])
                        led_since = self.clock()
                        self.lead(stop)
                    else:
                        stop.wait(self.lease.renew_every_s)
                    backoff.reset()
                except Exception as exc:  # noqa: BLE001 - the process must outlive any outage or bug
                    if self._led_well(led_since):
                        backoff.reset()  # it led fine for a while: a new failure starts a new backoff
                    delay = backoff.next()
                    if is_transient(exc):
                        kind = type(exc).__name__
                        log.warning("%s: Redis unavailable (%s: %s); standing by %.1f s", self.name, kind, exc, delay)
                    else:
                        log.exception("%s round failed; standing by %.1f s", self.name, delay)
                    stop.wait(delay)
        finally:
            try:
                self.lease.release()
            except Exception as exc:  # noqa: BLE001 - it lapses by itself
                log.warning("could not release the %s lease: %s", self.name, exc)

    def _led_well(self, led_since: float | None) -> bool:
        return (
            self.healthy_lead_s is not None and led_since is not None and self.clock() - led_since > self.healthy_lead_s
        )
