"""The result sweeper on fakeredis (the real journal scripts) and a folder result store: it deletes what fell due,
and only that; a failed deletion is retried; its loop outlives failures and stops on request."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import fakeredis
import pytest

from gpu_worker.store import Claimed, WorkerStore
from scheduler import sweeper as sweeper_module
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from scheduler.sweeper import ResultSweeper
from shared import keys as k
from shared.contracts import BatchMessage, RequestStatus
from shared.results import ResultJournal, ResultStoreError
from shared.results.filesystem import FilesystemResultStore
from shared.settings import Settings
from tests.unit.test_scripts import submit

PNG = b"\x89PNG\r\n\x1a\n" + b"image"


@pytest.fixture
def keys() -> k.RedisKeys:
    return k.RedisKeys("t")


@pytest.fixture
def journal(client: fakeredis.FakeRedis, keys: k.RedisKeys) -> ResultJournal:
    return ResultJournal(client, keys)


@pytest.fixture
def results(tmp_path: Path) -> FilesystemResultStore:
    return FilesystemResultStore(tmp_path / "results")


class FlakyStore:
    """A folder store whose deletions fail while ``failing`` is set; records every deletion call."""

    kind = "flaky"

    def __init__(self, inner: FilesystemResultStore) -> None:
        self.inner = inner
        self.failing = True
        self.calls: list[list[str]] = []

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get(self, key: str) -> bytes | None:
        return self.inner.get(key)

    def delete(self, keys: Sequence[str]) -> None:
        self.calls.append(list(keys))
        if self.failing:
            raise ResultStoreError("deleting failed: the bucket is away")
        self.inner.delete(keys)

    def url(self, key: str) -> str | None:
        return None


def store_images(journal: ResultJournal, results: FilesystemResultStore, keys: Sequence[str], grace_s: float) -> None:
    """What a run does: journal the keys, then write the objects."""
    journal.record(keys, grace_s)
    for key in keys:
        results.put(key, PNG)


def stored(results: FilesystemResultStore, keys: Sequence[str]) -> list[str]:
    return [key for key in keys if results.get(key) is not None]


def wait_until_due(seconds: float) -> None:
    time.sleep(seconds + 0.02)  # Redis time and this clock agree (fakeredis), a margin for rounding to ms


def test_recorded_keys_are_kept_until_due_then_deleted(
    client: fakeredis.FakeRedis, keys: k.RedisKeys, journal: ResultJournal, results: FilesystemResultStore
) -> None:
    early = ["req1/tok1/0.png", "req1/tok1/1.png"]
    late = ["req2/tok2/0.png"]
    store_images(journal, results, early, 0.05)
    store_images(journal, results, late, 60)
    sweeper = ResultSweeper(journal, results, interval_s=1)
    assert sweeper.sweep() == 0
    assert stored(results, early + late) == early + late
    assert client.zcard(keys.results_journal) == 3
    wait_until_due(0.05)
    assert sweeper.sweep() == 2
    assert stored(results, early + late) == late
    assert client.zrange(keys.results_journal, 0, -1) == late  # the one not due is still journaled
    assert client.zcard(keys.results_deleting) == 0  # every deletion confirmed
    assert journal.pending() == 1
    assert not (results.root / "req1").exists()
    assert sweeper.sweep() == 0


def test_a_finished_requests_images_are_kept_until_it_expires(
    client: fakeredis.FakeRedis, keys: k.RedisKeys, journal: ResultJournal, results: FilesystemResultStore
) -> None:
    """The real path: submitted, scheduled, claimed, images journaled and stored, finished (finish.lua)."""
    settings = Settings(key_prefix=keys.prefix, result_ttl_s=1, batch_lock_ttl_s=5)
    scheduler = SchedulerStore(client, settings)
    submit(client, keys, "a", "b", "c")
    lease = Lease(client, keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    assert scheduler.schedule(lease.key, lease.token, "B1", ["a", "b", "c"]) == ["a", "b", "c"]
    worker = WorkerStore(client, settings)
    claim = worker.claim(BatchMessage(batch_id="B1", request_ids=("a", "b", "c"), created_at=0.0), "tok", "w1")
    assert isinstance(claim, Claimed) and claim.running == ["a", "b", "c"]
    images = {rid: [f"{rid}/tok/0.png", f"{rid}/tok/1.png"] for rid in ("a", "b", "c")}
    every = [key for rid_keys in images.values() for key in rid_keys]
    worker.record_results(every)  # due after result_orphan_grace_s (30 minutes)
    for key in every:
        results.put(key, PNG)
    abort = client.register_script(k.ABORT)
    assert abort(keys=k.abort_keys(keys, "b"), args=[time.time(), 1, keys.finished, "b"]) == "running"
    finished = worker.finish_many({"a": images["a"], "b": images["b"]}, {}, "tok")  # b: aborted, due at once
    assert finished == {"a": RequestStatus.SUCCEEDED, "b": RequestStatus.ABORTED}
    sweeper = ResultSweeper(journal, results, interval_s=1)
    assert sweeper.sweep() == 2  # b's images only; c still runs, a is kept with its request
    assert stored(results, every) == images["a"] + images["c"]
    assert client.hget(keys.request("a"), "results") == " ".join(images["a"])
    wait_until_due(1.0)  # a's request expires (result_ttl_s = 1)
    assert sweeper.sweep() == 2
    assert stored(results, every) == images["c"]  # c's run may still finish: its grace has not passed
    assert client.zrange(keys.results_journal, 0, -1) == images["c"]
    assert client.zcard(keys.results_deleting) == 0


def test_a_failed_deletion_is_retried_after_retry_s(
    monkeypatch: pytest.MonkeyPatch,
    client: fakeredis.FakeRedis,
    keys: k.RedisKeys,
    journal: ResultJournal,
    results: FilesystemResultStore,
) -> None:
    monkeypatch.setattr(sweeper_module, "RETRY_S", 0.3)
    flaky = FlakyStore(results)
    due = ["req1/tok1/0.png", "req1/tok1/1.png"]
    store_images(journal, results, due, 0)
    sweeper = ResultSweeper(journal, flaky, interval_s=1)
    with pytest.raises(ResultStoreError):
        sweeper.sweep()
    assert stored(results, due) == due
    assert client.zcard(keys.results_journal) == 0  # taken from the journal ...
    assert sorted(client.zrange(keys.results_deleting, 0, -1)) == due  # ... and waiting for a retry
    assert journal.pending() == 2
    flaky.failing = False
    assert sweeper.sweep() == 0  # not taken again before RETRY_S
    assert len(flaky.calls) == 1
    wait_until_due(0.3)
    assert sweeper.sweep() == 2
    assert sorted(flaky.calls[-1]) == due
    assert stored(results, due) == []
    assert client.zcard(keys.results_deleting) == 0 and journal.pending() == 0


def test_run_outlives_a_failing_round_and_stops_when_told(
    monkeypatch: pytest.MonkeyPatch, journal: ResultJournal, results: FilesystemResultStore
) -> None:
    monkeypatch.setattr(sweeper_module, "RETRY_S", 0.05)
    flaky = FlakyStore(results)
    due = ["req1/tok1/0.png"]
    store_images(journal, results, due, 0)
    sweeper = ResultSweeper(journal, flaky, interval_s=0.02)
    stop = threading.Event()
    thread = sweeper.start(stop)
    try:
        deadline = time.monotonic() + 5
        while len(flaky.calls) < 2 and time.monotonic() < deadline:  # it failed, and tried again
            time.sleep(0.01)
        assert len(flaky.calls) >= 2 and thread.is_alive()
        assert stored(results, due) == due
        flaky.failing = False
        while (stored(results, due) or journal.pending()) and time.monotonic() < deadline:  # deleted, confirmed
            time.sleep(0.01)
        assert stored(results, due) == []
        assert journal.pending() == 0
        store_images(journal, results, ["req2/tok2/0.png"], 0)  # later work is still swept
        while stored(results, ["req2/tok2/0.png"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stored(results, ["req2/tok2/0.png"]) == []
    finally:
        stop.set()
        thread.join(timeout=2)
    assert not thread.is_alive()


def test_run_stops_promptly_while_waiting(journal: ResultJournal, results: FilesystemResultStore) -> None:
    flaky = FlakyStore(results)
    store_images(journal, results, ["req1/tok1/0.png"], 0)
    stop = threading.Event()
    thread = ResultSweeper(journal, flaky, interval_s=30).start(stop)  # its first round is 30 s away
    time.sleep(0.05)
    started = time.monotonic()
    stop.set()
    thread.join(timeout=2)
    assert not thread.is_alive() and time.monotonic() - started < 1
    assert flaky.calls == []  # stopped before any round


@pytest.mark.parametrize(
    ("count", "pages"),
    [(10, [3, 3, 3, 1]), (6, [3, 3])],  # exactly two pages: an empty take ends the round, no empty delete call
    ids=["more-than-a-page", "exactly-two-pages"],
)
def test_every_due_key_is_deleted_in_one_sweep_a_page_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
    journal: ResultJournal,
    results: FilesystemResultStore,
    count: int,
    pages: list[int],
) -> None:
    monkeypatch.setattr(sweeper_module, "PAGE", 3)
    spy = FlakyStore(results)
    spy.failing = False
    due = [f"req{index}/tok/0.png" for index in range(count)]
    store_images(journal, results, due, 0)
    assert ResultSweeper(journal, spy, interval_s=1).sweep() == count
    assert [len(page) for page in spy.calls] == pages
    assert sorted(key for page in spy.calls for key in page) == sorted(due)
    assert stored(results, due) == []
    assert journal.pending() == 0 and sorted(results.root.iterdir()) == []
