"""The worker's view of Redis: claim a batch, report progress, finish requests, heartbeat.

Every state change is one of the scripts of ``shared/lua`` (see ``shared.keys``), so it is atomic and only moves
a request forward. Writes that end a request carry the claim token, so only the run that holds the current
claim can finish it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

import redis

from shared import keys as k
from shared.contracts import BatchMessage, ErrorInfo, RequestSpec, RequestStatus, WorkerCapabilities
from shared.results import ResultJournal
from shared.settings import Settings


@dataclass(frozen=True, slots=True)
class Claimed:
    """The batch is ours under ``token``: ``statuses`` holds each request's status after the claim."""

    token: str
    attempts: int
    statuses: dict[str, RequestStatus | None]
    specs: list[RequestSpec]  # of the requests this claim runs, in batch order

    @property
    def running(self) -> list[str]:
        return [spec.id for spec in self.specs]


@dataclass(frozen=True, slots=True)
class Locked:
    """Another run holds the batch; its lock expires in ``retry_after_s`` unless renewed."""

    retry_after_s: float


ABORTED = ErrorInfo(type="Aborted", message="aborted while running")
"""The error an aborted request is ended with: ``finish.lua`` ends a flagged request ``aborted`` whatever the outcome
it is given (and keeps no error for it but a deadline's ``Timeout``)."""


class RowSignal(IntEnum):
    """What ``progress.lua`` says about one request of a running forward."""

    GO_ON = 0
    ABORTED = 1
    NOT_OURS = 2  # re-claimed by another run after our lock lapsed, or already ended: stop spending on it


class Beat(IntEnum):
    """What ``heartbeat.lua`` answered a beat (truthy when announced)."""

    REFUSED = 0  # the worker is quarantined: nothing announced
    ANNOUNCED = 1
    ANEW = 2  # announced, and it was not among the live workers: its first beat, or one after it was swept


_FinishRow = tuple[str, RequestStatus, Sequence[str], ErrorInfo | None]
"""One request for ``finish.lua``: its id, outcome, result keys and error."""


def _status(reply: str | bytes) -> RequestStatus | None:
    status = reply.decode() if isinstance(reply, bytes) else reply
    return RequestStatus(status) if status != "missing" else None


class WorkerStore:
    """Redis operations of one worker process."""

    def __init__(self, client: redis.Redis, settings: Settings, *, binary: redis.Redis | None = None) -> None:
        """``client`` decodes replies to ``str``; ``binary`` (bytes replies) reads input images, and must be given
        to run image-conditioned requests."""
        self._redis = client
        self._binary = binary
        self._settings = settings
        self.keys = k.RedisKeys(settings.key_prefix)
        self.journal = ResultJournal(client, self.keys)
        self._claim = client.register_script(k.CLAIM)
        self._progress = client.register_script(k.PROGRESS)
        self._finish = client.register_script(k.FINISH)
        self._batch_done = client.register_script(k.BATCH_DONE)
        self._forward_done = client.register_script(k.FORWARD_DONE)
        self._renew = client.register_script(k.RENEW)
        self._give_back = client.register_script(k.GIVE_BACK)
        self._heartbeat = client.register_script(k.HEARTBEAT)
        self._step_close = client.register_script(k.STEP_CLOSE)
        self._step_leave = client.register_script(k.STEP_LEAVE)
        self._step_seal = client.register_script(k.STEP_SEAL)
        self._step_reregister = client.register_script(k.STEP_REREGISTER)
        self._requeue = client.register_script(k.REQUEUE)

    def claim(self, batch: BatchMessage, token: str, worker: str) -> Claimed | Locked:
        ids = list(batch.request_ids)
        s = self._settings
        reply = self._claim(
            keys=[
                *self.keys.end_keys,
                self.keys.batch_lock(batch.batch_id),
                self.keys.batch(batch.batch_id),
                *self.keys.request_strides(ids),
            ],
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
            statuses[request_id] = _status(status)
            if spec:
                specs.append(RequestSpec.model_validate_json(spec))
        return Claimed(token=token, attempts=int(reply[0]), statuses=statuses, specs=specs)

    def progress(self, request_ids: Sequence[str], step: int, total: int, token: str) -> list[RowSignal]:
        """Record step ``step`` of ``total`` for the requests this claim runs; what each row should do next."""
        keys = [self.keys.webhooks, *self.keys.request_strides(request_ids)]
        flags = self._progress(keys=keys, args=[step, total, token, *request_ids])
        return [RowSignal(int(flag)) for flag in flags]

    def record_results(self, result_keys: Sequence[str]) -> None:
        """Journal the result keys this run is about to store (before writing any object)."""
        self.journal.record(result_keys, self._settings.result_orphan_grace_s)

    def finish_many(
        self,
        results: Mapping[str, Sequence[str]],
        errors: Mapping[str, ErrorInfo],
        token: str,
        *,
        no_inputs: Collection[str] = (),
        progress: tuple[int, int] | None = None,
    ) -> dict[str, RequestStatus | None]:
        """End running requests of this claim in one script call: those in ``results`` succeeded with the images
        stored under these result keys, those in ``errors`` failed; returns each one's status after the call
        (unchanged where not ours). ``no_inputs``: those of them whose spec needs no input image (its task), so
        ending them deletes no input fields. ``progress``: their forward's last (step, total), written with their
        ending (the step reporter left it: ``StepReporter.close_unwritten``)."""
        rows: list[_FinishRow] = [(rid, RequestStatus.SUCCEEDED, keys, None) for rid, keys in results.items()]
        rows += [(rid, RequestStatus.FAILED, (), error) for rid, error in errors.items()]
        return self._finish_rows(rows, token, no_inputs, progress)

    def finish_aborted(
        self, result_keys: Mapping[str, Sequence[str]], token: str, *, no_inputs: Collection[str] = ()
    ) -> dict[str, RequestStatus | None]:
        """End running requests of this claim whose abort flag is set, in one script call, without images:
        ``finish.lua`` makes the flag win (``aborted``, no images, its terminal event, a wake-up of long polls), and
        the keys journaled for each request (``result_keys``: request id -> its keys) fall due at once, so the
        sweeper forgets them. Returns each one's status after the call (unchanged where not ours); ``no_inputs`` as
        for ``finish_many``."""
        rows: list[_FinishRow] = [(rid, RequestStatus.FAILED, keys, ABORTED) for rid, keys in result_keys.items()]
        return self._finish_rows(rows, token, no_inputs)

    def _finish_rows(
        self,
        rows: Sequence[_FinishRow],
        token: str,
        no_inputs: Collection[str],
        progress: tuple[int, int] | None = None,
    ) -> dict[str, RequestStatus | None]:
        """One ``finish.lua`` call for ``rows`` (request id, outcome, its result keys, its error)."""
        if not rows:
            return {}
        args: list[str | float | int] = [time.time(), self._settings.result_ttl_s, self.keys.finished, token]
        for request_id, outcome, keys, error in rows:
            args += [request_id, outcome.value, error.type if error else "", error.message if error else ""]
            args += ["1" if request_id in no_inputs else "", len(keys), *keys]
        if progress is not None:
            args += list(progress)
        ids = [row[0] for row in rows]
        replies = self._finish(keys=k.finish_keys(self.keys, *ids), args=args)
        return {rid: _status(reply) for rid, reply in zip(ids, replies, strict=True)}

    def input_images(self, request_ids: Sequence[str]) -> dict[str, tuple[bytes | None, bytes | None]]:
        """The stored (input image, input mask) bytes of each request (None where absent), one round trip: the
        client's PNG, JPEG or WebP file, or a PNG at the request's size (``api.input_images``)."""
        if self._binary is None:
            raise RuntimeError("this WorkerStore has no binary Redis client to read input images with")
        pipe = self._binary.pipeline(transaction=False)
        for request_id in request_ids:
            pipe.hmget(self.keys.request(request_id), ["input_image", "input_mask"])
        return {rid: (image, mask) for rid, (image, mask) in zip(request_ids, pipe.execute(), strict=True)}

    def batch_done(self, batch_id: str, token: str, statuses: Mapping[str, RequestStatus | None] | None = None) -> bool:
        """Release this run's hold on the batch; True when the batch left flight (nothing of it unfinished).
        ``statuses``: what this run saw of every request of the batch (its claim's and finishes' replies, keyed by
        the batch's ids): then the batch's ids are not read, nor the hashes of those it saw terminal; None: both
        read."""
        ids = list(statuses) if statuses is not None else self._batch_ids(batch_id)
        ended = [rid for rid, status in (statuses or {}).items() if status is not None and status.terminal]
        keys = [
            self.keys.batch_lock(batch_id),
            self.keys.inflight,
            self.keys.events,
            self.keys.batch(batch_id),
            self.keys.storing,
            *self.keys.request_strides(ids),
        ]
        args: list[str | int] = [token, batch_id, k.EVENTS_MAXLEN, self._settings.result_ttl_s, *ids, *ended]
        return bool(self._batch_done(keys=keys, args=args))

    def _batch_ids(self, batch_id: str) -> list[str]:
        """The requests of a batch (its ``ids``, written once by ``schedule.lua``), for a script that needs their
        keys."""
        return str(self._redis.hget(self.keys.batch(batch_id), "ids") or "").split()

    def forward_done(self, batch_id: str, token: str) -> bool:
        """This run's forward is over and its outputs are being stored: free the worker's slot for the next batch
        (the batch stays in flight and locked until ``batch_done``). False when the run no longer holds it."""
        keys = [self.keys.batch_lock(batch_id), self.keys.storing, self.keys.events]
        return bool(self._forward_done(keys=keys, args=[token, batch_id, k.EVENTS_MAXLEN]))

    def renew_lock(self, batch_id: str, token: str) -> bool:
        ttl_ms = int(self._settings.batch_lock_ttl_s * 1000)
        return bool(self._renew(keys=[self.keys.batch_lock(batch_id)], args=[token, ttl_ms]))

    def give_back(self, batch_id: str, token: str | None) -> int:
        """Hand the batch back to the reaper without counting a lost run (``give_back.lua``): with this run's
        ``token``, its requests lose their claim and the lock goes, so the reaper publishes it again at its next pass
        and the next claim runs them as they were; with None (a message this worker took but did not claim), the
        batch falls due for the reaper. The requests handed back, or -1 when the token no longer held the lock."""
        ids = self._batch_ids(batch_id) if token else []
        keys = [self.keys.batch_lock(batch_id), self.keys.batch(batch_id), *self.keys.request_strides(ids)]
        return int(self._give_back(keys=keys, args=[token or "", *ids]))

    def quarantine(self, worker: str, reason: str) -> None:
        """Take ``worker``'s slot away for ``worker_quarantine_s``: its heartbeats announce nothing until then
        (``heartbeat.lua``), and it leaves the live workers now (``leave``)."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self.keys.worker_quarantine(worker), reason, px=int(self._settings.worker_quarantine_s * 1000))
        self._leave(pipe, worker)
        pipe.execute()

    def heartbeat(self, worker: str, capabilities: WorkerCapabilities, *, first: bool = False) -> Beat:
        """Announce ``worker`` as a live slot (scored by Redis time) and what it can do; the first beat also wakes
        the scheduler. ``Beat.REFUSED`` (falsy: nothing announced) while the worker is quarantined; ``Beat.ANEW``
        when the worker was not among the live ones (its first beat, or one after it was swept)."""
        reply = self._heartbeat(
            keys=[self.keys.workers, self.keys.events, self.keys.capabilities, self.keys.worker_quarantine(worker)],
            args=[worker, int(first), k.EVENTS_MAXLEN, capabilities.model_dump_json()],
        )
        return Beat(int(reply))

    # --- step mode (docs/step_mode.md, gpu_worker.step_loop) ---------------------------------------------------

    def step_open(self, worker: str, digest: str, requests: int) -> str:
        """Register ``worker``'s running set of step key ``digest`` holding ``requests`` requests, its levels hash
        empty: the scheduler may send it batches of that key (``step_join.lua``), and the set holds the worker's slot
        (``free_slots.lua``). The set's id (``P:step:open:{worker}``), which ``step_reregister`` needs."""
        set_id = uuid.uuid4().hex
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(self.keys.step_sets, worker, digest)
        pipe.hset(self.keys.step_rows, worker, requests)
        pipe.delete(self.keys.step_levels(worker))
        pipe.set(self.keys.step_open(worker), set_id, ex=2 * int(self._settings.batch_time_limit_s))
        pipe.execute()
        return set_id

    def step_seal(self, worker: str) -> bool:
        """The worker's running set takes no more joins (it still drains its inbox and rows); ``step_seal.lua``.
        False when the worker has no registered set (nothing written)."""
        return int(self._step_seal(keys=[self.keys.step_sets], args=[worker, k.STEP_SEALED])) == 1

    def step_inbox(self, worker: str) -> list[str]:
        """The messages waiting in the worker's inbox, oldest first (nothing popped)."""
        messages: list[str] = self._redis.lrange(self.keys.step_inbox(worker), 0, -1)  # type: ignore[assignment]
        return messages

    def step_reregister(self, worker: str, set_id: str, value: str, rows: int, inbox_len: int) -> int:
        """Register the worker's running set ``set_id`` again, as ``value`` (its digest or ``STEP_SEALED``) counting
        ``rows`` requests, after a late beat had it swept (``step_reregister.lua``, which says why the count is
        safe): 1 when registered, 0 when it is registered already, -2 when the set is gone (closed or dropped), -1
        when the worker is not live or its inbox no longer holds ``inbox_len`` messages (nothing written)."""
        keys = [
            self.keys.step_sets,
            self.keys.step_rows,
            self.keys.step_inbox(worker),
            self.keys.workers,
            self.keys.events,
            self.keys.step_open(worker),
        ]
        args: list[str | int] = [worker, value, rows, inbox_len, k.EVENTS_MAXLEN, set_id]
        return int(self._step_reregister(keys=keys, args=args))

    def step_inbox_pop(self, worker: str) -> str | None:
        """The oldest batch message (``BatchMessage`` JSON) sent to the worker's running set, or None."""
        message: str | None = self._redis.lpop(self.keys.step_inbox(worker))  # type: ignore[assignment]
        return message

    def step_inbox_wait(self, worker: str, timeout_s: float) -> str | None:
        """``step_inbox_pop``, waiting up to ``timeout_s`` for a message (``BLPOP``; below the socket timeout)."""
        reply = self._redis.blpop([self.keys.step_inbox(worker)], timeout=timeout_s)
        return None if reply is None else str(reply[1])

    def step_leave(self, worker: str, requests: int, ran: Sequence[str] = (), *, token: str | None = None) -> None:
        """``requests`` requests counted in the worker's set ended, or were sent to it and will not run in it: their
        room is free for joiners, so the scheduler is woken (a set that was full may take the next waiting ones);
        ``ran``, those of them that ran in the set, leave its levels hash. One round trip (``step_leave.lua``).

        ``token`` names this count-out: a call retried after a lost reply passes the same one and is counted once
        (None: a fresh token, for a call that is not retried)."""
        if requests:
            keys = [
                self.keys.step_sets,
                self.keys.step_rows,
                self.keys.events,
                self.keys.step_levels(worker),
                self.keys.step_left(worker),
            ]
            ttl_s = int(self._settings.batch_time_limit_s)
            args: list[str | int] = [worker, requests, k.EVENTS_MAXLEN, token or uuid.uuid4().hex, ttl_s, *ran]
            self._step_leave(keys=keys, args=args)

    def step_close(self, worker: str) -> bool:
        """Close the worker's empty running set (it frees the slot and wakes the scheduler); False when batches
        wait in its inbox (claim them and go on)."""
        keys = [
            self.keys.step_sets,
            self.keys.step_rows,
            self.keys.step_inbox(worker),
            self.keys.events,
            self.keys.step_open(worker),
        ]
        return int(self._step_close(keys=keys, args=[worker, k.EVENTS_MAXLEN])) == 1

    def step_drop(self, worker: str) -> list[str]:
        """Take down the worker's running set after a run that could not end it normally: no more joins, its slot
        freed, its levels hash gone, and the batch messages left in its inbox returned (and removed). Those batches
        were never claimed: the reaper publishes them again after ``batch_claim_timeout_s``."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.hdel(self.keys.step_sets, worker)
        pipe.hdel(self.keys.step_rows, worker)
        pipe.lrange(self.keys.step_inbox(worker), 0, -1)
        pipe.delete(self.keys.step_inbox(worker), self.keys.step_levels(worker), self.keys.step_open(worker))
        left: list[str] = pipe.execute()[2]
        return left

    def step_levels(self, worker: str, joined: Mapping[str, int]) -> None:
        """Record in the worker's set's levels hash (``P:step:levels:{worker}``, read by the scheduler to preempt)
        that ``joined`` (request id -> priority) joined it now; they leave it with ``step_leave``, and the hash goes
        with ``step_open``, ``step_drop`` and, at the latest, ``batch_time_limit_s`` after its last write."""
        if not joined:
            return
        key = self.keys.step_levels(worker)
        now_ms = int(time.time() * 1000)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(key, mapping={rid: f"{priority} {now_ms}" for rid, priority in joined.items()})
        pipe.expire(key, int(self._settings.batch_time_limit_s))
        pipe.execute()

    def requeue(self, request_id: str, token: str, worker: str) -> int:
        """Evict a running request of this claim from the worker's set and put it back in the queue, at the front
        of its level, its progress restarted (``requeue.lua``): 1 when requeued (the set's count and levels hash
        updated with it), 2 when it is flagged aborted (end it so), 0 when this claim no longer runs it."""
        keys = [
            self.keys.requests,
            self.keys.step_rows,
            self.keys.step_levels(worker),
            self.keys.events,
            self.keys.metrics,
            *self.keys.request_keys(request_id),
        ]
        return int(self._requeue(keys=keys, args=[token, worker, request_id, k.EVENTS_MAXLEN]))

    def leave(self, worker: str) -> None:
        pipe = self._redis.pipeline(transaction=False)
        self._leave(pipe, worker)
        pipe.execute()

    def _leave(self, pipe: redis.client.Pipeline, worker: str) -> None:
        pipe.zrem(self.keys.workers, worker)
        pipe.hdel(self.keys.capabilities, worker)
        pipe.hdel(self.keys.step_sets, worker)
        pipe.hdel(self.keys.step_rows, worker)
        pipe.delete(self.keys.step_open(worker))
