"""The worker's view of Redis: claim a batch, report progress, finish requests, heartbeat.

Every state change is one of the scripts of ``shared.keys``, so it is atomic and only moves a request forward.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from shared import keys as k
from shared.contracts import BatchMessage, ErrorInfo, RequestSpec, RequestStatus
from shared.settings import Settings


@dataclass(frozen=True, slots=True)
class Claimed:
    """The batch is ours: ``statuses`` holds each request's status after the claim (running = run it)."""

    attempts: int
    statuses: dict[str, RequestStatus | None]
    specs: list[RequestSpec]  # of the running requests, in batch order

    @property
    def running(self) -> list[str]:
        return [rid for rid, status in self.statuses.items() if status is RequestStatus.RUNNING]


@dataclass(frozen=True, slots=True)
class Locked:
    """Another worker holds the batch; its lock expires in ``retry_after_s`` unless renewed."""

    retry_after_s: float


def _status(reply: str | bytes) -> RequestStatus | None:
    status = reply.decode() if isinstance(reply, bytes) else reply
    return RequestStatus(status) if status != "missing" else None


class WorkerStore:
    """Redis operations of one worker process."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._redis = client
        self._settings = settings
        self.keys = k.RedisKeys(settings.key_prefix)
        self._claim = client.register_script(k.CLAIM)
        self._progress = client.register_script(k.PROGRESS)
        self._finish = client.register_script(k.FINISH)
        self._batch_done = client.register_script(k.BATCH_DONE)
        self._renew = client.register_script(k.RENEW)

    def claim(self, batch: BatchMessage, token: str, worker: str) -> Claimed | Locked:
        ids = list(batch.request_ids)
        s = self._settings
        reply = self._claim(
            keys=[self.keys.batch_lock(batch.batch_id), self.keys.batch(batch.batch_id)]
            + [self.keys.request(rid) for rid in ids],
            args=[
                token,
                int(s.batch_lock_ttl_s * 1000),
                batch.batch_id,
                time.time(),
                worker,
                s.max_batch_attempts,
                s.result_ttl_s,
                self.keys.finished,
                *ids,
            ],
        )
        if int(reply[0]) == -1:
            return Locked(retry_after_s=max(0.2, int(reply[1]) / 1000.0))
        rows = reply[1:]
        statuses: dict[str, RequestStatus | None] = {}
        specs: list[RequestSpec] = []
        for i in range(0, len(rows), 3):
            request_id, status, spec = rows[i : i + 3]
            statuses[request_id] = RequestStatus(status) if status != "missing" else None
            if spec:
                specs.append(RequestSpec.model_validate_json(spec))
        return Claimed(attempts=int(reply[0]), statuses=statuses, specs=specs)

    def progress(self, request_ids: list[str], step: int, total: int) -> list[bool]:
        """Record step ``step`` of ``total`` for running requests; return each request's abort flag."""
        flags = self._progress(keys=[self.keys.request(rid) for rid in request_ids], args=[step, total])
        return [bool(int(flag)) for flag in flags]

    def succeed(self, request_id: str, pngs: list[bytes]) -> RequestStatus | None:
        return self.succeed_many({request_id: pngs})[request_id]

    def succeed_many(self, results: dict[str, list[bytes]]) -> dict[str, RequestStatus | None]:
        """End several running requests with their images in one round trip; their statuses after it."""
        pipe = self._redis.pipeline(transaction=False)
        for request_id, pngs in results.items():
            self._finish(*self._finish_call(request_id, RequestStatus.SUCCEEDED, pngs=pngs), client=pipe)
        return {rid: _status(reply) for rid, reply in zip(results, pipe.execute(), strict=True)}

    def fail(self, request_id: str, error: ErrorInfo) -> RequestStatus | None:
        return _status(self._finish(*self._finish_call(request_id, RequestStatus.FAILED, error=error)))

    def _finish_call(
        self,
        request_id: str,
        outcome: RequestStatus,
        pngs: Sequence[bytes] = (),
        error: ErrorInfo | None = None,
    ) -> tuple[list[str], list[str | bytes | float | int]]:
        """KEYS and ARGV of the FINISH script (see ``shared.keys``)."""
        keys = [self.keys.request(request_id), *(self.keys.image(request_id, i) for i in range(len(pngs)))]
        args: list[str | bytes | float | int] = [
            outcome.value,
            time.time(),
            self._settings.result_ttl_s,
            error.type if error else "",
            error.message if error else "",
            self.keys.finished,
            request_id,
            *pngs,
        ]
        return keys, args

    def batch_done(self, batch_id: str, token: str) -> None:
        self._batch_done(
            keys=[self.keys.batch_lock(batch_id), self.keys.inflight, self.keys.events],
            args=[token, batch_id, k.EVENTS_MAXLEN],
        )

    def renew_lock(self, batch_id: str, token: str) -> bool:
        ttl_ms = int(self._settings.batch_lock_ttl_s * 1000)
        return bool(self._renew(keys=[self.keys.batch_lock(batch_id)], args=[token, ttl_ms]))

    def heartbeat(self, worker: str, *, first: bool = False) -> None:
        """Announce ``worker`` as a live slot; the first beat also wakes the scheduler."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.zadd(self.keys.workers, {worker: int(time.time() * 1000)})
        if first:
            pipe.xadd(self.keys.events, {"type": "worker_up", "worker": worker}, maxlen=k.EVENTS_MAXLEN)
        pipe.execute()

    def leave(self, worker: str) -> None:
        self._redis.zrem(self.keys.workers, worker)
