"""The step reporter: the denoising loop never waits on Redis, yet learns of aborts and lost rows, and the final
step is written."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import fakeredis
import pytest
import redis

from gpu_worker.step_reporter import WRITE_EVERY_S, StepReporter
from gpu_worker.store import Claimed, RowSignal, WorkerStore
from shared import keys as k
from shared.settings import Settings
from tests.support.processes import wait_for
from tests.unit.test_executor import scheduled_batch


@pytest.fixture
def settings() -> Settings:
    return Settings(key_prefix="t", batch_lock_ttl_s=5, result_ttl_s=60)


def claimed(client: fakeredis.FakeRedis, settings: Settings, ids: list[str]) -> WorkerStore:
    store = WorkerStore(client, settings)
    assert isinstance(store.claim(scheduled_batch(client, settings, ids), "tok", "w1"), Claimed)
    return store


class SlowStore(WorkerStore):
    """Every progress write takes ``delay_s`` (a slow or distant Redis); ``fail`` makes writes raise."""

    delay_s = 0.3
    fail = False
    writes = 0

    def progress(self, request_ids: Sequence[str], step: int, total: int, token: str) -> list[RowSignal]:
        time.sleep(self.delay_s)
        self.writes += 1
        if self.fail:
            raise redis.ConnectionError("Connection refused")
        return super().progress(request_ids, step, total, token)


def test_the_loop_never_waits_and_the_last_step_is_written(settings: Settings) -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    claimed(client, settings, ["a", "b"])
    store = SlowStore(client, settings)
    reporter = StepReporter(store, ["a", "b"], "tok")
    started = time.perf_counter()
    for step in range(1, 21):
        assert reporter.on_step(step, 20) is False
    assert time.perf_counter() - started < 0.1  # 20 steps, each write 0.3 s: the loop did not wait on one
    reporter.close()
    assert client.hget(store.keys.request("a"), "step") == "20"
    assert store.writes < 20  # writes are coalesced: only the latest step is written


def test_an_abort_stops_the_forward_once_every_row_is_aborted(settings: Settings) -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    store = claimed(client, settings, ["a", "b"])
    reporter = StepReporter(store, ["a", "b"], "tok")
    abort = client.register_script(k.ABORT)
    assert abort(keys=k.abort_keys(store.keys, "a"), args=[time.time(), 60, "ch", "a"]) == "running"
    reporter.on_step(1, 10)
    wait_for(lambda: reporter.signals == [RowSignal.ABORTED, RowSignal.GO_ON], 5, "the abort to come back")
    assert reporter.on_step(2, 10) is False  # b still runs
    abort(keys=k.abort_keys(store.keys, "b"), args=[time.time(), 60, "ch", "b"])
    reporter.on_step(3, 10)
    wait_for(lambda: reporter.on_step(4, 10), 5, "the forward to be told to stop")
    reporter.close()


def test_rows_another_run_claimed_stop_the_forward(settings: Settings) -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    store = claimed(client, settings, ["a"])
    client.hset(store.keys.request("a"), "claim", "another-run")  # our lock lapsed; another worker runs it
    reporter = StepReporter(store, ["a"], "tok")
    reporter.on_step(1, 4)
    wait_for(lambda: reporter.on_step(2, 4), 5, "the stale run to learn it lost its row")
    reporter.close()


def test_an_outage_pauses_reports_and_the_forward_goes_on(settings: Settings) -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    claimed(client, settings, ["a"])
    store = SlowStore(client, settings)
    store.delay_s, store.fail = 0.0, True
    reporter = StepReporter(store, ["a"], "tok")
    for step in range(1, 6):
        assert reporter.on_step(step, 5) is False
        time.sleep(0.01)
    started = time.perf_counter()
    reporter.close()
    assert time.perf_counter() - started < 2.5  # bounded by CLOSE_TIMEOUT_S even while writes fail
    assert store.writes >= 1


def test_aborted_rows_are_handed_over_once_from_the_reporter_thread(settings: Settings) -> None:
    """``on_aborted`` gets each aborted request once, on the reporter's thread (never the loop's); a Redis outage in
    it is retried with the next report."""
    client = fakeredis.FakeRedis(decode_responses=True)
    store = claimed(client, settings, ["a", "b", "c"])
    calls: list[tuple[str, list[str]]] = []

    def on_aborted(request_ids: list[str]) -> None:
        calls.append((threading.current_thread().name, request_ids))
        if len(calls) == 1:
            raise redis.ConnectionError("Connection refused")  # the first try meets an outage

    reporter = StepReporter(store, ["a", "b", "c"], "tok", on_aborted=on_aborted)
    abort = client.register_script(k.ABORT)
    abort(keys=k.abort_keys(store.keys, "b"), args=[time.time(), 60, "ch", "b"])
    step = 0

    def handed(count: int) -> bool:
        nonlocal step
        step += 1
        reporter.on_step(step, 100)
        return len(calls) >= count

    wait_for(lambda: handed(2), 5, "the abort to be handed over again after the outage")
    abort(keys=k.abort_keys(store.keys, "c"), args=[time.time(), 60, "ch", "c"])
    wait_for(lambda: handed(3), 5, "the second abort to be handed over")
    for _ in range(5):
        reporter.on_step(step + 1, 100)
        step += 1
        time.sleep(0.02)
    reporter.close()
    assert calls == [("step-reporter", ["b"]), ("step-reporter", ["b"]), ("step-reporter", ["c"])]
    assert reporter.signals == [RowSignal.GO_ON, RowSignal.ABORTED, RowSignal.ABORTED]


class CountingStore(WorkerStore):
    """Records when each progress write starts (fast Redis: fakeredis)."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        super().__init__(client, settings)
        self.started: list[float] = []

    def progress(self, request_ids: Sequence[str], step: int, total: int, token: str) -> list[RowSignal]:
        self.started.append(time.monotonic())
        return super().progress(request_ids, step, total, token)


def test_writes_are_at_most_one_per_interval_the_first_one_interval_in_and_the_last_at_close(
    settings: Settings,
) -> None:
    """A forward of fast steps (Redis answering at once) writes its first step one ``WRITE_EVERY_S`` into the
    forward, then at most one write per interval, and its last step at close without waiting out the interval."""
    client = fakeredis.FakeRedis(decode_responses=True)
    claimed(client, settings, ["a", "b"])
    store = CountingStore(client, settings)
    began = time.monotonic()
    reporter = StepReporter(store, ["a", "b"], "tok")
    reporter.on_step(1, 40)
    wait_for(lambda: client.hget(store.keys.request("a"), "step") == "1", 2, "the first step written")
    assert WRITE_EVERY_S * 0.95 <= store.started[0] - began < WRITE_EVERY_S * 1.5
    for step in range(2, 40):
        reporter.on_step(step, 40)
        time.sleep(WRITE_EVERY_S / 10)  # 40 steps: about four intervals
    reporter.on_step(40, 40)
    closing = time.monotonic()
    reporter.close()
    assert time.monotonic() - closing < WRITE_EVERY_S / 2  # the final write did not wait out the interval
    assert client.hget(store.keys.request("b"), "step") == "40"
    spans = [later - earlier for earlier, later in zip(store.started, store.started[1:-1], strict=False)]
    assert all(span >= WRITE_EVERY_S * 0.95 for span in spans), spans  # the interval, bar the final write
    assert 3 <= len(store.started) <= 1 + (time.monotonic() - began) / WRITE_EVERY_S, store.started


def test_a_forward_shorter_than_the_interval_writes_only_its_last_step(settings: Settings) -> None:
    """Ten steps within one ``WRITE_EVERY_S``: one write, of the last step, at close (at once)."""
    client = fakeredis.FakeRedis(decode_responses=True)
    claimed(client, settings, ["a"])
    store = CountingStore(client, settings)
    reporter = StepReporter(store, ["a"], "tok")
    for step in range(1, 11):
        reporter.on_step(step, 10)
    closing = time.monotonic()
    reporter.close()
    assert time.monotonic() - closing < WRITE_EVERY_S / 2
    assert len(store.started) == 1 and client.hget(store.keys.request("a"), "step") == "10"


def test_close_unwritten_leaves_the_last_step_to_the_ending(settings: Settings) -> None:
    """A forward that ran to its end: its reporter stops without writing its last step and hands it over, for
    ``finish.lua`` to write with the requests' ending; a forward shorter than one interval writes nothing."""
    client = fakeredis.FakeRedis(decode_responses=True)
    claimed(client, settings, ["a"])
    store = SlowStore(client, settings)
    store.delay_s = 0.0
    reporter = StepReporter(store, ["a"], "tok")
    for step in range(1, 5):
        reporter.on_step(step, 4)
    assert reporter.close_unwritten() == (4, 4)
    assert store.writes == 0 and client.hget(store.keys.request("a"), "step") == "0"
    assert StepReporter(store, ["a"], "tok").close_unwritten() is None  # no step reported
