"""The Lua scripts of ``shared/lua`` say each fact once: no status name is spelled as a literal (the generated
``STATUS``/``TERMINAL`` of ``shared.keys`` are), no key name is built inside a script (every key comes in ``KEYS``),
every script's header names its ``KEYS``, ``ARGV`` and reply, and the generated key groups match ``RedisKeys``."""

from __future__ import annotations

import re
from importlib.resources import files

import fakeredis
import pytest

from shared import keys as k
from shared.contracts import RequestStatus

FOLDER = files("shared").joinpath("lua")
SOURCES = {path.name: path.read_text(encoding="utf-8") for path in FOLDER.iterdir() if path.name.endswith(".lua")}
SCRIPTS = sorted(name for name in SOURCES if not name.startswith("lib_"))
ALLOWED_LITERALS = {("webhook_outcome.lua", "failed")}
"""Status names spelled for something else: a webhook delivery's outcome ``failed`` is no request status."""
DERIVED_KEY = [
    re.compile(r"string\.(match|sub|gsub)\(\s*KEYS"),  # a key name read out of another key
    re.compile(r"\.\.\s*'[a-z_]*:"),  # a suffix such as ``.. ':events'`` or ``.. ':req:' ..`` glued to a name
    re.compile(r"'[^' ]*:(req|batch|events|metrics|webhooks|inputs|scheduler|step|lock)[^' ]*'"),
]


def code(source: str) -> str:
    """The source without its comments (a header may name keys and statuses)."""
    return "\n".join(line.split("--", 1)[0] for line in source.splitlines())


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_no_status_name_is_spelled(name: str) -> None:
    spelled = [
        status.value
        for status in RequestStatus
        if re.search(rf"['\"]{status.value}['\"]", code(SOURCES[name])) and (name, status.value) not in ALLOWED_LITERALS
    ]
    assert spelled == [], f"{name} spells status names: use STATUS.<name> or TERMINAL[...] (shared.keys._generated)"


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_no_key_is_derived(name: str) -> None:
    found = [pattern.pattern for pattern in DERIVED_KEY if pattern.search(code(SOURCES[name]))]
    assert found == [], f"{name} builds a key name: pass it in KEYS instead"
    assert "prefix" not in code(SOURCES[name]), f"{name} builds a key name from a prefix: pass it in KEYS"


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_header_is_its_legend(name: str) -> None:
    """A header comment (what it does, every KEYS and ARGV slot, the reply), then the slots' local names up to the
    first blank line; past it, no slot is read by its number."""
    source = SOURCES[name]
    top, _, body = source.partition("\n\n")
    header = "\n".join(line for line in top.splitlines() if line.startswith("--"))
    assert source.startswith("--") and "Returns" in header, f"{name} must open with its header and say its reply"
    for table in ("KEYS", "ARGV"):
        if table in code(source):
            assert f"{table}[" in header, f"{name}'s header names its {table} slots"
        assert not re.search(rf"{table}\[\d+\]", code(body)), f"{name}: give {table} slots local names at the top"


def test_time_is_read_by_the_one_helper() -> None:
    readers = sorted(name for name, source in SOURCES.items() if "'TIME'" in code(source))
    assert readers == ["lib_time.lua"]


def test_the_generated_preamble_matches_the_python_that_owns_each_fact() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = k.RedisKeys("t")
    probe = client.register_script(
        k._generated()
        + "\nlocal r, e = request_at(4, 2), end_keys(1)"
        + "\nlocal terminal = {}"
        + "\nfor status in pairs(TERMINAL) do table.insert(terminal, status) end"
        + "\ntable.sort(terminal)"
        + "\nreturn {r.hash, r.events, r.packed, e.metrics, e.webhooks, e.inputs, request_count(4),"
        + " STATUS.queued, STATUS.running, table.concat(terminal, ' ')}"
    )
    reply = probe(keys=[*keys.end_keys, "x", *keys.request_strides(["a", "b"])], args=[])
    assert reply[:3] == list(keys.request_keys("b"))
    assert reply[3:6] == list(keys.end_keys)
    assert reply[6:] == [2, "queued", "running", "aborted failed succeeded"]
    assert len(k.RequestKeys._fields) == 3  # lib_end_request.lua names each: hash, events, packed
