"""Positions in request event streams as the api serves them: the SSE ``id`` of an event, ``Last-Event-ID``.

A position is an entry id of the request's event stream (``<ms>-<seq>``; the events themselves are
``shared.events``). The stream of several requests (``GET /v1/events?ids=a,b,c``) sends the same events; its SSE
``id`` is the position of every request, in the order of ``ids``, comma separated, empty for a request with no event
sent yet (``1718000000000-0,,1718000000123-1``): ``Last-Event-ID`` then resumes each request where it was.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

START = "0"
"""The position before a stream's first entry: read from the start."""
_POSITION = re.compile(r"\d{1,20}(-\d{1,20})?")


def position_key(position: str) -> tuple[int, int]:
    """An entry id as numbers, for ordering entries of several streams (``START`` first)."""
    ms, _, seq = position.partition("-")
    return int(ms), int(seq or 0)


def parse_position(value: str) -> str:
    """A position given back by a client (``Last-Event-ID``): an entry id, or ``START`` for ``""``.

    ``ValueError`` when it is not an entry id (``<ms>`` or ``<ms>-<seq>``, decimal)."""
    value = value.strip()
    if not value:
        return START
    if not _POSITION.fullmatch(value):
        raise ValueError(f"not an event id: {value[:40]!r} (an event id is <ms>-<seq>)")
    return value


def parse_positions(value: str | None, count: int) -> list[str]:
    """The per-request positions of a multi-request stream's ``Last-Event-ID`` (``format_positions``), one per
    watched id; all ``START`` without one. ``ValueError`` when it does not hold ``count`` positions."""
    if value is None or not value.strip():
        return [START] * count
    parts = value.split(",")
    if len(parts) != count:
        raise ValueError(f"holds {len(parts)} positions for {count} ids: reconnect with the same ids, in order")
    return [parse_position(part) for part in parts]


def format_positions(positions: Sequence[str]) -> str:
    """The SSE id of a multi-request stream's event: every request's position, comma separated, in ``ids`` order
    (empty for a request with no event sent yet)."""
    return ",".join("" if position == START else position for position in positions)


def unique_ids(values: Sequence[str]) -> list[str]:
    """The request ids of ``?ids=`` (comma separated, and/or repeated), blanks and repeats dropped, in order."""
    ids: dict[str, None] = {}
    for value in values:
        for part in value.split(","):
            if part.strip():
                ids[part.strip()] = None
    return list(ids)
