"""The input budget: bytes of input images that unfinished requests may hold in Redis (``max_queued_input_bytes``).

An image-conditioned request keeps its input image and mask in its hash from submission until it ends
(``api.input_images``); ``max_queue_len`` counts requests, not bytes. ``submit.lua`` adds the bytes a submission
stores to ``P:inputs:bytes`` in the atomic step that queues it, refusing it as a whole when they would take the
count past the budget; every script that ends a request (succeeded, failed, aborted, timed out, lost) takes its
bytes off again through one function (``lib_drop_inputs.lua``, which takes off the share ``submit.lua`` recorded in
the hash, once), so the count is exact on every path. A submission refused here is:

- **413** when its own inputs exceed the whole budget: it could never be accepted;
- **429** with ``Retry-After`` when the inputs of unfinished requests leave no room now: room frees as they end.

Both queue nothing and name the field (``loc`` of the first request with an input image, as a 422 would): the native
``detail`` is ``"<loc joined by dots>: <message>"`` (``{"detail": str}``, as every error but 422), the OpenAI answer's
``param`` is that field (``api.openai.errors``).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import HTTPException, status

from api.input_images import StoredInputs
from api.limits import Loc
from api.outage import retry_after_headers

TOO_LARGE = "input_bytes_too_large"
BUDGET_FULL = "input_budget_exceeded"


class InputsRefused(HTTPException):
    """A submission refused for the input budget: 413 or 429 (``code``), naming the field at ``loc``."""

    def __init__(self, status_code: int, code: str, loc: Loc, message: str, headers: dict[str, str] | None = None):
        super().__init__(status_code, detail=f"{'.'.join(map(str, loc))}: {message}", headers=headers)
        self.code = code
        self.loc = loc
        self.message = message


def stored_bytes(inputs: Sequence[StoredInputs | None]) -> int:
    """Bytes a submission's inputs hold in Redis once queued (what ``submit.lua`` counts)."""
    return sum(stored.size for stored in inputs if stored is not None)


def _first_loc(inputs: Sequence[StoredInputs | None], locs: Sequence[Loc]) -> Loc:
    """Where a budget refusal points: ``image`` of the first request that carries one."""
    return next((*loc, "image") for stored, loc in zip(inputs, locs, strict=True) if stored is not None)


def too_large(inputs: Sequence[StoredInputs | None], locs: Sequence[Loc], budget: int) -> InputsRefused | None:
    """The 413 of a submission whose inputs alone exceed ``budget``; None when they fit in it."""
    held = stored_bytes(inputs)
    if held <= budget:
        return None
    return InputsRefused(
        status.HTTP_413_CONTENT_TOO_LARGE,
        TOO_LARGE,
        _first_loc(inputs, locs),
        f"the input images of this submission take {held} bytes as stored; this server's max_queued_input_bytes "
        f"is {budget}: send smaller images (or fewer at once)",
    )


def budget_full(inputs: Sequence[StoredInputs | None], locs: Sequence[Loc], budget: int) -> InputsRefused:
    """The 429 of a submission whose inputs (``stored_bytes``) do not fit beside those of unfinished requests."""
    return InputsRefused(
        status.HTTP_429_TOO_MANY_REQUESTS,
        BUDGET_FULL,
        _first_loc(inputs, locs),
        f"the input images of unfinished requests leave no room for this submission's {stored_bytes(inputs)} "
        f"bytes (max_queued_input_bytes {budget}); retry when some have finished",
        retry_after_headers(),
    )
