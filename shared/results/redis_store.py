"""The Redis result store (the default): images as Redis strings, under a size cap so results cannot fill Redis.

Beyond ``max_bytes`` the oldest objects are dropped first (``shared/lua/redis_result_put.lua``) and the request
of each one that its current run stored records when (``evicted_at``: the api then answers 410 for its images and
says why); an earlier, fenced run's orphan marks nothing. ``put_many`` stores a batch's objects in one script call
(``put`` is one object's). It reads the oldest objects that would make room (candidates) and the script drops them
in the same call that marks their requests; when a concurrent put or delete changed the order in between, it reads
again (at most ``PUT_TRIES`` calls). Objects that fit in the room the last put left (the bytes in use it answered;
other writers may have taken it since) are put with no read first: the script answers retry when room must be made
after all, and the put goes on as above.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import redis

from shared.keys import REDIS_RESULT_DELETE, REDIS_RESULT_PUT, RedisKeys
from shared.results.store import KEY_PATTERN, ResultStoreError, check_key

BACKSTOP_TTL_S = 86_400  # beyond the time an object is due: Redis drops it even if no sweeper ever runs
CANDIDATE_PAGE = 8
"""Objects read per round trip while choosing what to drop, oldest first, until their bytes make room."""
PUT_TRIES = 20
"""Script calls of one put before it gives up: each retry means the order changed under it (another put, a delete)."""
PUT_PAGE = 512
"""Objects stored by one script call at most (a batch's images are one call; a long video's frames a few)."""


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
        self._room = 0  # bytes free as the last put left them (0 until one ran: read first)

    def put(self, key: str, data: bytes) -> None:
        refused = self.put_many([(key, data)])
        if key in refused:
            raise refused[key]

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> dict[str, ResultStoreError]:
        """Store the objects in script calls of up to ``PUT_PAGE`` (one for a batch's images); an object alone
        over the cap is refused. Objects that fit only one by one (together over the cap) are put one by one."""
        objects = {self._keys.result(check_key(key)): (key, data) for key, data in items}  # a key once: its last
        refused = {key: self._too_large(data) for key, data in objects.values() if len(data) > self.max_bytes}
        fitting = [(name, data) for name, (key, data) in objects.items() if key not in refused]
        pages = [fitting[start : start + PUT_PAGE] for start in range(0, len(fitting), PUT_PAGE)]
        for page in pages:
            if sum(len(data) for _, data in page) <= self.max_bytes:
                self._put_page(page)
            else:  # together they exceed the cap: each makes its own room, the batch's earlier ones included
                for name, data in page:
                    self._put_page([(name, data)])
        return refused

    def _put_page(self, page: Sequence[tuple[str, bytes]]) -> None:
        """One object or more, together within the cap, stored (``redis_result_put.lua``, retried while the order
        of the oldest objects changes under it)."""
        k = self._keys
        names = [name for name, _ in page]
        size = sum(len(data) for _, data in page)
        fixed = [k.redis_results_order, k.redis_results_sizes, k.redis_results_used, *names]
        for attempt in range(PUT_TRIES):
            read = attempt > 0 or size > self._room
            strides = [self._stride(victim) for victim in self._candidates(names, size)] if read else []
            reply = self._put(
                keys=[*fixed, *(slot for victim, request, _ in strides for slot in (victim, request))],
                args=[
                    self.max_bytes,
                    self._ttl_s,
                    len(page),
                    *(data for _, data in page),
                    *(token for _, _, token in strides),
                ],
            )
            if int(reply[0]) < 0:
                raise ResultStoreError(f"{len(page)} objects of {size} bytes exceed the cap ({self.max_bytes})")
            if int(reply[1]):
                self._room = self.max_bytes - int(reply[2])
                return
        raise ResultStoreError(
            f"storing {len(page)} objects: the Redis result store's oldest objects kept changing under {PUT_TRIES} "
            "tries to make room"
        )

    def _too_large(self, data: bytes) -> ResultStoreError:
        return ResultStoreError(
            f"an image of {len(data)} bytes exceeds the Redis result store's cap (result_redis_max_bytes="
            f"{self.max_bytes})"
        )

    def _candidates(self, object_keys: Sequence[str], size: int) -> list[bytes]:
        """The oldest objects (not one of ``object_keys``) whose bytes make room for ``size`` more, as read now."""
        k = self._keys
        need = int(self._redis.get(k.redis_results_used) or 0) + size - self.max_bytes
        own = {name.encode() for name in object_keys}
        picked: list[bytes] = []
        start = 0
        while need > 0:
            page = cast(list[bytes], self._redis.zrange(k.redis_results_order, start, start + CANDIDATE_PAGE - 1))
            if not page:
                break
            for victim, stored in zip(page, self._redis.hmget(k.redis_results_sizes, page), strict=True):
                if victim not in own and need > 0:
                    picked.append(victim)
                    need -= int(stored or 0)
            start += CANDIDATE_PAGE
        return picked

    def _stride(self, victim: bytes) -> tuple[bytes, bytes | str, str]:
        """A candidate's object key, its request's hash key and its claim token, from the object's result key; a key
        not of that shape names no request: its own key stands in for the hash, with no token (nothing marked)."""
        prefix = self._keys.result("").encode()
        key = victim[len(prefix) :].decode(errors="replace") if victim.startswith(prefix) else ""
        if not KEY_PATTERN.match(key):
            return victim, victim, ""
        request_id, token = key.split("/")[:2]
        return victim, self._keys.request(request_id), token

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
