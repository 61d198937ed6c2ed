"""The Redis key table of docs/architecture.md#redis-key-layout and ``shared.keys.RedisKeys`` name the same keys:
every key a member spells has a row, and every row is a member's key, so neither can drift from the other."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from pathlib import Path

from shared.keys import RedisKeys

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
PLACEHOLDERS: dict[str, object] = {
    "request_id": "{id}",
    "batch_id": "{id}",
    "worker": "{worker}",
    "name": "{name}",
    "key": "{key}",
    "digest": "{digest}",
    "request_ids": ["{id}"],
}
"""The table's placeholder for each argument name of a ``RedisKeys`` method."""


def table_keys() -> list[str]:
    """The first column of the key table, in order."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## Redis key layout", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(P:[^`]+)` \|", section, flags=re.MULTILINE)


def member_keys() -> dict[str, str]:
    """Each ``RedisKeys`` member that spells one key name -> that name under prefix ``P``, its hash tag ``{P}``
    written ``P`` as the table does, placeholders for arguments (the members that group keys for a script,
    ``request_keys`` and the like, spell none of their own)."""
    keys = RedisKeys("P")
    out: dict[str, str] = {}
    for name in dir(RedisKeys):
        if name.startswith("_") or name in ("prefix", "tag"):
            continue
        value = getattr(keys, name)
        if callable(value):
            arguments = [PLACEHOLDERS[p] for p in inspect.signature(value).parameters]
            value = value(*arguments)
        if isinstance(value, str):
            assert value.startswith(f"{keys.tag}:"), f"{name} is not under the fleet's hash tag: {value}"
            out[name] = "P" + value.removeprefix(keys.tag)
    return out


def test_every_key_a_member_spells_has_a_row() -> None:
    rows = set(table_keys())
    missing = {name: key for name, key in member_keys().items() if key not in rows}
    assert missing == {}, f"RedisKeys members without a row in docs/architecture.md#redis-key-layout: {missing}"


def test_every_row_is_one_members_key() -> None:
    rows = table_keys()
    spelled = list(member_keys().values())
    assert sorted(rows) == sorted(set(rows)), "a key has two rows"
    assert [row for row in rows if row not in spelled] == [], "rows that no RedisKeys member spells"
    assert sorted(spelled) == sorted(set(spelled)), "two RedisKeys members spell the same key"


def test_the_key_groups_are_made_of_members_keys() -> None:
    keys, spelled = RedisKeys("P"), set(member_keys().values())

    def tabled(names: Iterable[str]) -> set[str]:
        return {"P" + name.removeprefix(keys.tag) for name in names}

    assert tabled(keys.request_keys("{id}")) <= spelled
    assert tabled(keys.end_keys) <= spelled
    assert keys.request_strides(["{id}", "{id}"]) == [*keys.request_keys("{id}")] * 2
