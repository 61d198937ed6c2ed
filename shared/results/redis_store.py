"""The Redis result store (the default): images as Redis strings, under a size cap so results cannot fill Redis.

Beyond ``max_bytes`` the oldest objects are dropped first (``shared/lua/redis_result_put.lua``) and the request
of each one that its current run stored records when (``evicted_at``: the api then answers 410 for its images and
says why); an earlier, fenced run's orphan marks nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from shared.keys import REDIS_RESULT_DELETE, REDIS_RESULT_PUT, RedisKeys
from shared.results.store import ResultStoreError, check_key

BACKSTOP_TTL_S = 86_400  # beyond the time an object is due: Redis drops it even if no sweeper ever runs


class RedisResultStore:
    kind = "redis"

    def __init__(self, client: redis.Redis, keys: RedisKeys, *, max_bytes: int, keep_s: int) -> None:
        """``client`` must return bytes (no decoding); ``keep_s`` is the longest an object is kept on purpose
        (result TTL plus the orphan grace): its Redis TTL is that plus a day."""
        self._redis = client
        self._keys = keys
        self.max_bytes = max_bytes
        self._ttl_s = keep_s + BACKSTOP_TTL_S
        self._put = client.register_script(REDIS_RESULT_PUT)
        self._delete = client.register_script(REDIS_RESULT_DELETE)

    def put(self, key: str, data: bytes) -> None:
        k = self._keys
        reply = self._put(
            keys=[k.result(check_key(key)), k.redis_results_order, k.redis_results_sizes, k.redis_results_used],
            args=[data, self.max_bytes, self._ttl_s, k.result(""), k.request("")],
        )
        if int(reply) < 0:
            raise ResultStoreError(
                f"an image of {len(data)} bytes exceeds the Redis result store's cap (result_redis_max_bytes="
                f"{self.max_bytes})"
            )

    def get(self, key: str) -> bytes | None:
        data = self._redis.get(self._keys.result(check_key(key)))
        return data if isinstance(data, bytes) or data is None else str(data).encode()

    def delete(self, keys: Sequence[str]) -> None:
        if keys:
            k = self._keys
            objects = [k.result(check_key(key)) for key in keys]
            self._delete(keys=[k.redis_results_order, k.redis_results_sizes, k.redis_results_used, *objects])

    def url(self, key: str) -> str | None:
        check_key(key)
        return None

    def used_bytes(self) -> int:
        return int(self._redis.get(self._keys.redis_results_used) or 0)
