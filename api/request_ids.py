"""Request ids: checked at the edge, before any Redis call (``RequestIdDep``).

An id is ``ID_BYTES`` random bytes in lower-case hex, made by ``shared.shards.Shards.new_request_id`` (in a sharded
fleet its first digits are its shard's mark: an id of no shard of the fleet is answered as unknown by
``api.shard_router``, also without a Redis call). Every route that takes one (``/v1/requests/{request_id}...``,
``GET /v1/events?ids=``) answers an id of another shape exactly as an unknown one, 404, without asking Redis: an id
is part of Redis key names (``shared.keys``), so ``<id>:events`` would otherwise reach another key of a request
(a WRONGTYPE error, a 503), telling a caller that the request exists whoever submitted it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated

from fastapi import Depends, HTTPException, Path, status

from shared.shards import ID_BYTES

ID_PATTERN = f"^[0-9a-f]{{{2 * ID_BYTES}}}$"
"""The shape of every id ``Shards.new_request_id`` makes (the OpenAPI document states it)."""
_ID = re.compile(ID_PATTERN)
_SHOWN_CHARS = 40
"""Most characters of a refused id that an answer echoes."""


def is_request_id(value: str) -> bool:
    """Whether ``value`` has the shape of a request id (it may still be unknown, or name no shard of the fleet)."""
    return _ID.fullmatch(value) is not None


def unknown_requests(request_ids: Sequence[str]) -> HTTPException:
    """The 404 of ids that name no request the caller may see: unknown, expired, another key's, or malformed."""
    names = ", ".join(repr(request_id[:_SHOWN_CHARS]) for request_id in request_ids)
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no request {names} (unknown or expired)")


def request_id_path(
    request_id: Annotated[
        str, Path(description="The request's id, as submitting it answered.", json_schema_extra={"pattern": ID_PATTERN})
    ],
) -> str:
    """The ``{request_id}`` of a route's path; the 404 of an unknown id when it has not the shape of one."""
    if not is_request_id(request_id):
        raise unknown_requests([request_id])
    return request_id


RequestIdDep = Annotated[str, Depends(request_id_path)]
"""A route's ``request_id`` parameter: a well-shaped id (else 404, before the route or Redis runs)."""
