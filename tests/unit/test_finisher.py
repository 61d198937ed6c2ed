"""Storing behind the next forward: the finisher, the worker slot it frees early, and the bounds around it.

The executor runs on fakeredis with the real Lua scripts and a filesystem result store that the test can hold
shut, so a batch's finish can be caught half-way.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import fakeredis
import pytest

from gpu_worker.executor import BatchExecutor, BatchOutcome
from gpu_worker.finisher import BackgroundFinisher, FinisherStuck
from gpu_worker.heartbeat import Heartbeat
from gpu_worker.store import Claimed, WorkerStore
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared.contracts import BatchMessage, Task, WorkerCapabilities
from shared.results.deadline import DeadlineStore
from shared.results.filesystem import FilesystemResultStore
from shared.settings import Settings
from tests.unit.test_executor import ScriptedRunner, scheduled_batch
from tests.unit.test_scripts import submit

CAPABILITIES = WorkerCapabilities(model="demo", pipeline="Test", tasks=(Task.TEXT_TO_IMAGE,))


@pytest.fixture
def settings() -> Settings:
    return Settings(key_prefix="t", max_batch_attempts=3, batch_lock_ttl_s=5, result_ttl_s=60)


class GatedStore(FilesystemResultStore):
    """A filesystem result store whose writes wait until the test opens the gate."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def put(self, key: str, data: bytes) -> None:
        self.waiting.set()
        assert self.gate.wait(10), "the test never opened the gate"
        super().put(key, data)


def test_background_finisher_runs_jobs_in_order_one_at_a_time() -> None:
    finisher = BackgroundFinisher()
    done: list[int] = []
    release = threading.Event()
    finisher.submit(lambda: (release.wait(5), done.append(1)) and None)
    submitted = threading.Event()

    def second() -> None:
        finisher.submit(lambda: done.append(2))
        submitted.set()

    threading.Thread(target=second, daemon=True).start()
    assert not submitted.wait(0.2)  # the first job still runs: the next submit waits for it
    release.set()
    assert submitted.wait(5)
    assert finisher.close(5)
    assert done == [1, 2]


def test_background_finisher_survives_a_failing_job(caplog: pytest.LogCaptureFixture) -> None:
    finisher = BackgroundFinisher()
    done: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    finisher.submit(broken)
    finisher.submit(lambda: done.append("after"))
    assert finisher.close(5)
    assert done == ["after"]
    assert "finishing a batch failed" in caplog.text
    with pytest.raises(RuntimeError, match="closed"):
        finisher.submit(lambda: None)


def test_close_reports_a_finish_that_does_not_end() -> None:
    finisher = BackgroundFinisher()
    stuck = threading.Event()
    finisher.submit(lambda: stuck.wait(5) and None)
    started = time.monotonic()
    assert not finisher.close(0.2)
    assert time.monotonic() - started < 2
    stuck.set()


def test_a_finish_past_its_bound_makes_the_finisher_stuck_and_refuse_every_later_batch() -> None:
    """Whatever holds a finish (not only a store call): ``stuck_after_s`` after it began, the next ``submit`` stops
    waiting, calls ``on_stuck`` once and raises; so does every later one, at once."""
    reasons: list[str] = []
    finisher = BackgroundFinisher(stuck_after_s=0.3, on_stuck=reasons.append)
    held = threading.Event()
    finisher.submit(lambda: held.wait(10) and None)
    started = time.monotonic()
    with pytest.raises(FinisherStuck, match="still runs 0.3 s after it began"):
        finisher.submit(lambda: None)
    assert 0.25 <= time.monotonic() - started < 2
    assert reasons == ["a batch's finish still runs 0.3 s after it began"]
    with pytest.raises(FinisherStuck):
        finisher.submit(lambda: None)
    assert len(reasons) == 1
    held.set()


def test_a_store_that_hangs_gives_the_batch_back_uncounted_and_quarantines_the_worker(
    client: fakeredis.FakeRedis, settings: Settings, tmp_path: Path
) -> None:
    """A result-store write that does not return within ``result_store_timeout_s`` fails no request and charges it
    no lost run: the finisher is stuck, the worker (``gpu_worker.app``'s ``on_stuck``: the heartbeat's
    ``withdraw``, then the process exits) is quarantined and gives back the batch whose write hung (its lock goes
    at once, not ``batch_lock_ttl_s`` later), which the reaper publishes again; the next claim runs it whole, as
    the first did, however often a stuck store gives it back."""
    store = WorkerStore(client, settings)
    scheduler = SchedulerStore(client, settings)
    beat = Heartbeat(store, "w1", 60, CAPABILITIES)
    beat.start()
    hung = GatedStore(tmp_path / "results")  # its gate is never opened while the test looks
    reasons: list[str] = []

    def on_stuck(reason: str) -> None:
        reasons.append(reason)
        beat.withdraw(reason)

    finisher = BackgroundFinisher(on_stuck=on_stuck)
    executor = BatchExecutor(store, ScriptedRunner(), "w1", beat, DeadlineStore(hung, 0.3), finisher=finisher)
    try:
        batch = scheduled(client, settings, {"B1": ["a", "b"]})[0]
        started = time.monotonic()
        outcome = executor.execute(batch)
        assert isinstance(outcome, BatchOutcome)
        assert outcome.done.wait(5) and finisher.idle(5)
        assert time.monotonic() - started < 2
        assert reasons and "did not return within 0.3 s" in reasons[0]
        statuses = [client.hget(store.keys.request(rid), "status") for rid in ("a", "b")]
        assert statuses == ["running", "running"]  # not failed: the batch runs again elsewhere
        assert client.zscore(store.keys.workers, "w1") is None  # no slot counted for the stuck worker
        assert client.exists(store.keys.worker_quarantine("w1"))
        assert 0 < client.pttl(store.keys.worker_quarantine("w1")) <= settings.worker_quarantine_s * 1000
        assert beat.held == []
        assert not client.exists(store.keys.batch_lock("B1"))  # given back now, not left to lapse
        assert scheduler.reap().republish == ["B1"]
        with pytest.raises(FinisherStuck):
            executor.execute(scheduled(client, settings, {"B2": ["c"]})[0])
    finally:
        hung.gate.set()
        beat.stop()
    for attempt in range(settings.max_batch_attempts + 1):  # given back more often than a lost run may be
        claim = store.claim(batch, f"tok{attempt}", "w2")
        assert isinstance(claim, Claimed) and claim.running == ["a", "b"]  # whole: no split, no WorkerLost
        assert store.give_back("B1", f"tok{attempt}") == 2
        assert scheduler.reap().republish == ["B1"]
    assert not any(field.startswith("lost:") for field in client.hkeys(store.keys.batch("B1")))


def test_withdraw_gives_back_every_held_batch_and_quarantines_the_slot(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    store = WorkerStore(client, settings)
    beat = Heartbeat(store, "w1", 60, CAPABILITIES)
    beat.start()
    for batch_id, token in (("B1", "t1"), ("B2", "t2"), ("B4", "t4")):
        client.set(store.keys.batch_lock(batch_id), token, px=10_000)
        beat.hold(batch_id, token)
    client.set(store.keys.batch_lock("B3"), "other", px=10_000)
    beat.hold("B3", "t3")  # lost to another run meanwhile: not ours to give back
    beat.release("B4", "t4")  # no longer renewed, but still ours (the batch whose write hung)
    assert client.zscore(store.keys.workers, "w1") is not None
    beat.withdraw("the store hangs")
    assert client.zscore(store.keys.workers, "w1") is None and not client.hexists(store.keys.capabilities, "w1")
    assert client.get(store.keys.worker_quarantine("w1")) == "the store hangs"
    assert not any(client.exists(store.keys.batch_lock(batch_id)) for batch_id in ("B1", "B2", "B4"))
    assert client.get(store.keys.batch_lock("B3")) == "other"
    assert beat.held == []


def test_a_quarantined_worker_announces_no_slot_until_the_quarantine_ends(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    """The next pool process of a quarantined worker beats, but announces nothing (no slot, no wake-up) until its
    quarantine key expires; its first announced beat wakes the scheduler and calls ``on_announce``."""
    store = WorkerStore(client, settings)
    client.set(store.keys.worker_quarantine("w1"), "stuck", px=300)
    announced: list[bool] = []
    beat = Heartbeat(store, "w1", 0.05, CAPABILITIES, on_announce=lambda: announced.append(True))
    beat.start()
    try:
        assert beat.quarantined and announced == []
        time.sleep(0.15)
        assert client.zscore(store.keys.workers, "w1") is None and client.xlen(store.keys.events) == 0
        assert SchedulerStore(client, settings).free_slots() == 0
        deadline = time.monotonic() + 3
        while beat.quarantined and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
        assert not beat.quarantined and announced == [True]
        assert client.zscore(store.keys.workers, "w1") is not None
        assert [fields["type"] for _, fields in client.xrange(store.keys.events)] == ["worker_up"]
    finally:
        beat.stop()


def test_a_batch_handed_back_unclaimed_falls_due_for_the_reaper(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    """A quarantined worker that still receives a batch message claims nothing: the batch falls due, and the
    reaper publishes it again at its next pass instead of ``batch_claim_timeout_s`` later."""
    store = WorkerStore(client, settings)
    scheduler = SchedulerStore(client, settings)
    scheduled(client, settings, {"B1": ["a"]})
    assert scheduler.stamp_published("B1") == ["a"]
    assert scheduler.reap().republish == []  # published just now: its message may still be on its way
    assert store.give_back("B1", None) == 0
    assert scheduler.reap().republish == ["B1"]
    assert store.give_back("B1", "not-ours") == -1  # a token that holds no lock changes nothing


def scheduled(client: fakeredis.FakeRedis, settings: Settings, batches: dict[str, list[str]]) -> list[BatchMessage]:
    """Submit the requests of each batch (ids = prompts) and schedule them into it, as one scheduler would."""
    store = SchedulerStore(client, settings)
    lease = Lease(client, store.keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    messages = []
    for batch_id, ids in batches.items():
        submit(client, store.keys, *ids)
        assert store.schedule(lease.key, lease.token, batch_id, ids) == ids
        messages.append(BatchMessage(batch_id=batch_id, request_ids=tuple(ids), created_at=time.time()))
    lease.release()
    return messages


def test_slot_frees_when_the_forward_ends_and_the_batch_stays_in_flight_until_stored(
    client: fakeredis.FakeRedis, settings: Settings, tmp_path: Path
) -> None:
    """While a batch's images are stored, its worker's slot is free for the next batch; the batch stays in flight
    and locked (the reaper leaves it alone) until its requests are finished; then it leaves flight."""
    store = WorkerStore(client, settings)
    scheduler = SchedulerStore(client, settings)
    store.heartbeat("w1", CAPABILITIES, first=True)
    results = GatedStore(tmp_path / "results")
    finisher = BackgroundFinisher()
    executor = BatchExecutor(store, ScriptedRunner(), "w1", None, results, finisher=finisher)
    batch = scheduled_batch(client, settings, ["a", "b"])
    assert scheduler.free_slots() == 0  # the batch in flight occupies the only worker

    outcome = executor.execute(batch)
    assert isinstance(outcome, BatchOutcome)
    assert results.waiting.wait(5)  # the finisher is storing the first image
    assert not outcome.done.is_set()
    assert scheduler.free_slots() == 1  # the forward is over: the worker can take the next batch
    assert client.zrange(store.keys.inflight, 0, -1) == ["B1"]
    assert client.exists(store.keys.batch_lock("B1"))
    assert scheduler.reap().republish == []  # locked: not the reaper's
    assert [client.hget(store.keys.request(rid), "status") for rid in ("a", "b")] == ["running", "running"]

    results.gate.set()
    assert outcome.wait(5) == {"a": "succeeded", "b": "succeeded"}
    assert finisher.close(5)
    assert client.zrange(store.keys.inflight, 0, -1) == []
    assert client.zcard(store.keys.storing) == 0
    assert scheduler.free_slots() == 1


def test_a_worker_that_dies_while_storing_frees_nothing_twice(client: fakeredis.FakeRedis, settings: Settings) -> None:
    """A storing batch whose run died (its lock lapsed) leaves the storing set at the reaper's next pass and is
    published again: its rerun occupies a slot like any batch in flight."""
    store = WorkerStore(client, settings)
    scheduler = SchedulerStore(client, settings)
    store.heartbeat("w1", CAPABILITIES, first=True)
    batch = scheduled_batch(client, settings, ["a"])
    assert isinstance(store.claim(batch, "tok1", "w1"), Claimed)
    assert store.forward_done("B1", "tok1")
    assert scheduler.free_slots() == 1
    client.delete(store.keys.batch_lock("B1"))  # the worker died; its lock lapsed
    assert scheduler.reap().republish == ["B1"]
    assert client.zcard(store.keys.storing) == 0
    assert scheduler.free_slots() == 0  # the rerun will take the worker
    assert not store.forward_done("B1", "tok1")  # the dead run's late call changes nothing


def test_a_run_that_lost_its_lock_leaves_nothing_in_the_storing_set(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    """A run whose lock lapsed while it stored (a stall) still ends its batch: the batch leaves the storing set, so
    no stale member outlives it (out of flight) or frees a slot for a batch no run holds (still in flight)."""
    store = WorkerStore(client, settings)
    scheduler = SchedulerStore(client, settings)
    store.heartbeat("w1", CAPABILITIES, first=True)
    store.heartbeat("w2", CAPABILITIES)
    scheduled(client, settings, {"B1": ["a"], "B2": ["b", "c"]})
    for batch_id, ids, token in (("B1", ("a",), "tok1"), ("B2", ("b", "c"), "tok2")):
        message = BatchMessage(batch_id=batch_id, request_ids=ids, created_at=0.0)
        assert isinstance(store.claim(message, token, "w1"), Claimed)
        assert store.forward_done(batch_id, token)
        client.delete(store.keys.batch_lock(batch_id))  # the stall outlived the lock; no other run claimed it
    assert scheduler.free_slots() == 2
    store.finish_many({"a": []}, {}, "tok1")
    assert store.batch_done("B1", "tok1")  # everything finished: out of flight, and out of the storing set
    assert client.zrange(store.keys.storing, 0, -1) == ["B2"]
    store.finish_many({"b": []}, {}, "tok2")
    assert not store.batch_done("B2", "tok2")  # c is unfinished: left to the reaper, occupying a slot meanwhile
    assert client.zcard(store.keys.storing) == 0
    assert scheduler.free_slots() == 1
    assert scheduler.reap().republish == ["B2"]


def test_heartbeat_renews_every_held_batch_until_its_limit(client: fakeredis.FakeRedis) -> None:
    """A worker holds the batch it stores and the batch it runs; a hold past its limit lets the lock lapse."""
    store = WorkerStore(client, Settings(key_prefix="t", batch_lock_ttl_s=0.4, worker_heartbeat_s=0.05))
    beat = Heartbeat(store, "w1", 0.05, CAPABILITIES, hold_limit_s=0.5)
    for batch_id, token in (("B1", "t1"), ("B2", "t2")):
        client.set(store.keys.batch_lock(batch_id), token, px=150)
        beat.hold(batch_id, token)
    beat.start()
    try:
        time.sleep(0.3)
        assert sorted(beat.held) == ["B1", "B2"]
        assert client.get(store.keys.batch_lock("B1")) == "t1" and client.get(store.keys.batch_lock("B2")) == "t2"
        beat.release("B2", "t2")
        time.sleep(0.5)
        assert beat.held == []  # B1's hold reached its limit
        time.sleep(0.5)  # batch_lock_ttl_s after its last renewal, the lock lapsed
        assert client.get(store.keys.batch_lock("B1")) is None
    finally:
        beat.stop()


def test_updated_capabilities_are_announced_at_once(client: fakeredis.FakeRedis, settings: Settings) -> None:
    """A worker that loaded or evicted a model announces it at once, not at its next beat."""
    store = WorkerStore(client, settings)
    beat = Heartbeat(store, "w1", 60, CAPABILITIES)
    beat.update(CAPABILITIES.model_copy(update={"pipeline": "before the start"}))  # not started: nothing written
    assert client.hget(store.keys.capabilities, "w1") is None
    beat.start()
    try:
        evicted = CAPABILITIES.model_copy(update={"resident": False, "load_s": 1.5})
        beat.update(evicted)
        assert WorkerCapabilities.model_validate_json(client.hget(store.keys.capabilities, "w1")) == evicted
    finally:
        beat.stop()


def test_a_beat_that_finds_the_worker_swept_runs_the_rejoin_tasks_once(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    """The first beat announces the worker; a later one that finds it swept (a beat came later than worker_ttl_s)
    runs the rejoin tasks before the after-beat ones, once; so does the beat after an ``update`` that found it so."""
    store = WorkerStore(client, settings)
    beat = Heartbeat(store, "w1", 60, CAPABILITIES)
    ran: list[str] = []
    beat.after_rejoin(lambda: ran.append("rejoin"))
    beat.after_beat(lambda: ran.append("beat"))
    beat._beat()  # the first: announced anew, but nothing was swept
    beat._beat()
    assert ran == ["beat", "beat"]
    client.zrem(store.keys.workers, "w1")  # swept by free_slots.lua
    beat._beat()
    beat._beat()
    assert ran[2:] == ["rejoin", "beat", "beat"]
    beat.start()
    try:
        client.zrem(store.keys.workers, "w1")
        beat.update(CAPABILITIES.model_copy(update={"resident": False}))  # this one announces it anew
        beat._beat()
        assert ran[5:] == ["beat", "rejoin", "beat"]  # the start's beat, then the rejoin at the next one
    finally:
        beat.stop()
