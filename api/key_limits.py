"""An API key's limits on what it submits (``shared.api_keys``: ``rate_per_s`` / ``burst``, ``max_queued``).

- **Rate**: a token bucket per key in Redis (``shared/lua/rate_limit.lua``, Redis server time), so it holds across
  any number of api processes. Each submitted request takes one token (a batch of k takes k, all or none); reads,
  aborts and deletes take none. Without tokens: 429, ``Retry-After`` = when they will be there.
- **Max queued**: the key's requests queued, scheduled or running, counted by ``submit.lua`` in the same atomic step
  that queues the new ones. Over it: 429, ``Retry-After`` ``RETRY_AFTER_S`` (when some finish is unknown).

Both are checked after the request was validated (a 422 costs nothing), the rate first: a submission refused for
max queued (or a full queue) has spent its tokens. A batch larger than the key's burst or max queued could never be
accepted: that is a 422 on ``requests`` instead (``batch_errors``).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import status

from api.auth import KeyRefused
from api.limits import ErrorDict, Loc
from api.outage import RETRY_AFTER_DOC, retry_after_headers
from api.shard_router import Store
from shared.api_keys import ApiKey
from shared.wire import ErrorMessage

KEY_LIMITED: dict[int | str, dict[str, Any]] = {
    429: {
        "model": ErrorMessage,
        "description": "(With API keys) the key's rate limit or max queued is reached, or the input images of "
        "unfinished requests fill max_queued_input_bytes (the detail names the field); nothing was queued. Retry "
        "after Retry-After seconds.",
        "headers": RETRY_AFTER_DOC,
    }
}
"""The 429 of the submitting routes, for their OpenAPI ``responses=``."""


def batch_errors(count: int, key: ApiKey | None, loc: Loc) -> list[ErrorDict]:
    """The 422 errors of a batch of ``count`` requests at ``loc`` that ``key`` could never submit at once."""
    if key is None:
        return []
    limits = [("burst", key.bucket_size), ("max_queued", key.max_queued)]
    return [
        {
            "type": "too_long",
            "loc": loc,
            "msg": f"at most {limit} requests at once for API key {key.name!r} (its {name}); submit fewer at a time",
            "input": None,
            "ctx": {"max_length": limit},
        }
        for name, limit in limits
        if limit is not None and count > limit
    ]


async def take_tokens(store: Store, key: ApiKey | None, cost: int) -> None:
    """Take ``cost`` tokens of ``key``'s rate limit, or raise its 429 (nothing taken). No key, no rate: no-op.
    ``cost`` is at most the key's burst (``batch_errors`` refuses more first)."""
    if key is None or key.rate_per_s is None:
        return
    burst = key.bucket_size or 1
    wait_s = await store.take_tokens(key.name, key.rate_per_s, burst, cost)
    if wait_s > 0:
        retry_after = max(1, math.ceil(wait_s))
        raise KeyRefused(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"rate limit of API key {key.name!r} reached ({key.rate_per_s:g} requests/s, burst {burst}); "
            f"retry after {retry_after} s",
            "rate_limit_exceeded",
            {"Retry-After": str(retry_after)},
        )


def max_queued_reached(key: ApiKey) -> KeyRefused:
    """The 429 of a submission that would take ``key`` over its max queued."""
    return KeyRefused(
        status.HTTP_429_TOO_MANY_REQUESTS,
        f"API key {key.name!r} has its max_queued ({key.max_queued}) requests queued, scheduled or running; retry "
        "when some have finished",
        "max_queued_exceeded",
        retry_after_headers(),
    )
