"""The arguments of ``submit.lua`` (``shared.keys.SUBMIT``): the one place that lays them out.

A call carries one or more groups: a group is one submission (the specs of one HTTP request, under one API key),
accepted or refused as a whole; groups are independent (``api.coalescer`` puts an api process's concurrent
submissions in one call). The script returns one outcome per group (``SUBMIT_OUTCOMES``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from shared.keys import RedisKeys

SubmitOutcome = Literal["accepted", "queue_full", "max_queued", "input_budget"]
"""What one group's submission came to: queued, or nothing because the queue, the key or the input budget is full."""
SUBMIT_OUTCOMES: dict[int, SubmitOutcome] = {1: "accepted", 0: "queue_full", -1: "max_queued", -2: "input_budget"}


@dataclass(frozen=True, slots=True)
class SubmitRow:
    """One request of a group: its id, spec (JSON), creation time, input images and webhook ('' where none)."""

    request_id: str
    spec_json: str
    created_at: float
    image: bytes = b""
    mask: bytes = b""
    webhook_url: str = ""
    webhook_on: str = ""  # the stream events the webhook subscribes to (shared/webhooks.py)

    @property
    def input_bytes(self) -> int:
        return len(self.image) + len(self.mask)


@dataclass(frozen=True, slots=True)
class SubmitGroup:
    """One submission: its rows under API key ``key_name`` ('' = none), with the key's max queued (None: none) and
    share of the fair order (1: the default)."""

    rows: tuple[SubmitRow, ...]
    key_name: str = ""
    max_queued: int | None = None
    share: float = 1.0

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("a submission group needs at least one row")


def submit_call(
    keys: RedisKeys, groups: Sequence[SubmitGroup], *, max_queue_len: int, set_ttl_s: int, max_input_bytes: int | None
) -> tuple[list[str], list[str | bytes | int]]:
    """``(KEYS, ARGV)`` of one ``submit.lua`` call of ``groups`` (see the script for the layout); ``max_input_bytes``
    None: input bytes are counted, not limited."""
    call_keys: list[str] = [keys.requests, keys.input_bytes]
    args: list[str | bytes | int] = [max_queue_len, set_ttl_s, "" if max_input_bytes is None else max_input_bytes]
    for group in groups:
        call_keys += [keys.api_key_unfinished(group.key_name), *keys.request_strides(r.request_id for r in group.rows)]
        limited = group.max_queued is not None
        share = "" if group.share == 1 else repr(group.share)
        args += [group.key_name, "1" if limited else "", group.max_queued or 0, share, len(group.rows)]
        for row in group.rows:
            args += [row.request_id, row.spec_json, repr(row.created_at), row.image, row.mask]
            args += [row.webhook_url, row.webhook_on]
    return call_keys, args


def submit_outcomes(reply: Sequence[int | str]) -> list[SubmitOutcome]:
    """The script's reply: one outcome per group, in call order."""
    return [SUBMIT_OUTCOMES[int(value)] for value in reply]
