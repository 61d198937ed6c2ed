"""The active-scheduler lease: ``SET key token NX PX ttl``, renewed by its owner, released only by its owner."""

from __future__ import annotations

import uuid

import redis

from shared import keys as k


class Lease:
    """One contender for the scheduler lease (a fresh token per process)."""

    def __init__(self, client: redis.Redis, key: str, ttl_ms: int) -> None:
        self._redis = client
        self.key = key
        self.ttl_ms = ttl_ms
        self.token = uuid.uuid4().hex
        self._renew = client.register_script(k.RENEW)
        self._release = client.register_script(k.RELEASE)

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it (or keep it if we do)."""
        if self._redis.set(self.key, self.token, nx=True, px=self.ttl_ms):
            return True
        return self.renew()

    def renew(self) -> bool:
        """Extend our lease; False when it lapsed or another scheduler took it."""
        return bool(self._renew(keys=[self.key], args=[self.token, self.ttl_ms]))

    def release(self) -> None:
        """Give the lease up at once (clean shutdown), if it is still ours."""
        self._release(keys=[self.key], args=[self.token])
