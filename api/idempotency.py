"""``Idempotency-Key``: a submission sent again with the same key is queued once (docs/api.md#idempotency-keys).

A client that lost the answer to a submission (its connection dropped, its call timed out, a 503 came after some
shards of a sharded fleet had queued their parts) sends the same body again with the same ``Idempotency-Key``
header: it gets the ids of the first submission (``Idempotent-Replayed: true``), and nothing is queued twice.

- **Scope**: per caller (API key name; one scope without API keys) and key, for ``idempotency_ttl_s`` (at most the
  requests' own ``result_ttl_s``) from the first call. Every submitting endpoint takes it: ``POST /v1/requests``,
  ``/v1/requests/batch``, ``/v1/images/generations``, ``/v1/images/edits``, ``/v1/videos``.
- **Same key, other body** (the bodies' fingerprint, ``fingerprint``): 422 naming the header; nothing queued.
- **Same key while its first call is still submitting**: 409 with ``Retry-After``. A call refused (429, 503 for a
  full queue, 413) releases the key, so the retry submits at once. A call that failed otherwise (Redis did not
  answer: its submission may have landed) or whose api process died keeps its claim for ``PENDING_S``: after that
  the next call with the key looks for the claimed ids, and answers them when all were queued, else submits afresh
  (a sharded submission whose api died between its shards' parts: those parts run, and the retry queues all rows).
- **Replayed ids that are gone** (deleted): 409, use a new key.
- **The OpenAI routes** wait for the request a replay answers; a call with a key that ends early (its client went
  away, its wait limit passed) leaves its request running, so that the retry waits for it (without a key such a
  call aborts it).

One record per key in Redis (``idempotency_claim.lua``, ``idempotency_settle.lua``; a sharded fleet's in its own
keys, ``HOME``): two more round trips for a first call that carries the header (a replay: the claim and one read
per id), none for one that does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from anyio import to_thread
from fastapi import Depends, Header, HTTPException, status
from fastapi.exceptions import RequestValidationError

from api.outage import StoreUnavailable
from api.shard_router import Store
from shared.contracts import RequestSpec
from shared.wire import GenerateRequest

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
PENDING_S = 30.0
"""How long a claimed key is its call's before a later call takes the call for dead (a submission's own Redis calls
are bounded far below this: ``redis_socket_timeout_s`` each)."""


KEY_PATTERN = rf"^[ -~]{{1,{MAX_KEY_LENGTH}}}$"
"""What a key may be: 1 to ``MAX_KEY_LENGTH`` printable ASCII characters (the header's schema, and ``parse_key``)."""


def parse_key(value: str | None) -> str | None:
    """The header's key, or None when absent; a 422 naming the header when it is not ``KEY_PATTERN`` (the OpenAI
    routes, which read their headers themselves; the native ones declare it, ``IdempotencyKeyDep``)."""
    if value is None:
        return None
    if re.fullmatch(KEY_PATTERN, value) is None:
        message = f"must be 1 to {MAX_KEY_LENGTH} printable ASCII characters"
        raise _header_error("string_pattern_mismatch", message, value[:MAX_KEY_LENGTH])
    return value


def _header_error(kind: str, message: str, value: str) -> RequestValidationError:
    """The 422 naming the header."""
    return RequestValidationError([{"type": kind, "loc": ("header", HEADER), "msg": message, "input": value}])


def fingerprint(requests: Sequence[GenerateRequest]) -> str:
    """What a key's calls must agree on: the digest of the submitted bodies as validated (defaults filled in)."""
    bodies = json.dumps([request.model_dump(mode="json") for request in requests], sort_keys=True)
    return hashlib.sha256(bodies.encode()).hexdigest()


def record_digest(caller: str | None, key: str) -> str:
    """The name of a key's record: its caller's scope and the key, hashed (any key text makes a short Redis key)."""
    return hashlib.sha256(f"{caller or ''}\n{key}".encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Replayed:
    """The key's submission was queued before: these are its requests."""

    specs: list[RequestSpec]


@dataclass(frozen=True, slots=True)
class Claim:
    """This call holds the key's record for ``request_ids``: it submits them, then ``done`` or ``release``."""

    store: Store
    digest: str
    request_ids: tuple[str, ...]

    async def done(self) -> None:
        """The requests were queued: later calls with the key answer them. Best effort: a record left pending is
        settled by the first call after ``PENDING_S`` (which finds the requests queued)."""
        with contextlib.suppress(StoreUnavailable):
            await self.store.settle_idempotency(self.digest, self.request_ids, "done")

    async def release(self) -> None:
        """Nothing was queued: the key may be used again at once. Best effort, as ``done``: after ``PENDING_S`` the
        next call finds nothing queued and submits."""
        with contextlib.suppress(StoreUnavailable):
            await self.store.settle_idempotency(self.digest, self.request_ids, "release")


def _in_progress(retry_after_s: float) -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_409_CONFLICT,
        detail=f"a submission with this {HEADER} is in progress; retry after it",
        headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))},
    )


async def _queued(store: Store, request_ids: Sequence[str], owner: str | None) -> list[RequestSpec] | None:
    """The specs of ``request_ids``, or None when any of them is unknown (never queued, deleted or expired)."""
    states = await asyncio.gather(*(store.get(request_id, owner) for request_id in request_ids))
    specs = [state.spec for state in states if state is not None]
    return specs if len(specs) == len(states) else None


async def begin(
    store: Store,
    key: str,
    caller: str | None,
    requests: Sequence[GenerateRequest],
    request_ids: Sequence[str],
    ttl_s: int,
) -> Claim | Replayed:
    """Claim ``key`` of ``caller`` for this submission of ``requests`` as ``request_ids``, or the earlier
    submission's specs to answer instead; raises the 422, 409 of the module's docstring."""
    digest, ids = record_digest(caller, key), tuple(request_ids)
    if any(request.image is not None for request in requests):  # megabytes to hash: off the event loop
        bodies = await to_thread.run_sync(fingerprint, requests)
    else:
        bodies = fingerprint(requests)
    claim = await store.claim_idempotency(digest, bodies, ids, ttl_s, int(PENDING_S * 1000))
    if claim.state == "conflict":
        message = "was used with another request body: send that body again, or use a new key"
        raise _header_error("value_error", message, key)
    if claim.state == "pending":
        raise _in_progress(claim.retry_after_s)
    if claim.state == "claimed":
        return Claim(store, digest, ids)
    earlier = claim.request_ids
    specs = await _queued(store, earlier, caller)
    if claim.state == "stale":  # its call died: were its requests queued?
        if specs is None:
            if await store.settle_idempotency(digest, earlier, "take", ids, ttl_s):
                return Claim(store, digest, ids)
            raise _in_progress(PENDING_S)  # another call took it over first
        await store.settle_idempotency(digest, earlier, "done")
    if specs is None:
        raise HTTPException(
            status_code=status.HTTP_409_CONFLICT,
            detail=f"the requests this {HEADER} queued are gone (deleted or expired): use a new key",
        )
    return Replayed(specs)


async def _key_of(
    idempotency_key: Annotated[
        str | None,
        Header(
            alias=HEADER,
            pattern=KEY_PATTERN,
            description="Queue this submission once: sent again with the same key and body, it answers the first "
            "one's ids; another body with the key is a 422 (docs/api.md#idempotency-keys).",
        ),
    ] = None,
) -> str | None:
    return idempotency_key


IdempotencyKeyDep = Annotated[str | None, Depends(_key_of)]
"""A route's ``Idempotency-Key`` header (``KEY_PATTERN``, checked by FastAPI)."""
