"""The results journal: the Redis index of every result object and when it may be deleted.

A run records the keys of the objects it is about to store (due after ``result_orphan_grace_s``) before writing
any; finishing a request as succeeded pushes its keys' due time to its expiry. So an object is always either
referenced by a succeeded request or due soon, and the sweeper (``scheduler.sweeper``) deletes what is due: the
images of expired and deleted requests, and those of runs that never finished.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from shared.keys import RESULTS_DUE, RESULTS_RECORD, RedisKeys


class ResultJournal:
    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self._redis = client
        self._keys = keys
        self._record = client.register_script(RESULTS_RECORD)
        self._due = client.register_script(RESULTS_DUE)

    def record(self, result_keys: Sequence[str], grace_s: float) -> None:
        """Journal ``result_keys`` before their objects are written: due for deletion ``grace_s`` from now."""
        if result_keys:
            self._record(keys=[self._keys.results_journal], args=[int(grace_s * 1000), *result_keys])

    def take_due(self, limit: int, retry_s: float) -> list[str]:
        """Up to ``limit`` keys whose objects must be deleted now; untaken again unless ``deleted`` confirms them
        within ``retry_s``."""
        keys = [self._keys.results_journal, self._keys.results_deleting]
        return [str(key) for key in self._due(keys=keys, args=[limit, int(retry_s * 1000)])]

    def deleted(self, result_keys: Sequence[str]) -> None:
        """Confirm that these keys' objects are deleted."""
        if result_keys:
            self._redis.zrem(self._keys.results_deleting, *result_keys)

    def pending(self) -> int:
        """Keys journaled or waiting for deletion (a measure of the store's object count)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.zcard(self._keys.results_journal)
        pipe.zcard(self._keys.results_deleting)
        return sum(int(count) for count in pipe.execute())
