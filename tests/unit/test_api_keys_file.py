"""API keys without HTTP: the keys file (parsing, hashing, errors naming the entry), its reload on change, the
``fusefleet keys new`` command, and the two Lua scripts behind a key's limits on fakeredis (the token bucket of
``rate_limit.lua``, the max queued of ``submit.lua``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import fakeredis
import pytest
from typer.testing import CliRunner

from api.auth import RELOAD_CHECK_S, KeysWatcher, bearer_token
from fusefleet.cli import cli
from shared import keys as k
from shared.api_keys import ApiKey, KeysFileError, key_table, load_keys, new_token, parse_keys, token_hash
from tests.unit.test_scripts import submit as submit_requests

A_TOKEN, B_TOKEN = "ff_token-of-alice", "ff_token-of-bob"
FILE = f"""
[keys.alice]
sha256 = "{token_hash(A_TOKEN)}"
rate_per_s = 0.5
max_queued = 3

[keys.bob]
sha256 = "{token_hash(B_TOKEN)}"
rate_per_s = 2.5
burst = 10
"""


# --- the file --------------------------------------------------------------------------------------------------


def test_a_file_names_its_keys_and_their_limits() -> None:
    ring = parse_keys(FILE)
    alice, bob = ring.keys
    assert (alice.name, alice.rate_per_s, alice.bucket_size, alice.max_queued) == ("alice", 0.5, 1, 3)
    assert (bob.name, bob.rate_per_s, bob.bucket_size, bob.max_queued) == ("bob", 2.5, 10, None)
    assert ring.find(A_TOKEN) == alice and ring.find(B_TOKEN) == bob
    assert ring.find("ff_token-of-nobody") is None and ring.find("") is None
    assert ring.find(token_hash(A_TOKEN)) is None  # the hash is not a token


def test_the_hash_is_the_sha256_of_the_token() -> None:
    assert token_hash("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_an_empty_file_has_no_keys() -> None:
    assert parse_keys("").keys == ()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[keys.alice]\nsha256 = "abc"', "keys.alice.sha256"),
        (f'[keys.alice]\nsha256 = "{token_hash("x").upper()}"', "keys.alice.sha256"),
        (f'[keys.alice]\nsha256 = "{token_hash("x")}"\nrate_per_s = 0', "keys.alice.rate_per_s"),
        (f'[keys.alice]\nsha256 = "{token_hash("x")}"\nburst = 5', "burst needs rate_per_s"),
        (f'[keys.alice]\nsha256 = "{token_hash("x")}"\nmax_queued = -1', "keys.alice.max_queued"),
        (f'[keys.alice]\nsha256 = "{token_hash("x")}"\nrate = 5', "keys.alice.rate"),
        (f'[keys."a b"]\nsha256 = "{token_hash("x")}"', "keys.a b"),
        ("[keys.alice]\nrate_per_s = 1", "keys.alice.sha256"),
        (f'[key.alice]\nsha256 = "{token_hash("x")}"', "key"),
        (f'[keys.a]\nsha256 = "{token_hash("x")}"\n[keys.b]\nsha256 = "{token_hash("x")}"', "keys.a and keys.b"),
        ("[keys.alice\n", "not valid TOML"),
    ],
)
def test_an_invalid_file_is_refused_naming_the_entry(text: str, named: str) -> None:
    with pytest.raises(KeysFileError) as refused:
        parse_keys(text, "keys.toml")
    assert "keys.toml" in str(refused.value) and named in str(refused.value)


def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeysFileError, match="cannot read"):
        load_keys(tmp_path / "missing.toml")


def test_a_table_reads_back_as_the_same_key() -> None:
    key = ApiKey(name="carol", sha256=token_hash("t"), rate_per_s=0.25, burst=4, max_queued=7)
    assert parse_keys(key_table(key)).keys == (key,)
    bare = ApiKey(name="dave", sha256=token_hash("u"))
    assert parse_keys(key_table(key) + key_table(bare)).keys == (key, bare)


def test_new_tokens_are_long_random_and_marked() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(token.startswith("ff_") and len(token) >= 43 for token in tokens)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer   abc ", "abc"),
        ("BEARER abc", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("abc", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


# --- reloading -------------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _rewrite(path: Path, text: str) -> None:
    """Write ``text`` and make sure the change is visible in the file's stat (mtime granularity)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def test_a_changed_file_is_read_again_and_a_broken_one_keeps_the_old_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(FILE)
    clock = Clock()
    watcher = KeysWatcher(path, clock)
    assert [key.name for key in watcher.current().keys] == ["alice", "bob"]

    carol = ApiKey(name="carol", sha256=token_hash("c"))
    _rewrite(path, key_table(carol))  # alice and bob revoked, carol added
    clock.now += RELOAD_CHECK_S / 2
    assert [key.name for key in watcher.current().keys] == ["alice", "bob"]  # not looked at yet
    clock.now += RELOAD_CHECK_S / 2
    assert [key.name for key in watcher.current().keys] == ["carol"]
    assert watcher.current().find(A_TOKEN) is None

    _rewrite(path, "[keys.carol\n")  # a half-written file
    clock.now += RELOAD_CHECK_S
    assert [key.name for key in watcher.current().keys] == ["carol"]
    path.unlink()
    clock.now += RELOAD_CHECK_S
    assert [key.name for key in watcher.current().keys] == ["carol"]
    _rewrite(path, FILE)
    clock.now += RELOAD_CHECK_S
    assert [key.name for key in watcher.current().keys] == ["alice", "bob"]


def test_an_invalid_file_stops_the_watcher_at_start(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text("[keys.alice]\n")
    with pytest.raises(KeysFileError, match="sha256"):
        KeysWatcher(path)


# --- fusefleet keys new ----------------------------------------------------------------------------------------


def test_keys_new_prints_the_token_once_and_the_table_to_add() -> None:
    result = CliRunner().invoke(cli, ["keys", "new", "alice", "--rate-per-s", "2", "--max-queued", "5"])
    assert result.exit_code == 0, result.output
    token, *table = result.stdout.splitlines()
    (key,) = parse_keys("\n".join(table)).keys
    assert (key.name, key.rate_per_s, key.burst, key.max_queued) == ("alice", 2.0, None, 5)
    assert parse_keys("\n".join(table)).find(token) == key
    assert token not in "\n".join(table)


def test_keys_new_adds_to_a_file_and_refuses_a_name_twice(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    runner = CliRunner()
    tokens = []
    for name in ("alice", "bob"):
        result = runner.invoke(cli, ["keys", "new", name, "--file", str(path)])
        assert result.exit_code == 0, result.output
        tokens.append(result.stdout.strip())
    ring = load_keys(path)
    found = [ring.find(token) for token in tokens]
    assert [key.name if key else None for key in found] == ["alice", "bob"]
    again = runner.invoke(cli, ["keys", "new", "alice", "--file", str(path)])
    assert again.exit_code == 2 and "already has a key named 'alice'" in again.stderr
    assert load_keys(path).keys == ring.keys


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bad name"], "name"),
        (["alice", "--burst", "3"], "burst needs rate_per_s"),
        (["alice", "--rate-per-s", "0"], "rate_per_s"),
    ],
)
def test_keys_new_refuses_a_bad_name_or_limit(argv: list[str], says: str) -> None:
    result = CliRunner().invoke(cli, ["keys", "new", *argv])
    assert result.exit_code == 2 and says in result.stderr and not result.stdout


# --- the Lua scripts on fakeredis ------------------------------------------------------------------------------


def take(client: fakeredis.FakeRedis, name: str, rate: float, burst: int, cost: int = 1) -> int:
    """``rate_limit.lua``: 0 when taken, else the ms to wait."""
    bucket = k.RedisKeys("t").api_key_bucket(name)
    return int(client.register_script(k.RATE_LIMIT)(keys=[bucket], args=[repr(rate), burst, cost]))


def test_the_bucket_lets_a_burst_through_then_says_when_to_come_back(client: fakeredis.FakeRedis) -> None:
    assert [take(client, "alice", 1.0, 3) for _ in range(3)] == [0, 0, 0]
    wait_ms = take(client, "alice", 1.0, 3)
    assert 900 <= wait_ms <= 1000  # one token refills in a second (a few ms passed meanwhile)
    assert 2900 <= take(client, "alice", 1.0, 3, cost=3) <= 3000  # nothing was taken by the refusals
    assert take(client, "bob", 1.0, 3, cost=3) == 0  # each key its own bucket
    ttl_ms = client.pttl(k.RedisKeys("t").api_key_bucket("alice"))
    assert 3000 < ttl_ms <= 4000  # until it would be full again, plus a second


def test_the_bucket_refills_at_its_rate(client: fakeredis.FakeRedis) -> None:
    assert take(client, "alice", 4.0, 2, cost=2) == 0
    assert 200 <= take(client, "alice", 4.0, 2) <= 250
    time.sleep(0.3)  # 4 tokens/s: one is back after 250 ms
    assert take(client, "alice", 4.0, 2) == 0
    assert take(client, "alice", 4.0, 2) > 0


def test_the_bucket_never_holds_more_than_its_burst(client: fakeredis.FakeRedis) -> None:
    assert take(client, "alice", 20.0, 2, cost=2) == 0
    time.sleep(0.5)  # 10 tokens' worth of time
    assert take(client, "alice", 20.0, 2, cost=2) == 0
    assert take(client, "alice", 20.0, 2, cost=2) > 0  # 2 were there, not 10


def submit(client: fakeredis.FakeRedis, *ids: str, key: str = "", max_queued: int = 0) -> int:
    """``submit.lua`` with an API key (``max_queued`` 0: the key has none)."""
    return submit_requests(client, k.RedisKeys("t"), *ids, key=key, max_queued=max_queued)


def test_submit_records_the_key_and_counts_only_its_unfinished_requests(client: fakeredis.FakeRedis) -> None:
    keys = k.RedisKeys("t")
    assert submit(client, "a1", "a2", key="alice", max_queued=3) == 1
    assert submit(client, "b1", "b2", "b3", key="bob", max_queued=3) == 1  # another key's count
    assert submit(client, "a3", "a4", key="alice", max_queued=3) == -1  # 2 + 2 > 3: all or none
    assert not client.exists(keys.request("a3")) and client.xlen(keys.requests) == 5
    assert client.hget(keys.request("a1"), "key") == "alice"
    client.hset(keys.request("a1"), "status", "running")
    client.hset(keys.request("a2"), "status", "succeeded")  # finished: no longer counted
    assert submit(client, "a3", "a4", key="alice", max_queued=3) == 1
    client.delete(keys.request("a3"))  # expired or deleted: not counted
    assert submit(client, "a5", key="alice", max_queued=3) == 1
    assert client.smembers(keys.api_key_unfinished("alice")) == {keys.request(r) for r in ("a1", "a4", "a5")}
    assert 0 < client.ttl(keys.api_key_unfinished("alice")) <= 60


def test_submit_without_a_max_queued_keeps_no_count(client: fakeredis.FakeRedis) -> None:
    keys = k.RedisKeys("t")
    assert submit(client, "a1", key="alice") == 1
    assert client.hget(keys.request("a1"), "key") == "alice"
    assert submit(client, "n1") == 1
    assert client.hget(keys.request("n1"), "key") is None
    assert not client.keys(f"{keys.tag}:apikey:*")


def test_a_key_has_a_share_in_the_fair_order_default_1() -> None:
    alice, bob = parse_keys(FILE.replace("max_queued = 3\n", "max_queued = 3\nshare = 2.5\n")).keys
    assert (alice.share, bob.share) == (2.5, 1.0)
    with pytest.raises(KeysFileError, match="share"):
        parse_keys(FILE.replace("max_queued = 3\n", "share = 0\n"))
