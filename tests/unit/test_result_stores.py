"""One conformance suite for the three result stores: Redis (fakeredis with the real Lua scripts), a folder, and
S3 against a real S3-protocol HTTP server (moto's server mode on a free port). Then what only one backend does:
the Redis store's size cap, the filesystem store's atomic writes and folder cleanup, and S3's presigned URLs,
delete paging and bounded failures.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args

import fakeredis
import httpx
import pytest
from fakeredis.commands_mixins import server_mixin
from moto.server import ThreadedMotoServer

from shared.keys import RedisKeys
from shared.results import ResultStore, ResultStoreError, ResultStoreTimeout, build_result_store, redis_store
from shared.results.deadline import MAX_CALLS, DeadlineStore
from shared.results.factory import BUILDERS
from shared.results.filesystem import FilesystemResultStore
from shared.results.redis_store import CANDIDATE_PAGE, PUT_TRIES, RedisResultStore
from shared.results.s3 import DELETE_PAGE, S3ResultStore, build_s3_client
from shared.settings import ResultStoreName, Settings
from tests.support.redis_server import free_port
from tests.support.trickle_server import trickle_server

PREFIX = "t"
S3_PREFIX = "fusefleet/"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4  # not valid UTF-8: bytes must come back untouched
BAD_KEYS = ["../x", "a/b", "a/b/0.gif", "../../etc/passwd.png", "a/b/../0.png", "a/b/0.png/", ""]


@dataclass
class Backend:
    """A store under test and a view of what its backend really holds (read around the store)."""

    store: ResultStore
    stored: Callable[[], set[str]]
    """The result keys whose objects the backend holds now."""


@dataclass
class S3Server:
    endpoint_url: str

    def client(self, timeout_s: float = 5) -> Any:
        return build_s3_client(endpoint_url=self.endpoint_url, region="us-east-1", timeout_s=timeout_s, path_style=True)


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on a free port for this module, with dummy credentials (nothing leaves the machine)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "fusefleet-test")
        env.setenv("AWS_SECRET_ACCESS_KEY", "fusefleet-test-secret")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL"):
            env.delenv(name, raising=False)
        port = free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        try:
            yield S3Server(f"http://127.0.0.1:{port}")
        finally:
            server.stop()


def redis_backend() -> tuple[Backend, fakeredis.FakeRedis, RedisResultStore]:
    client = fakeredis.FakeRedis(decode_responses=False)
    store = RedisResultStore(client, RedisKeys(PREFIX), max_bytes=10_000_000, keep_s=60)
    return Backend(store, lambda: backend_keys(client)), client, store


def filesystem_backend(root: Path) -> Backend:
    def stored() -> set[str]:  # every file, a stray temporary one included
        return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()}

    return Backend(FilesystemResultStore(root), stored)


def s3_backend(server: S3Server) -> tuple[Backend, Any, str]:
    client = server.client()
    bucket = f"results-{uuid.uuid4().hex[:12]}"  # one bucket per test: nothing leaks between tests
    client.create_bucket(Bucket=bucket)

    def stored() -> set[str]:
        keys: set[str] = set()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                assert item["Key"].startswith(S3_PREFIX), item["Key"]
                keys.add(item["Key"][len(S3_PREFIX) :])
        return keys

    return Backend(S3ResultStore(client, bucket, prefix=S3_PREFIX, url_ttl_s=300), stored), client, bucket


@pytest.fixture(params=["redis", "filesystem", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "redis":
        return redis_backend()[0]
    if request.param == "filesystem":
        return filesystem_backend(tmp_path / "results")
    return s3_backend(request.getfixturevalue("s3_server"))[0]


# --- the conformance suite: every backend --------------------------------------------------------------------------


def test_put_then_get_returns_the_bytes(backend: Backend) -> None:
    backend.store.put("req1/tok1/0.png", PNG)
    backend.store.put("req1/tok1/1.webp", b"webp bytes")
    assert backend.store.get("req1/tok1/0.png") == PNG
    assert backend.store.get("req1/tok1/1.webp") == b"webp bytes"
    assert backend.stored() == {"req1/tok1/0.png", "req1/tok1/1.webp"}
    backend.store.put("req1/tok1/0.png", b"second write")  # a retried write replaces the object
    assert backend.store.get("req1/tok1/0.png") == b"second write"


def test_put_many_stores_every_object_and_a_retried_batch_replaces_them(backend: Backend) -> None:
    batch = [("req1/tok1/0.png", PNG), ("req2/tok1/0.webp", b"webp bytes"), ("req2/tok1/1.jpeg", b"jpeg bytes")]
    assert backend.store.put_many(batch) == {}
    assert backend.stored() == {key for key, _ in batch}
    assert [backend.store.get(key) for key, _ in batch] == [data for _, data in batch]
    assert backend.store.put_many([("req1/tok1/0.png", b"second write"), *batch[1:]]) == {}  # a retried finish
    assert backend.store.get("req1/tok1/0.png") == b"second write" and backend.stored() == {key for key, _ in batch}
    with pytest.raises(ValueError, match="not a result-store key"):
        backend.store.put_many([("req3/tok1/0.png", PNG), ("../x", PNG)])  # every key checked before a write
    assert backend.store.get("req3/tok1/0.png") is None


def test_get_of_a_missing_key_is_none(backend: Backend) -> None:
    assert backend.store.get("req1/tok1/0.png") is None
    backend.store.put("req1/tok1/0.png", PNG)
    assert backend.store.get("req1/tok1/1.png") is None
    assert backend.store.get("req1/tok2/0.png") is None
    assert backend.store.get("req1/tok1/0.jpeg") is None  # the format is part of the key


def test_delete_removes_and_missing_keys_are_fine(backend: Backend) -> None:
    keep, gone = "req1/tok1/0.png", ["req1/tok1/1.png", "req2/tok9/0.jpeg"]
    for key in [keep, *gone]:
        backend.store.put(key, PNG)
    backend.store.delete([*gone, "req3/tok3/0.png"])  # one never stored
    assert backend.store.get(gone[0]) is None and backend.store.get(gone[1]) is None
    assert backend.store.get(keep) == PNG
    assert backend.stored() == {keep}
    backend.store.delete(gone)  # again: already gone
    backend.store.delete([])
    assert backend.stored() == {keep}


def test_delete_of_more_keys_than_one_s3_page(backend: Backend) -> None:
    keys = [f"req1/tok1/{index}.png" for index in range(DELETE_PAGE + 500)]
    written = [keys[i] for i in (0, 1, DELETE_PAGE - 1, DELETE_PAGE, DELETE_PAGE + 1, len(keys) - 1)]
    written += keys[3::97]  # a spread over both pages
    for key in written:
        backend.store.put(key, b"x")
    backend.store.put("req2/tok2/0.png", b"kept")
    assert backend.stored() == {*written, "req2/tok2/0.png"}
    backend.store.delete(keys)
    assert backend.stored() == {"req2/tok2/0.png"}


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_keys_that_are_not_result_keys_are_refused_before_the_backend(backend: Backend, bad: str) -> None:
    backend.store.put("req1/tok1/0.png", PNG)
    before = backend.stored()
    with pytest.raises(ValueError, match="not a result-store key"):
        backend.store.put(bad, PNG)
    with pytest.raises(ValueError, match="not a result-store key"):
        backend.store.get(bad)
    with pytest.raises(ValueError, match="not a result-store key"):
        backend.store.url(bad)
    with pytest.raises(ValueError, match="not a result-store key"):
        backend.store.delete(["req1/tok1/0.png", bad])  # the good key first: nothing is deleted either
    assert backend.stored() == before
    assert backend.store.get("req1/tok1/0.png") == PNG


def test_url_is_none_where_the_backend_has_no_urls(backend: Backend) -> None:
    backend.store.put("req1/tok1/0.png", PNG)
    url = backend.store.url("req1/tok1/0.png")
    if backend.store.kind == "s3":
        assert url is not None and url.startswith("http://127.0.0.1:")
    else:
        assert url is None


# --- S3 only -------------------------------------------------------------------------------------------------------


def test_s3_presigned_url_serves_the_bytes_with_their_media_type(s3_server: S3Server) -> None:
    backend, _, bucket = s3_backend(s3_server)
    backend.store.put("req1/tok1/0.png", PNG)
    backend.store.put("req1/tok1/1.webp", b"webp bytes")
    url = backend.store.url("req1/tok1/0.png")
    assert url is not None and f"/{bucket}/{S3_PREFIX}req1/tok1/0.png?" in url and "X-Amz-Signature=" in url
    reply = httpx.get(url, timeout=5)
    assert reply.status_code == 200
    assert reply.content == PNG
    assert reply.headers["content-type"] == "image/png"
    webp = httpx.get(str(backend.store.url("req1/tok1/1.webp")), timeout=5)
    assert webp.status_code == 200 and webp.headers["content-type"] == "image/webp"


def test_s3_delete_sends_pages_of_at_most_1000_keys(s3_server: S3Server) -> None:
    backend, client, _ = s3_backend(s3_server)
    pages: list[int] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        pages.append(len(params["Delete"]["Objects"]))

    client.meta.events.register("provide-client-params.s3.DeleteObjects", record)
    keys = [f"req1/tok1/{index}.png" for index in range(2 * DELETE_PAGE + 1)]
    for key in (keys[0], keys[DELETE_PAGE], keys[-1]):
        backend.store.put(key, PNG)
    backend.store.delete(keys)
    assert pages == [DELETE_PAGE, DELETE_PAGE, 1]
    assert backend.stored() == set()


@contextlib.contextmanager
def failing_endpoint(failure: str) -> Iterator[str]:
    """An S3 endpoint that fails: a closed port (refused), or one that accepts TCP connections (the kernel's
    backlog) and never answers."""
    if failure == "closed port":
        yield f"http://127.0.0.1:{free_port()}"
        return
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


TIMEOUT_S = 0.2
BOUND_S = {
    "closed port": 5.0,
    # 3 attempts, each its read timeout plus botocore's 1 s wait for "100 Continue" (a put), with up to 1 + 2 s of
    # backoff between them, plus slack
    "no answer": 3 * (TIMEOUT_S + 1.0) + 3.0 + 1.5,
}


@pytest.mark.usefixtures("s3_server")  # only for its dummy credentials: the endpoint here is not it
@pytest.mark.parametrize("failure", ["closed port", "no answer"])
def test_s3_endpoint_failures_raise_result_store_error_quickly(failure: str) -> None:
    with failing_endpoint(failure) as endpoint:
        client = build_s3_client(endpoint_url=endpoint, region="us-east-1", timeout_s=TIMEOUT_S, path_style=True)
        store = S3ResultStore(client, "results", prefix=S3_PREFIX)
        calls: list[Callable[[], object]] = [
            lambda: store.put("req1/tok1/0.png", PNG),
            lambda: store.get("req1/tok1/0.png"),
            lambda: store.delete(["req1/tok1/0.png", "req1/tok1/1.png"]),
        ]

        def outcome(call: Callable[[], object]) -> tuple[BaseException | None, float]:
            started = time.monotonic()
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - the type is what is checked
                return exc, time.monotonic() - started
            return None, time.monotonic() - started

        # at once: each call's timeouts, retries and backoff take their worst case in parallel
        with ThreadPoolExecutor(len(calls)) as pool:
            outcomes = list(pool.map(outcome, calls))
    for (error, elapsed), verb in zip(outcomes, ["storing", "reading", "deleting"], strict=True):
        assert isinstance(error, ResultStoreError), error
        assert str(error).startswith(verb) and "s3://results/" in str(error)
        assert elapsed < BOUND_S[failure], (verb, elapsed)


class HangingStore(FilesystemResultStore):
    """A folder whose calls block until ``release`` is set (a stuck network mount), then work."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = threading.Event()

    def put(self, key: str, data: bytes) -> None:
        self.release.wait(30)
        super().put(key, data)

    def get(self, key: str) -> bytes | None:
        self.release.wait(30)
        return super().get(key)


def test_deadline_store_bounds_a_call_that_hangs_and_passes_the_rest_through(tmp_path: Path) -> None:
    hanging = HangingStore(tmp_path / "results")
    store = DeadlineStore(hanging, timeout_s=0.3)
    assert store.kind == "filesystem"
    started = time.monotonic()
    with pytest.raises(ResultStoreTimeout, match=r"storing a/b/0.png .* did not return within 0.3 s"):
        store.put("a/b/0.png", PNG)
    assert 0.3 <= time.monotonic() - started < 1.0
    hanging.release.set()  # the mount answers again: calls go through, with their own results and errors
    store.put("a/b/0.png", PNG)
    assert store.get("a/b/0.png") == PNG and store.get("a/b/1.png") is None
    with pytest.raises(ValueError, match="not a result-store key"):
        store.put("../x", PNG)


def test_deadline_store_refuses_at_once_past_its_abandoned_calls(tmp_path: Path) -> None:
    """Calls left hanging are bounded: past ``MAX_CALLS`` a call fails at once instead of adding a thread."""
    hanging = HangingStore(tmp_path / "results")
    store = DeadlineStore(hanging, timeout_s=0.05)
    for index in range(MAX_CALLS):
        with pytest.raises(ResultStoreTimeout, match="did not return"):
            store.get(f"a/b/{index}.png")
    started = time.monotonic()
    with pytest.raises(ResultStoreTimeout, match=f"{MAX_CALLS} calls .* have not returned"):
        store.get("a/b/0.png")
    assert time.monotonic() - started < 0.05
    hanging.release.set()
    assert wait_until(lambda: store.get("a/b/0.png") is None, 5)  # the abandoned calls returned: served again


def test_deadline_store_counts_calls_in_flight_against_its_cap(tmp_path: Path) -> None:
    """Concurrent callers cannot leave more than ``max_calls`` threads in a hanging backend: calls still in flight
    count, not only those past their deadline."""
    entered: list[str] = []

    class Counted(HangingStore):
        def get(self, key: str) -> bytes | None:
            entered.append(key)
            return super().get(key)

    hanging = Counted(tmp_path / "results")
    store = DeadlineStore(hanging, timeout_s=0.5, max_calls=3)
    errors: list[BaseException] = []

    def read(index: int) -> None:
        try:
            store.get(f"a/b/{index}.png")
        except ResultStoreTimeout as exc:
            errors.append(exc)

    callers = [threading.Thread(target=read, args=(index,)) for index in range(10)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(5)
    assert len(entered) == 3, entered  # the threads left in the hanging backend
    assert sum("refused" in str(exc) for exc in errors) == 7 and len(errors) == 10
    hanging.release.set()


def test_the_api_store_answers_within_its_own_call_timeout(tmp_path: Path) -> None:
    """The api's store is bounded by the api's call timeout when it is shorter than ``result_store_timeout_s``: the
    thread that waits for a hanging read is free when the api answers 503, not 90 s later."""
    settings = Settings(result_store="filesystem", result_dir=tmp_path, result_store_timeout_s=90)
    store = build_result_store(settings, fakeredis.FakeRedis(), call_timeout_s=0.2, max_calls=32)
    assert isinstance(store, DeadlineStore) and store.timeout_s == 0.2 and store.max_calls == 32
    assert build_result_store(settings, fakeredis.FakeRedis(), call_timeout_s=120).timeout_s == 90  # type: ignore[attr-defined]


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ResultStoreTimeout):
            if predicate():
                return True
        time.sleep(0.05)
    return False


@pytest.mark.usefixtures("s3_server")  # only for its dummy credentials: the endpoint here is not it
def test_s3_endpoint_that_trickles_its_answer_is_bounded_by_the_deadline() -> None:
    """botocore's timeouts bound each socket read, not a call: an endpoint that sends a byte now and then keeps a
    put waiting past them (here 3 x (2 x 0.2 + 2) = 7.2 s by the client's own bound) for as long as it trickles.
    The store the factory builds bounds the call."""
    settings = Settings(result_store="s3", s3_bucket="results", s3_timeout_s=0.2, result_store_timeout_s=7.5)
    with trickle_server() as endpoint:
        client = build_s3_client(endpoint_url=endpoint.url, region="us-east-1", timeout_s=0.2, path_style=True)
        store = DeadlineStore(S3ResultStore(client, "results"), settings.result_store_timeout_s)
        started = time.monotonic()
        with pytest.raises(ResultStoreTimeout, match="storing req1/tok1/0.png in the s3 result store"):
            store.put("req1/tok1/0.png", PNG)
        elapsed = time.monotonic() - started
    assert endpoint.accepted.is_set()
    assert settings.s3_call_bound_s <= elapsed < settings.result_store_timeout_s + 1


def test_the_factory_bounds_folder_and_s3_calls_but_not_redis(tmp_path: Path) -> None:
    folder = build_result_store(Settings(result_store="filesystem", result_dir=tmp_path), fakeredis.FakeRedis())
    assert isinstance(folder, DeadlineStore) and folder.timeout_s == 90
    s3 = build_result_store(Settings(result_store="s3", s3_bucket="b", s3_region="us-east-1"), fakeredis.FakeRedis())
    assert isinstance(s3, DeadlineStore) and isinstance(s3.inner, S3ResultStore)
    assert isinstance(build_result_store(Settings(), fakeredis.FakeRedis()), RedisResultStore)
    with pytest.raises(ValueError, match="result_store_timeout_s"):
        Settings(result_store="s3", s3_bucket="b", result_store_timeout_s=30)
    assert set(BUILDERS) == set(get_args(ResultStoreName))  # every store the settings accept has its builder


def test_s3_empty_endpoint_and_region_mean_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``FUSEFLEET_S3_ENDPOINT_URL=`` (as in .env.example, or compose's way to pick AWS) is AWS itself."""
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    aws = build_s3_client(endpoint_url="", region="", timeout_s=1, path_style=False)
    assert aws.meta.endpoint_url.startswith("https://s3.") and aws.meta.endpoint_url.endswith(".amazonaws.com")
    regional = build_s3_client(endpoint_url=None, region="eu-west-1", timeout_s=1, path_style=False)
    assert regional.meta.endpoint_url == "https://s3.eu-west-1.amazonaws.com"


# --- filesystem only -----------------------------------------------------------------------------------------------


def test_filesystem_writes_whole_files_and_delete_removes_empty_folders(tmp_path: Path) -> None:
    root = tmp_path / "results"
    backend = filesystem_backend(root)
    for key in ("req1/tok1/0.png", "req1/tok1/1.png", "req1/tok2/0.png", "req2/tok3/0.jpeg"):
        backend.store.put(key, PNG)
    assert not list(root.rglob("*.partial")) and not list(root.rglob(".*"))
    backend.store.delete(["req1/tok1/0.png"])
    assert (root / "req1" / "tok1").is_dir()  # its other image is still there
    backend.store.delete(["req1/tok1/1.png"])
    assert not (root / "req1" / "tok1").exists() and (root / "req1" / "tok2").is_dir()
    backend.store.delete(["req1/tok2/0.png", "req2/tok3/0.jpeg"])
    assert sorted(root.iterdir()) == []  # the request folders went with their last run
    assert root.is_dir()  # the root itself stays


def test_filesystem_failed_write_leaves_no_partial_file(tmp_path: Path) -> None:
    root = tmp_path / "results"
    store = FilesystemResultStore(root)
    (root / "req1" / "tok1" / "0.png").mkdir(parents=True)  # the rename onto a folder fails
    with pytest.raises(ResultStoreError, match="writing req1/tok1/0.png"):
        store.put("req1/tok1/0.png", PNG)
    assert [path.name for path in (root / "req1" / "tok1").iterdir()] == ["0.png"]
    (root / "blocked").write_bytes(b"")  # a file where a request folder would go: mkdir fails
    with pytest.raises(ResultStoreError, match="writing blocked/tok1/0.png"):
        store.put("blocked/tok1/0.png", PNG)
    assert not list(root.rglob("*.partial"))


# --- Redis only: the size cap --------------------------------------------------------------------------------------


FROZEN_NOW = 1_750_000_000.25


@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> tuple[RedisResultStore, fakeredis.FakeRedis]:
    """A store capped at 100 bytes on a Redis whose clock (TIME) stands still: every put lands in the same
    millisecond, as a batch's images often do, so their order cannot come from put times alone."""
    monkeypatch.setattr(server_mixin, "time", SimpleNamespace(time=lambda: FROZEN_NOW))
    client = fakeredis.FakeRedis(decode_responses=False)
    return RedisResultStore(client, RedisKeys(PREFIX), max_bytes=100, keep_s=60), client


def accounted(store: RedisResultStore, client: fakeredis.FakeRedis) -> int:
    """The bytes the store's objects really take, checked against its own bookkeeping."""
    keys = RedisKeys(PREFIX)
    objects = list(client.scan_iter(match=f"{keys.result('')}*"))
    total = sum(len(client.get(key) or b"") for key in objects)
    assert client.zcard(keys.redis_results_order) == len(objects) == client.hlen(keys.redis_results_sizes)
    assert store.used_bytes() == total
    return total


def backend_keys(client: fakeredis.FakeRedis) -> set[str]:
    """The result keys of the objects the store holds."""
    objects = RedisKeys(PREFIX).result("")
    return {key.decode()[len(objects) :] for key in client.scan_iter(match=f"{objects}*")}


def test_redis_cap_drops_the_oldest_first_and_marks_their_requests(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis],
) -> None:
    store, client = capped
    keys = RedisKeys(PREFIX)
    client.hset(keys.request("zzz"), mapping={"status": "succeeded", "claim": "tok", "results": "zzz/tok/0.png"})
    # put in the order opposite to the keys' sort order, within one millisecond
    store.put("zzz/tok/0.png", b"a" * 40)
    store.put("yyy/tok/0.png", b"b" * 40)
    assert accounted(store, client) == 80
    store.put("xxx/tok/0.png", b"c" * 40)  # 120 > 100: the oldest (zzz) goes
    assert store.get("zzz/tok/0.png") is None
    assert store.get("yyy/tok/0.png") == b"b" * 40 and store.get("xxx/tok/0.png") == b"c" * 40
    assert accounted(store, client) == 80
    assert float(client.hget(keys.request("zzz"), "evicted_at") or 0) == pytest.approx(FROZEN_NOW, abs=0.001)
    assert client.hget(keys.request("zzz"), "status") == b"succeeded"
    store.put("www/tok/0.png", b"d" * 90)  # needs both others gone
    assert store.get("yyy/tok/0.png") is None and store.get("xxx/tok/0.png") is None
    assert not client.exists(keys.request("yyy")) and not client.exists(keys.request("xxx"))  # no hash made up
    assert accounted(store, client) == 90


def test_redis_cap_dropping_an_earlier_runs_orphan_leaves_the_request_alone(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis],
) -> None:
    """Only the loss of an object of the request's current run marks it: an orphan of an earlier, fenced run (its
    objects fall due in the journal) dropped at the cap leaves the succeeded request's images served."""
    store, client = capped
    keys = RedisKeys(PREFIX)
    store.put("req/old/0.png", b"a" * 40)  # the fenced run's image, never referenced
    store.put("req/new/0.png", b"b" * 40)  # the run that finished the request
    client.hset(keys.request("req"), mapping={"status": "succeeded", "claim": "new", "results": "req/new/0.png"})
    store.put("other/tok/0.png", b"c" * 40)  # 120 > 100: the oldest (the orphan) goes
    assert store.get("req/old/0.png") is None and store.get("req/new/0.png") == b"b" * 40
    assert not client.hexists(keys.request("req"), "evicted_at")
    store.put("more/tok/0.png", b"d" * 40)  # now the request's own image goes: that one is marked
    assert store.get("req/new/0.png") is None
    assert client.hexists(keys.request("req"), "evicted_at")


def test_redis_cap_bookkeeping_stays_exact(capped: tuple[RedisResultStore, fakeredis.FakeRedis]) -> None:
    store, client = capped
    keys = RedisKeys(PREFIX)
    client.hset(keys.request("r1"), mapping={"status": "running", "claim": "tok"})
    client.hset(keys.request("r2"), mapping={"status": "succeeded", "claim": "tok", "results": "r2/tok/0.png"})
    store.put("r1/tok/0.png", b"a" * 30)
    store.put("r2/tok/0.png", b"b" * 30)
    store.put("r2/tok/0.png", b"b" * 50)  # written again (a retried put): counted once, at its new size
    assert accounted(store, client) == 80
    # r1 is the oldest object again: rewriting it must make room by dropping r2, never by dropping itself
    store.put("r1/tok/0.png", b"a" * 80)
    assert store.get("r1/tok/0.png") == b"a" * 80 and store.get("r2/tok/0.png") is None
    assert accounted(store, client) == 80
    assert client.hexists(keys.request("r2"), "evicted_at")
    assert not client.hexists(keys.request("r1"), "evicted_at")  # its image is there
    store.put("r3/tok/0.png", b"c" * 20)
    assert accounted(store, client) == 100
    store.delete(["r1/tok/0.png", "r9/tok/0.png"])  # r9 never existed
    assert accounted(store, client) == 20
    store.delete(["r3/tok/0.png", "r3/tok/0.png", "r2/tok/0.png"])  # twice, and one already evicted
    assert accounted(store, client) == 0
    for index in range(12):  # churn: an eviction on most puts
        store.put(f"r4/tok/{index}.png", bytes(7 + index))
        assert accounted(store, client) <= 100
    assert store.get("r4/tok/11.png") == bytes(18) and store.get("r4/tok/0.png") is None


def test_redis_object_larger_than_the_cap_is_refused_unwritten(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis],
) -> None:
    store, client = capped
    store.put("r1/tok/0.png", b"a" * 60)
    with pytest.raises(ResultStoreError, match="exceeds the Redis result store's cap"):
        store.put("r2/tok/0.png", b"b" * 101)
    with pytest.raises(ResultStoreError):
        store.put("r1/tok/0.png", b"a" * 101)  # nor does it replace an object
    assert store.get("r2/tok/0.png") is None
    assert store.get("r1/tok/0.png") == b"a" * 60
    assert accounted(store, client) == 60
    store.put("r3/tok/0.png", b"c" * 100)  # exactly the cap fits
    assert accounted(store, client) == 100


def test_redis_put_many_is_one_script_call_in_the_order_given(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's objects go in one call, their order the order given (within one millisecond: scores strictly
    increase), so a later put drops them first to last; an object alone over the cap is refused, the rest stored."""
    store, client = capped
    claimed(client, "c", "a", "b")
    replies = script_calls(store, monkeypatch)
    refused = store.put_many([("c/tok/0.png", b"c" * 30), ("big/tok/0.png", b"x" * 101), ("a/tok/0.png", b"a" * 30)])
    assert list(refused) == ["big/tok/0.png"] and "exceeds the Redis result store's cap" in str(
        refused["big/tok/0.png"]
    )
    assert replies == [[0, 1]] and backend_keys(client) == {"c/tok/0.png", "a/tok/0.png"}
    assert accounted(store, client) == 60
    store.put_many([("b/tok/0.png", b"b" * 80)])  # 140 > 100: both others go, c first
    assert replies == [[0, 1], [2, 1]] and backend_keys(client) == {"b/tok/0.png"}
    assert evicted(client, "a", "b", "c") == ["a", "c"]
    store.put_many([("b/tok/0.png", b"b" * 40), ("d/tok/0.png", b"d" * 60)])  # b rewritten: counted once
    assert replies[-1] == [0, 1] and accounted(store, client) == 100 and evicted(client, "b") == []


def test_redis_put_many_over_the_cap_together_puts_one_by_one(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Objects each within the cap but together over it make room one at a time, the batch's earlier ones
    included: the last ones stay, and the bookkeeping stays exact."""
    store, client = capped
    claimed(client, "old", "a", "b", "c")
    store.put("old/tok/0.png", b"o" * 50)
    replies = script_calls(store, monkeypatch)
    assert store.put_many([(f"{rid}/tok/0.png", rid.encode() * 45) for rid in "abc"]) == {}
    assert len(replies) == 3 and backend_keys(client) == {"b/tok/0.png", "c/tok/0.png"}
    assert accounted(store, client) == 90 and evicted(client, "old", "a", "b", "c") == ["old", "a"]


def test_redis_put_many_pages_a_long_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    client = fakeredis.FakeRedis(decode_responses=False)
    store = RedisResultStore(client, RedisKeys(PREFIX), max_bytes=10_000_000, keep_s=60)
    monkeypatch.setattr(redis_store, "PUT_PAGE", 4)
    replies = script_calls(store, monkeypatch)
    assert store.put_many([(f"r/tok/0-{frame}.png", bytes([frame])) for frame in range(10)]) == {}
    assert replies == [[0, 1]] * 3 and accounted(store, client) == 10
    assert [store.get(f"r/tok/0-{frame}.png") for frame in range(10)] == [bytes([frame]) for frame in range(10)]


def test_filesystem_put_many_refuses_one_and_stores_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "results"
    store = FilesystemResultStore(root)
    root.mkdir()
    (root / "blocked").write_bytes(b"")  # a file where a request folder would go: mkdir fails
    refused = store.put_many([("ok/tok1/0.png", PNG), ("blocked/tok1/0.png", PNG), ("ok2/tok1/0.png", PNG)])
    assert list(refused) == ["blocked/tok1/0.png"] and isinstance(refused["blocked/tok1/0.png"], ResultStoreError)
    assert store.get("ok/tok1/0.png") == PNG == store.get("ok2/tok1/0.png")


def claimed(client: fakeredis.FakeRedis, *request_ids: str) -> None:
    """Requests whose current run (claim ``tok``) stores their objects now."""
    for request_id in request_ids:
        client.hset(RedisKeys(PREFIX).request(request_id), mapping={"status": "running", "claim": "tok"})


def evicted(client: fakeredis.FakeRedis, *request_ids: str) -> list[str]:
    """Those of ``request_ids`` whose hash carries an eviction mark."""
    return [rid for rid in request_ids if client.hexists(RedisKeys(PREFIX).request(rid), "evicted_at")]


def script_calls(
    store: RedisResultStore, monkeypatch: pytest.MonkeyPatch, before: Callable[[int], None] = lambda call: None
) -> list[list[int]]:
    """The put script's replies, recorded; ``before(n)`` runs just before call ``n`` (from 0): after the put read
    its candidates, so what it does is a concurrent writer's change between the read and the script."""
    script, replies = store._put, list[list[int]]()

    def recorded(**kwargs: Any) -> Any:
        before(len(replies))
        reply = script(**kwargs)
        replies.append([int(part) for part in reply[:2]])  # dropped, written (a written put adds the bytes in use)
        return reply

    monkeypatch.setattr(store, "_put", recorded)
    return replies


def test_redis_cap_reads_again_when_the_order_changed_between_the_read_and_the_script(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The put reads a and b to drop; before its script runs, a delete takes b and another put fills the room. The
    script drops a (still the oldest) and marks it in the same call, finds c where b was and answers retry; the
    put reads c and e and drops both."""
    store, client = capped
    other = RedisResultStore(client, RedisKeys(PREFIX), max_bytes=100, keep_s=60)  # another worker's store
    claimed(client, "a", "b", "c", "d", "e")
    for request_id in "abc":
        store.put(f"{request_id}/tok/0.png", b"x" * 30)
    marked_after_first: list[str] = []

    def concurrently(call: int) -> None:
        if call == 0:
            other.delete(["b/tok/0.png"])
            other.put("e/tok/0.png", b"e" * 40)  # 100: fits without a drop
        else:
            marked_after_first.extend(evicted(client, *"abcde"))  # what a worker killed here would leave

    replies = script_calls(store, monkeypatch, concurrently)
    store.put("d/tok/0.png", b"d" * 70)
    assert replies == [[1, 0], [2, 1]]  # a dropped, then retry; c and e dropped, written
    assert marked_after_first == ["a"]
    assert backend_keys(client) == {"d/tok/0.png"} and accounted(store, client) == 70
    assert evicted(client, *"abcde") == ["a", "c", "e"]  # b was deleted, not evicted


def test_redis_cap_drops_more_than_a_page_of_candidates_in_one_call(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, client = capped
    ids = [f"r{index:02}" for index in range(20)]
    claimed(client, *ids)
    for request_id in ids:
        store.put(f"{request_id}/tok/0.png", b"x" * 5)
    replies = script_calls(store, monkeypatch)
    store.put("big/tok/0.png", b"b" * 60)  # needs the 12 oldest gone
    assert 12 > CANDIDATE_PAGE and replies == [[12, 1]]
    assert evicted(client, *ids) == ids[:12]
    assert backend_keys(client) == {"big/tok/0.png", *(f"{rid}/tok/0.png" for rid in ids[12:])}
    assert accounted(store, client) == 100


def test_redis_cap_marks_by_the_claim_at_the_drop_not_at_the_read(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request is claimed again between the put's read and its script: the object dropped is now an orphan of
    a fenced run, and the request's new run is not marked."""
    store, client = capped
    claimed(client, "req")
    store.put("req/tok/0.png", b"a" * 40)
    store.put("other/tok/0.png", b"b" * 40)

    def claimed_again(call: int) -> None:
        client.hset(RedisKeys(PREFIX).request("req"), "claim", "new")

    replies = script_calls(store, monkeypatch, claimed_again)
    store.put("third/tok/0.png", b"c" * 40)
    assert replies == [[1, 1]] and store.get("req/tok/0.png") is None
    assert evicted(client, "req") == []


def test_redis_cap_drops_an_object_whose_key_names_no_request(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis],
) -> None:
    """An object under a key not of the result-key shape (written by hand, or by another version) is dropped like
    any other; no request is marked or made up (its own key stands in for the request hash: a string, not read)."""
    store, client = capped
    keys = RedisKeys(PREFIX)
    for name in ("stray", "a/tok"):  # a/tok: no image name, so no request id either
        client.set(keys.result(name), b"s" * 20)
        client.zadd(keys.redis_results_order, {keys.result(name): 0})
        client.hset(keys.redis_results_sizes, keys.result(name), 20)
        client.incrby(keys.redis_results_used, 20)
    claimed(client, "a")
    store.put("x/tok/0.png", b"x" * 40)
    store.put("y/tok/0.png", b"y" * 60)  # 140 > 100: both strays go
    assert backend_keys(client) == {"x/tok/0.png", "y/tok/0.png"} and accounted(store, client) == 100
    assert evicted(client, "a") == [] and {key.decode() for key in client.scan_iter(match=keys.request("*"))} == {
        keys.request("a")
    }


def test_redis_put_gives_up_when_the_order_keeps_changing(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, client = capped
    store.put("r1/tok/0.png", b"a" * 60)
    monkeypatch.setattr(store, "_candidates", lambda object_keys, size: [])  # always stale: nothing to drop
    replies = script_calls(store, monkeypatch)
    with pytest.raises(ResultStoreError, match=f"kept changing under {PUT_TRIES} tries"):
        store.put("r2/tok/0.png", b"b" * 60)
    assert replies == [[0, 0]] * PUT_TRIES
    assert backend_keys(client) == {"r1/tok/0.png"} and accounted(store, client) == 60


def test_redis_objects_get_a_backstop_ttl() -> None:
    client = fakeredis.FakeRedis(decode_responses=False)
    store = RedisResultStore(client, RedisKeys(PREFIX), max_bytes=1000, keep_s=600)
    store.put("r1/tok/0.png", PNG[:10])
    ttl = client.ttl(RedisKeys(PREFIX).result("r1/tok/0.png"))
    assert 600 < ttl <= 600 + 86_400


def test_redis_put_within_the_room_left_reads_nothing_first(
    capped: tuple[RedisResultStore, fakeredis.FakeRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put that fits in the room the last put left calls the script at once (no candidates read); when another
    writer took that room since, the script answers retry and the put reads its candidates then."""
    store, client = capped
    other = RedisResultStore(client, RedisKeys(PREFIX), max_bytes=100, keep_s=60)  # another worker's store
    claimed(client, "a", "b", "c", "d")
    reads: list[int] = []
    candidates = store._candidates
    monkeypatch.setattr(store, "_candidates", lambda key, size: reads.append(size) or candidates(key, size))
    store.put("a/tok/0.png", b"a" * 40)  # no put yet: it reads first
    replies = script_calls(store, monkeypatch)
    store.put("b/tok/0.png", b"b" * 40)  # 60 free: no read
    assert reads == [40] and replies == [[0, 1]]
    other.put("c/tok/0.png", b"c" * 20)  # the room is 0 now, unknown to store
    store.put("d/tok/0.png", b"d" * 20)  # 20 free as it knows: tries, must make room, reads, drops a
    assert replies == [[0, 1], [0, 0], [1, 1]] and reads == [40, 20]
    assert backend_keys(client) == {"b/tok/0.png", "c/tok/0.png", "d/tok/0.png"} and accounted(store, client) == 80
