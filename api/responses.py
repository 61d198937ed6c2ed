"""The error answers of the routes, for their OpenAPI ``responses=`` (422 is FastAPI's own).

Each names the ``ErrorMessage`` body (``{"detail": "..."}``) the API sends, so the schema states every status
code a route can answer and what comes with it.
"""

from __future__ import annotations

from typing import Any

from api.outage import RETRY_AFTER_DOC
from shared.wire import ErrorMessage

Responses = dict[int | str, dict[str, Any]]

NOT_FOUND: Responses = {
    404: {"model": ErrorMessage, "description": "Unknown request id (never submitted, or expired)."}
}

UNAVAILABLE: Responses = {
    503: {
        "model": ErrorMessage,
        "description": "Redis is down, stalled or still loading; retry after Retry-After seconds.",
        "headers": RETRY_AFTER_DOC,
    }
}

QUEUE_FULL_OR_UNAVAILABLE: Responses = {
    503: {
        "model": ErrorMessage,
        "description": "The queue is full (nothing was queued), or Redis is down, stalled or still loading; retry "
        "after Retry-After seconds.",
        "headers": RETRY_AFTER_DOC,
    }
}

BAD_BODY: Responses = {
    400: {"model": ErrorMessage, "description": "The body could not be decoded (not UTF-8 JSON, number too long)."},
    413: {
        "model": ErrorMessage,
        "description": "The body is larger than this server's max_body_bytes, or its input images, as stored, exceed "
        "max_queued_input_bytes (the detail names the field).",
    },
}
