"""Redis stream replies in one shape: what XREAD and XREADGROUP answer, whatever the protocol.

redis-py answers XREAD and XREADGROUP as a list ``[[stream, entries], ...]`` under RESP2, as a dict
``{stream: [entries]}`` under RESP3, and as ``{stream: entries}`` with its unified replies
(``legacy_responses=False``); no reply (nothing new before the block ended) is ``None``, ``[]`` or ``{}``.
``by_stream`` makes each of them ``{stream: entries}``. An entry is ``(entry id, fields)``; the fields of an entry
deleted while pending in a group (XREADGROUP of the pending entries, from an id) are empty, or ``None`` (by the
redis-py version). XRANGE and XREVRANGE answer the entries alone, the same under every protocol.
"""

from __future__ import annotations

from typing import Any

ReplyEntry = tuple[str, dict[str, str] | None]
"""One entry of a stream reply: its id and its fields (empty or ``None`` for one deleted while pending)."""


def by_stream(reply: Any) -> dict[str, list[ReplyEntry]]:
    """An XREAD or XREADGROUP reply (RESP2, RESP3 or unified) as ``{stream: [(entry id, fields)]}``."""
    if not reply:
        return {}
    if isinstance(reply, dict):
        return {name: (msgs[0] if msgs and isinstance(msgs[0], list) else msgs) for name, msgs in reply.items()}
    return dict(reply)
