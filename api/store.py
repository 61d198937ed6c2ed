"""Async access to the request state in Redis, through the keys and Lua scripts of ``shared.keys``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import redis.asyncio as aioredis

from api.input_images import StoredInputs
from api.outage import REDIS_FAILURES, StoreUnavailable
from shared.contracts import RequestSpec, RequestState, RequestStatus, WorkerCapabilities
from shared.keys import ABORT, SUBMIT, RedisKeys
from shared.state import STATE_FIELDS, parse_state

_T = TypeVar("_T")
CAPABILITIES_TTL_S = 2.0  # how long the api trusts what it read of the workers' announcements


class RequestStore:
    """Submits, reads and aborts requests.

    ``redis`` decodes replies to ``str``; ``redis_binary`` returns ``bytes`` and is used for PNG images only.
    The scripts are registered here (no network); redis-py loads them on first use.

    Every call ends within ``call_timeout_s`` (waiting for a pooled connection, connecting and every round trip
    included) and raises ``StoreUnavailable`` when Redis fails or does not answer in time.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        redis_binary: aioredis.Redis,
        keys: RedisKeys,
        *,
        max_queue_len: int,
        result_ttl_s: int,
        call_timeout_s: float,
    ) -> None:
        self._redis = redis
        self._binary = redis_binary
        self._keys = keys
        self._max_queue_len = max_queue_len
        self._result_ttl_s = result_ttl_s
        self._call_timeout_s = call_timeout_s
        self._capabilities: tuple[float, list[WorkerCapabilities]] | None = None
        self._submit = redis.register_script(SUBMIT)
        self._abort = redis.register_script(ABORT)

    async def submit(
        self, specs: Sequence[RequestSpec], inputs: Sequence[StoredInputs | None] | None = None
    ) -> bool:
        """Queue all ``specs`` (with their input images, ``inputs[i]`` for ``specs[i]``) in one atomic step; False
        (nothing queued) when the queue would overflow."""
        keys = [self._keys.requests, *(self._keys.request(spec.id) for spec in specs)]
        args: list[str | bytes | int | float] = [self._max_queue_len]
        for spec, stored in zip(specs, inputs or [None] * len(specs), strict=True):
            image = stored.image if stored else b""
            mask = stored.mask if stored and stored.mask else b""
            args += [spec.id, spec.model_dump_json(), repr(spec.created_at), image, mask]
        accepted = await self._bounded(self._submit(keys=keys, args=args))
        return int(accepted) == 1

    async def get(self, request_id: str) -> RequestState | None:
        """The state of a request, or None when it is unknown (never submitted, or expired)."""
        values = await self._bounded(self._redis.hmget(self._keys.request(request_id), STATE_FIELDS))
        raw = {field: value for field, value in zip(STATE_FIELDS, values, strict=True) if value is not None}
        if "spec" not in raw or "status" not in raw:
            return None
        return parse_state({str(k): str(v) for k, v in raw.items()})

    async def image(self, request_id: str, index: int) -> bytes | None:
        """PNG bytes of image ``index`` of a request, or None while it does not exist."""
        data = await self._bounded(self._binary.get(self._keys.image(request_id, index)))
        if data is None:
            return None
        return data if isinstance(data, bytes) else data.encode()

    async def abort(self, request_id: str, now: float) -> RequestStatus | None:
        """Abort a request; the status after the call (see ``shared.keys.ABORT``), or None when unknown."""
        key = self._keys.request(request_id)
        args: list[str | int] = [repr(now), self._result_ttl_s, self._keys.finished, request_id]
        status = await self._bounded(self._abort(keys=[key, self._keys.requests], args=args))
        return RequestStatus(status) if status else None

    async def fleet_capabilities(self) -> list[WorkerCapabilities]:
        """What the live workers announce about their model (cached for ``CAPABILITIES_TTL_S``); empty while no
        worker is known (then nothing can be refused up front)."""
        now = asyncio.get_running_loop().time()
        if self._capabilities is None or now - self._capabilities[0] > CAPABILITIES_TTL_S:
            workers = [str(name) for name in await self._bounded(self._redis.zrange(self._keys.workers, 0, -1))]
            announced = await self._bounded(self._redis.hmget(self._keys.capabilities, workers)) if workers else []
            parsed = []
            for raw in announced:
                with contextlib.suppress(ValueError):  # absent or from another version: not counted
                    parsed.append(WorkerCapabilities.model_validate_json(raw or ""))
            self._capabilities = (now, parsed)
        return self._capabilities[1]

    async def ping(self) -> bool:
        """Whether Redis answers (within the call timeout)."""
        try:
            return bool(await self._bounded(self._redis.ping()))
        except StoreUnavailable:
            return False

    async def _bounded(self, call: Awaitable[_T]) -> _T:
        try:
            async with asyncio.timeout(self._call_timeout_s):
                return await call
        except REDIS_FAILURES as exc:
            raise StoreUnavailable(exc) from exc
