"""The Lua state transitions of shared.keys, driven through the worker and scheduler stores on fakeredis."""

from __future__ import annotations

import time
from dataclasses import dataclass

import fakeredis
import pytest

from gpu_worker.store import Claimed, Locked, RowSignal, WorkerStore
from scheduler.lease import Lease
from scheduler.store import LeaseLost, Reaped, SchedulerStore
from shared import keys as k
from shared.contracts import BatchMessage, ErrorInfo, RequestSpec, RequestStatus
from shared.results.redis_store import RedisResultStore
from shared.settings import Settings
from shared.submit_call import SubmitGroup, SubmitRow, submit_call, submit_outcomes


@pytest.fixture
def settings() -> Settings:
    return Settings(key_prefix="t", max_batch_attempts=2, batch_lock_ttl_s=5)


def submit(
    client: fakeredis.FakeRedis,
    keys: k.RedisKeys,
    *ids: str,
    max_len: int = 100,
    key: str = "",
    max_queued: int = 0,
    share: str = "",
    **spec_fields: object,
) -> int:
    """``submit.lua`` for requests whose ids are also their prompts; under API key ``key`` ('' = none), with its
    ``max_queued`` (0 = the key has none); ``spec_fields`` replace the defaults of their specs (64x64, 4 steps,
    guidance 5)."""
    rows = []
    for rid in ids:
        defaults: dict[str, object] = {"width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 5.0}
        fields = {"id": rid, "model": "demo", "prompt": rid, "seed": 1, "created_at": time.time()}
        spec = RequestSpec.model_validate(fields | defaults | spec_fields)
        rows.append(SubmitRow(rid, spec.model_dump_json(), spec.created_at))
    group = SubmitGroup(tuple(rows), key, max_queued or None, float(share) if share else 1.0)
    call_keys, args = submit_call(keys, [group], max_queue_len=max_len, set_ttl_s=60, max_input_bytes=None)
    script = client.register_script(k.SUBMIT)
    (outcome,) = script(keys=call_keys, args=args)
    return int(outcome)


def status(client: fakeredis.FakeRedis, keys: k.RedisKeys, rid: str) -> str:
    return str(client.hget(keys.request(rid), "status"))


@pytest.fixture
def scheduled(client: fakeredis.FakeRedis, settings: Settings) -> tuple[SchedulerStore, Lease, list[str]]:
    store = SchedulerStore(client, settings)
    submit(client, store.keys, "a", "b", "c")
    lease = Lease(client, store.keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    return store, lease, store.schedule(lease.key, lease.token, "B1", ["a", "b", "c"])


def test_submit_refuses_a_full_queue_as_a_whole(client: fakeredis.FakeRedis) -> None:
    keys = k.RedisKeys("t")
    assert submit(client, keys, "a", "b", max_len=3) == 1
    assert submit(client, keys, "c", "d", max_len=3) == 0
    assert client.xlen(keys.requests) == 2
    assert not client.exists(keys.request("c"))


def row(rid: str, image: bytes = b"", webhook: str = "") -> SubmitRow:
    spec = RequestSpec(id=rid, model="demo", prompt=rid, seed=1, width=64, height=64, created_at=time.time())
    return SubmitRow(rid, spec.model_dump_json(), spec.created_at, image=image, webhook_url=webhook,
                     webhook_on=" succeeded " if webhook else "")  # fmt: skip


def test_submit_takes_groups_in_order_each_accepted_or_refused_alone(client: fakeredis.FakeRedis) -> None:
    keys = k.RedisKeys("t")
    groups = [
        SubmitGroup((row("a"), row("b"))),
        SubmitGroup((row("c"), row("d")), key_name="k1", max_queued=1),  # the key's max queued: refused
        SubmitGroup((row("e"),), key_name="k1", max_queued=1, share=2.0),
        SubmitGroup((row("f"), row("g"))),  # the queue (4) holds a, b, e: no room for two more
        SubmitGroup((row("h", image=b"x" * 6), row("i", webhook="http://hook"))),  # room for 2 more? no: 1
        SubmitGroup((row("j", image=b"y" * 6),)),  # the budget (10) holds 6 of j's: accepted
    ]
    call_keys, args = submit_call(keys, groups, max_queue_len=4, set_ttl_s=60, max_input_bytes=10)
    reply = client.register_script(k.SUBMIT)(keys=call_keys, args=args)
    assert submit_outcomes(reply) == ["accepted", "max_queued", "accepted", "queue_full", "queue_full", "accepted"]
    assert [e[1]["id"] for e in client.xrange(keys.requests)] == ["a", "b", "e", "j"]
    assert all(not client.exists(keys.request(rid)) for rid in "cdfghi")
    assert client.hmget(keys.request("e"), ["key", "share", "status"]) == ["k1", "2.0", "queued"]
    assert client.smembers(keys.api_key_unfinished("k1")) == {keys.request("e")}
    assert client.get(keys.input_bytes) == "6" and client.hget(keys.request("j"), "input_bytes") == "6"
    assert [e[1] for e in client.xrange(keys.request_events("j"))] == [{"event": "queued"}]


def test_submit_checks_each_group_against_the_budget_the_groups_before_it_left(client: fakeredis.FakeRedis) -> None:
    keys = k.RedisKeys("t")
    groups = [SubmitGroup((row("a", image=b"x" * 6),)), SubmitGroup((row("b", image=b"x" * 6),)),
              SubmitGroup((row("c", image=b"x" * 4), row("d", webhook="http://hook")))]  # fmt: skip
    call_keys, args = submit_call(keys, groups, max_queue_len=100, set_ttl_s=60, max_input_bytes=10)
    reply = client.register_script(k.SUBMIT)(keys=call_keys, args=args)
    assert submit_outcomes(reply) == ["accepted", "input_budget", "accepted"]
    assert client.get(keys.input_bytes) == "10"
    assert client.hmget(keys.request("d"), ["webhook", "webhook_on"]) == ["http://hook", " succeeded "]
    assert client.hget(keys.request("c"), "webhook") is None


def test_schedule_moves_only_queued_unaborted_requests(client: fakeredis.FakeRedis, settings: Settings) -> None:
    store = SchedulerStore(client, settings)
    submit(client, store.keys, "a", "b", "c")
    client.register_script(k.ABORT)(keys=k.abort_keys(store.keys, "b"), args=[time.time(), 60, "ch", "b"])
    lease = Lease(client, store.keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    assert store.schedule(lease.key, lease.token, "B1", ["a", "b", "c"]) == ["a", "c"]
    assert status(client, store.keys, "a") == "scheduled"
    assert client.hget(store.keys.request("c"), "batch_size") == "2"
    assert status(client, store.keys, "b") == "aborted"
    # a request never joins a second batch
    assert store.schedule(lease.key, lease.token, "B2", ["a", "c"]) == []
    assert client.hget(store.keys.request("a"), "batch_id") == "B1"
    assert client.hget(store.keys.batch("B1"), "ids") == "a c"


def test_schedule_is_fenced_by_the_lease(client: fakeredis.FakeRedis, settings: Settings) -> None:
    store = SchedulerStore(client, settings)
    submit(client, store.keys, "a")
    stale = Lease(client, store.keys.scheduler_lease, 5000)
    with pytest.raises(LeaseLost):
        store.schedule(stale.key, stale.token, "B1", ["a"])
    assert status(client, store.keys, "a") == "queued"


def test_claim_locks_counts_attempts_and_runs_only_its_requests(
    client: fakeredis.FakeRedis, settings: Settings, scheduled: tuple[SchedulerStore, Lease, list[str]]
) -> None:
    worker = WorkerStore(client, settings)
    batch = BatchMessage(batch_id="B1", request_ids=("a", "b", "c"), created_at=0.0)
    claim = worker.claim(batch, "tok1", "w1")
    assert isinstance(claim, Claimed)
    assert claim.attempts == 1 and claim.running == ["a", "b", "c"]
    assert [spec.id for spec in claim.specs] == ["a", "b", "c"]
    assert isinstance(worker.claim(batch, "tok2", "w2"), Locked)
    worker.record_results(["a/tok1/0.png", "c/tok3/0.png"])
    finished = worker.finish_many({"a": ["a/tok1/0.png"]}, {"b": ErrorInfo(type="ValueError", message="bad")}, "tok1")
    assert finished == {"a": RequestStatus.SUCCEEDED, "b": RequestStatus.FAILED}
    assert not worker.batch_done("B1", "tok1")  # c is unfinished: the batch stays in flight for the reaper
    assert client.zscore(worker.keys.inflight, "B1") is not None
    # a later delivery re-runs only what is unfinished, under a new claim
    again = worker.claim(batch, "tok3", "w2")
    assert isinstance(again, Claimed) and again.running == ["c"] and again.attempts == 2
    assert [spec.id for spec in again.specs] == ["c"]
    assert status(client, worker.keys, "a") == "succeeded"
    assert worker.finish_many({"c": ["c/tok3/0.png"]}, {}, "tok3") == {"c": RequestStatus.SUCCEEDED}
    assert client.hget(worker.keys.request("c"), "results") == "c/tok3/0.png"
    assert worker.batch_done("B1", "tok3")
    assert client.zscore(worker.keys.inflight, "B1") is None
    assert 0 < client.ttl(worker.keys.batch("B1")) <= settings.result_ttl_s


def _wake_ups(client: fakeredis.FakeRedis, keys: k.RedisKeys) -> list[str]:
    return [str(fields["type"]) for _, fields in client.xrange(keys.events)]


def test_batch_done_wakes_the_scheduler_only_when_the_batch_held_a_slot_until_then(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    """A batch whose forward_done freed (and announced) its slot leaves flight without a second wake-up: its
    leaving changes no free-slot count; one that never freed it (no forward ended) wakes the scheduler."""
    store = SchedulerStore(client, settings)
    worker = WorkerStore(client, settings)
    submit(client, store.keys, "a", "b")
    lease = Lease(client, store.keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    for batch_id, rid in (("B1", "a"), ("B2", "b")):
        assert store.schedule(lease.key, lease.token, batch_id, [rid]) == [rid]
        assert isinstance(
            worker.claim(BatchMessage(batch_id=batch_id, request_ids=(rid,), created_at=0.0), "t", "w"), Claimed
        )
    client.delete(store.keys.events)
    assert worker.forward_done("B1", "t") and _wake_ups(client, worker.keys) == ["slot_free"]
    free = store.free_slots()
    assert worker.finish_many({"a": []}, {}, "t") == {"a": RequestStatus.SUCCEEDED}
    assert worker.batch_done("B1", "t")
    assert _wake_ups(client, worker.keys) == ["slot_free"] and store.free_slots() == free
    assert worker.finish_many({}, {"b": ErrorInfo(type="E", message="x")}, "t") == {"b": RequestStatus.FAILED}
    assert worker.batch_done("B2", "t")  # its slot frees only now
    assert _wake_ups(client, worker.keys) == ["slot_free", "batch_done"] and store.free_slots() == free + 1


def test_finish_ends_a_claims_requests_in_one_call_and_fails_a_swept_image_result_lost(
    client: fakeredis.FakeRedis, settings: Settings, scheduled: tuple[SchedulerStore, Lease, list[str]]
) -> None:
    """One ``finish.lua`` call ends every request it is given: a succeeded one whose images are all journaled keeps
    them (due with the request), one whose image left the journal (swept) fails ``ResultLost`` and its keys fall due
    at once, the metrics count each outcome once and one message on the finished channel names the ended ones; a
    request of another claim is left as it is."""
    worker = WorkerStore(client, settings)
    batch = BatchMessage(batch_id="B1", request_ids=("a", "b", "c"), created_at=0.0)
    assert isinstance(worker.claim(batch, "tok1", "w1"), Claimed)
    worker.record_results(["a/tok1/0.png", "a/tok1/1.png", "b/tok1/0.png"])  # b's second image: never journaled
    client.hset(worker.keys.request("c"), "claim", "other")
    with client.pubsub() as sub:
        sub.subscribe(worker.keys.finished)
        finished = worker.finish_many(
            {"a": ["a/tok1/0.png", "a/tok1/1.png"], "b": ["b/tok1/0.png", "b/tok1/1.png"], "c": []}, {}, "tok1"
        )
        woken = [m["data"] for m in iter(lambda: sub.get_message(timeout=0.1), None) if m["type"] == "message"]
    assert finished == {"a": RequestStatus.SUCCEEDED, "b": RequestStatus.FAILED, "c": RequestStatus.RUNNING}
    assert woken == ["a b"]  # one wake-up message for the call, naming every request it ended
    assert client.hget(worker.keys.request("a"), "results") == "a/tok1/0.png a/tok1/1.png"
    b = client.hgetall(worker.keys.request("b"))
    assert b["error_type"] == "ResultLost" and "b/tok1/1.png" in b["error_message"] and "results" not in b
    now_ms = time.time() * 1000
    assert client.zscore(worker.keys.results_journal, "a/tok1/1.png") > now_ms + settings.result_ttl_s * 500
    assert client.zscore(worker.keys.results_journal, "b/tok1/0.png") <= now_ms  # due at once
    assert client.zscore(worker.keys.results_journal, "b/tok1/1.png") is None  # never added back
    metrics = client.hgetall(worker.keys.metrics)
    assert metrics["finished:succeeded"] == "1" and metrics["finished:failed"] == "1"
    assert metrics["failed:ResultLost"] == "1"


def test_batch_done_with_what_the_run_saw_reads_only_the_requests_it_did_not_see_end(
    client: fakeredis.FakeRedis, settings: Settings, scheduled: tuple[SchedulerStore, Lease, list[str]]
) -> None:
    """``batch_done`` given the run's statuses takes the batch's ids from them and trusts the terminal ones (a
    terminal status never changes); one it saw unfinished is read, and while it is the batch stays in flight."""
    worker = WorkerStore(client, settings)
    batch = BatchMessage(batch_id="B1", request_ids=("a", "b", "c"), created_at=0.0)
    assert isinstance(worker.claim(batch, "tok1", "w1"), Claimed)
    seen: dict[str, RequestStatus | None] = {**worker.finish_many({"a": [], "b": []}, {}, "tok1")}
    seen["c"] = RequestStatus.RUNNING
    assert not worker.batch_done("B1", "tok1", seen)  # c is unfinished: in flight for the reaper
    again = worker.claim(batch, "tok2", "w1")
    assert isinstance(again, Claimed) and again.running == ["c"]
    seen |= worker.finish_many({"c": []}, {}, "tok2")
    client.hset(worker.keys.request("a"), "status", "running")  # never happens: shows a's hash is not read
    assert worker.batch_done("B1", "tok2", seen)
    assert client.zscore(worker.keys.inflight, "B1") is None


def test_poison_batch_fails_after_max_attempts(
    client: fakeredis.FakeRedis, settings: Settings, scheduled: tuple[SchedulerStore, Lease, list[str]]
) -> None:
    worker = WorkerStore(client, settings)
    batch = BatchMessage(batch_id="B1", request_ids=("a",), created_at=0.0)
    for attempt in range(settings.max_batch_attempts):
        claim = worker.claim(batch, f"tok{attempt}", "w")
        assert isinstance(claim, Claimed) and claim.running == ["a"]
        client.delete(worker.keys.batch_lock("B1"))  # the worker died: its lock lapsed
    last = worker.claim(batch, "last", "w")
    assert isinstance(last, Claimed) and last.statuses["a"] is RequestStatus.FAILED
    assert client.hget(worker.keys.request("a"), "error_type") == "WorkerLost"


@dataclass
class Runs:
    """Batch B1 of a, b, c, d, claimed run by run: ``claim`` takes it under a token, ``die`` loses the run (its
    worker died: its lock lapses, the reaper publishes the batch again)."""

    client: fakeredis.FakeRedis
    store: SchedulerStore
    worker: WorkerStore

    @classmethod
    def of_four(cls, client: fakeredis.FakeRedis, settings: Settings) -> Runs:
        runs = cls(client, SchedulerStore(client, settings), WorkerStore(client, settings))
        submit(client, runs.store.keys, "a", "b", "c", "d")
        lease = Lease(client, runs.store.keys.scheduler_lease, 5000)
        assert lease.try_acquire()
        runs.store.schedule(lease.key, lease.token, "B1", ["a", "b", "c", "d"])
        return runs

    def claim(self, token: str) -> Claimed:
        claimed = self.worker.claim(BatchMessage(batch_id="B1", request_ids=tuple("abcd"), created_at=0.0), token, "w")
        assert isinstance(claimed, Claimed)
        return claimed

    def die(self) -> None:
        self.client.delete(self.worker.keys.batch_lock("B1"))
        assert self.store.reap().republish == ["B1"]


def test_a_lost_run_is_rerun_in_halves_until_only_the_request_that_kills_its_worker_fails(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    runs = Runs.of_four(client, settings)
    store, worker, claim, die = runs.store, runs.worker, runs.claim, runs.die  # the run of c kills its worker
    assert claim("t1").running == ["a", "b", "c", "d"]
    die()
    assert claim("t2").running == ["a", "b"]  # c and d are put aside, fenced from the lost run
    assert worker.finish_many({"d": []}, {}, "t1") == {"d": RequestStatus.RUNNING}
    succeeded = RequestStatus.SUCCEEDED
    assert worker.finish_many({"a": [], "b": []}, {}, "t2") == {"a": succeeded, "b": succeeded}
    assert not worker.batch_done("B1", "t2")
    assert store.reap().republish == ["B1"]  # what was put aside runs next
    assert claim("t3").running == ["c", "d"]
    die()
    assert claim("t4").running == ["c"]
    die()
    assert claim("t5").running == ["c"]  # lost once alone: again alone
    die()
    last = claim("t6")  # c was lost 4 times, 2 of them alone (max_batch_attempts 2): it fails, d runs
    assert last.running == ["d"] and last.statuses["c"] is RequestStatus.FAILED and last.attempts == 6
    failed = client.hmget(worker.keys.request("c"), ["error_type", "error_message"])
    assert failed[0] == "WorkerLost" and "killed the worker 2 times running alone" in str(failed[1]), failed
    assert client.hmget(worker.keys.batch("B1"), ["lost:c", "lost_alone:c", "lost:d", "lost_alone:d"]) == [
        "4",
        "2",
        "2",
        None,
    ]
    assert worker.finish_many({"d": []}, {}, "t6") == {"d": RequestStatus.SUCCEEDED}
    assert worker.batch_done("B1", "t6")
    assert client.zscore(worker.keys.inflight, "B1") is None


def test_a_request_lost_with_others_then_once_alone_through_no_fault_of_its_own_runs_again(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    """Culprit a (max_batch_attempts 2): b, lost with it twice, first runs alone after a failed; a restart of the
    worker kills that run. b is run alone again and succeeds (before: it failed WorkerLost at once)."""
    runs = Runs.of_four(client, settings)
    for token, running in [("t1", "abcd"), ("t2", "ab"), ("t3", "a"), ("t4", "a")]:
        assert runs.claim(token).running == list(running)
        runs.die()
    fifth = runs.claim("t5")  # a was lost twice alone: it fails, b (put aside last) runs alone
    assert fifth.statuses["a"] is RequestStatus.FAILED and fifth.running == ["b"]
    runs.die()  # a deploy restart
    assert runs.claim("t6").running == ["b"]
    assert runs.worker.finish_many({"b": []}, {}, "t6") == {"b": RequestStatus.SUCCEEDED}
    assert client.hmget(runs.worker.keys.batch("B1"), ["lost:b", "lost_alone:b", "ran"]) == ["3", "1", "1"]
    assert not runs.worker.batch_done("B1", "t6")  # c and d wait: released for them
    # the one row a run left unfinished (it finished c, then died) was not lost alone
    assert runs.claim("t7").running == ["c", "d"]
    assert runs.worker.finish_many({"c": []}, {}, "t7") == {"c": RequestStatus.SUCCEEDED}
    runs.die()
    assert runs.claim("t8").running == ["d"]
    assert client.hget(runs.worker.keys.batch("B1"), "lost_alone:d") is None


def test_a_request_put_aside_by_the_split_is_aborted_at_once(client: fakeredis.FakeRedis, settings: Settings) -> None:
    """Put aside, it runs nowhere (running, no claim): an abort ends it now, not after the other half has run; a
    late writer of the lost run cannot change it, and the batch is done once its running half is."""
    runs = Runs.of_four(client, settings)
    keys, worker = runs.worker.keys, runs.worker
    assert runs.claim("t1").running == ["a", "b", "c", "d"]
    runs.die()
    assert runs.claim("t2").running == ["a", "b"]  # c and d put aside
    client.hset(keys.request("c"), "webhook_on", " aborted ")
    abort = client.register_script(k.ABORT)
    with client.pubsub() as sub:
        sub.subscribe(keys.finished)
        assert abort(keys=k.abort_keys(keys, "c"), args=[time.time(), 60, keys.finished, "c"]) == "aborted"
        woken = [m["data"] for m in iter(lambda: sub.get_message(timeout=0.1), None) if m["type"] == "message"]
    assert woken == ["c"]
    assert status(client, keys, "c") == "aborted" and 0 < client.ttl(keys.request("c")) <= 60
    assert [e["event"] for _, e in client.xrange(keys.request_events("c"))][-1] == "aborted"
    assert [e["event"] for _, e in client.xrange(keys.webhooks)] == ["aborted"]
    assert client.hget(keys.metrics, "aborted:running") == "1"
    assert abort(keys=k.abort_keys(keys, "a"), args=[time.time(), 60, keys.finished, "a"]) == "running"
    assert worker.finish_many({"c": []}, {}, "t1") == {"c": RequestStatus.ABORTED}  # the lost run's late writer
    aborted, succeeded = RequestStatus.ABORTED, RequestStatus.SUCCEEDED
    assert worker.finish_many({"a": [], "b": []}, {}, "t2") == {"a": aborted, "b": succeeded}
    assert status(client, keys, "d") == "running"  # d still waits for its turn
    assert not worker.batch_done("B1", "t2")


def test_a_rerun_clears_the_eviction_mark_a_dead_runs_orphan_left(settings: Settings) -> None:
    """Run t1 stores a's image and dies; the cap drops that object while a's claim is still t1 (marked evicted);
    t2 re-runs a and succeeds: its images are served, not answered 410."""
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server, decode_responses=True)
    runs = Runs.of_four(client, settings)
    keys = runs.worker.keys
    results = RedisResultStore(fakeredis.FakeRedis(server=server), keys, max_bytes=100, keep_s=60)
    assert runs.claim("t1").running == ["a", "b", "c", "d"]
    results.put("a/t1/0.png", b"a" * 60)  # then the worker dies
    results.put("z/t9/0.png", b"z" * 60)  # 120 > 100: a's object goes, while t1 is still a's claim
    assert client.hexists(keys.request("a"), "evicted_at")
    runs.die()
    assert runs.claim("t2").running == ["a", "b"]
    assert not client.hexists(keys.request("a"), "evicted_at")  # the mark described the dead run's object
    runs.worker.record_results(["a/t2/0.png"])
    results.put("a/t2/0.png", b"A" * 30)
    assert runs.worker.finish_many({"a": ["a/t2/0.png"]}, {}, "t2") == {"a": RequestStatus.SUCCEEDED}
    assert not client.hexists(keys.request("a"), "evicted_at") and results.get("a/t2/0.png") == b"A" * 30


def test_abort_flag_wins_over_success_and_status_never_moves_back(
    client: fakeredis.FakeRedis, settings: Settings, scheduled: tuple[SchedulerStore, Lease, list[str]]
) -> None:
    worker = WorkerStore(client, settings)
    worker.claim(BatchMessage(batch_id="B1", request_ids=("a", "b"), created_at=0.0), "tok", "w")
    abort = client.register_script(k.ABORT)
    assert abort(keys=k.abort_keys(worker.keys, "a"), args=[time.time(), 60, "ch", "a"]) == "running"
    assert worker.progress(["a", "b"], 1, 4, "tok") == [RowSignal.ABORTED, RowSignal.GO_ON]
    assert client.hget(worker.keys.request("b"), "step") == "1"
    worker.record_results(["a/tok/0.png", "b/tok/0.png"])
    assert worker.finish_many({"a": ["a/tok/0.png"]}, {}, "tok") == {"a": RequestStatus.ABORTED}
    assert not client.hexists(worker.keys.request("a"), "results")
    journal = worker.keys.results_journal
    assert client.zscore(journal, "a/tok/0.png") <= time.time() * 1000  # an aborted run's images are due at once
    assert worker.finish_many({"b": ["b/tok/0.png"]}, {}, "tok") == {"b": RequestStatus.SUCCEEDED}
    late = worker.finish_many({}, {"b": ErrorInfo(type="X", message="late")}, "tok")
    assert late == {"b": RequestStatus.SUCCEEDED}
    assert abort(keys=k.abort_keys(worker.keys, "b"), args=[time.time(), 60, "ch", "b"]) == "succeeded"
    assert abort(keys=k.abort_keys(worker.keys, "missing"), args=[time.time(), 60, "ch", "missing"]) is None
    assert client.zscore(journal, "b/tok/0.png") > (time.time() + 50) * 1000  # kept with the request (ttl 60 s)


def test_lease_is_exclusive_and_released_only_by_its_owner(client: fakeredis.FakeRedis) -> None:
    first, second = Lease(client, "lease", 5000), Lease(client, "lease", 5000)
    assert first.try_acquire() and not second.try_acquire()
    second.release()
    assert first.renew()
    first.release()
    assert second.try_acquire()


def test_a_claimed_batch_whose_lock_lapsed_is_republished_once_per_claim(
    client: fakeredis.FakeRedis, settings: Settings, scheduled: tuple[SchedulerStore, Lease, list[str]]
) -> None:
    store = scheduled[0]
    worker = WorkerStore(client, settings)
    batch = BatchMessage(batch_id="B1", request_ids=("a", "b", "c"), created_at=0.0)
    assert store.reap().republish == []  # published a moment ago, not claimed yet: waiting for a worker
    worker.claim(batch, "tok", "w1")
    assert store.reap().republish == []  # running under a live lock
    client.delete(worker.keys.batch_lock("B1"))  # the worker died; its lock lapsed
    assert store.reap().republish == ["B1"]
    assert store.reap().republish == []  # already republished since that claim
    second = worker.claim(batch, "tok2", "w2")  # the lost run is split: this claim runs its first half
    assert isinstance(second, Claimed) and second.running == ["a", "b"]
    worker.finish_many({"a": [], "b": []}, {}, "tok2")
    assert not worker.batch_done("B1", "tok2")
    assert store.reap().republish == ["B1"]  # c was put aside: the batch is published again for it
    third = worker.claim(batch, "tok3", "w1")
    assert isinstance(third, Claimed) and third.running == ["c"]
    worker.finish_many({"c": []}, {}, "tok3")
    worker.batch_done("B1", "tok3")
    assert store.reap() == Reaped(republish=[], removed=0)  # finished batches are not in flight


def test_the_aborted_set_is_taken_at_a_leads_first_read_and_when_an_abort_wakes_the_scheduler(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    """abort.lua adds a ``queue_abort`` wake-up with each id it puts in the aborted set: a read takes the set after
    one (no SPOP in a round without aborts), and the wake-up alone says nothing changed about capacity."""
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    submit(client, store.keys, "a", "b", "c")
    client.sadd(store.keys.scheduler_aborted, "left-by-a-dead-leader")
    first = store.read_new(block_ms=1)
    assert [e.request_id for e in first.entries] == ["a", "b", "c"] and first.aborted == ["left-by-a-dead-leader"]
    client.sadd(store.keys.scheduler_aborted, "no-wake-up")  # not how an id arrives: shows the read does not SPOP
    assert store.read_new(block_ms=1).aborted == []
    abort = client.register_script(k.ABORT)
    assert abort(keys=k.abort_keys(store.keys, "b"), args=[time.time(), 60, store.keys.finished, "b"]) == "aborted"
    woken = store.read_new(block_ms=1)
    assert sorted(woken.aborted) == ["b", "no-wake-up"] and not woken.woken
    assert client.xlen(store.keys.events) == 1  # acknowledged, kept until trimmed


def test_finish_drops_the_inputs_of_an_image_request_beside_requests_known_to_hold_none(
    client: fakeredis.FakeRedis, settings: Settings, scheduled: tuple[SchedulerStore, Lease, list[str]]
) -> None:
    """``no_inputs`` names the requests whose spec needs no input image: their ending deletes no input fields; a
    request it does not name has its images dropped and their bytes given back, as always."""
    worker = WorkerStore(client, settings)
    batch = BatchMessage(batch_id="B1", request_ids=("a", "b", "c"), created_at=0.0)
    assert isinstance(worker.claim(batch, "tok1", "w1"), Claimed)
    client.hset(worker.keys.request("a"), mapping={"input_image": b"x" * 5, "input_bytes": 5})
    client.set(worker.keys.input_bytes, 5)
    ended = worker.finish_many({"a": [], "b": [], "c": []}, {}, "tok1", no_inputs={"b", "c"})
    assert ended == dict.fromkeys("abc", RequestStatus.SUCCEEDED)
    assert not client.hexists(worker.keys.request("a"), "input_image")
    assert client.get(worker.keys.input_bytes) == "0"


def test_finish_writes_the_forwards_last_step_with_the_ending_and_its_event_before_the_terminal_one(
    client: fakeredis.FakeRedis, settings: Settings, scheduled: tuple[SchedulerStore, Lease, list[str]]
) -> None:
    """The step reporter left the last step to the ending (``progress``): each request that ends succeeded or failed
    records it, and gets the ``progress`` event (and the webhook entry it subscribed to) just before its terminal
    event, unless its step already was that one; an aborted one gets no step."""
    worker = WorkerStore(client, settings)
    keys = worker.keys
    batch = BatchMessage(batch_id="B1", request_ids=("a", "b", "c"), created_at=0.0)
    assert isinstance(worker.claim(batch, "tok1", "w1"), Claimed)
    client.hset(keys.request("a"), "webhook_on", " progress completed ")
    worker.progress(["b"], 4, 4, "tok1")  # b's last step was written already
    client.hset(keys.request("c"), "abort", "1")
    hooks_before = client.xlen(keys.webhooks)
    ended = worker.finish_many({"a": [], "b": [], "c": []}, {}, "tok1", progress=(4, 4))
    assert ended == {"a": RequestStatus.SUCCEEDED, "b": RequestStatus.SUCCEEDED, "c": RequestStatus.ABORTED}
    events = {rid: [fields for _, fields in client.xrange(keys.request_events(rid))] for rid in "abc"}
    assert events["a"][-2:] == [{"event": "progress", "step": "4", "total": "4"}, {"event": "succeeded"}]
    assert [fields["event"] for fields in events["b"]].count("progress") == 1 and events["b"][-1]["event"] == (
        "succeeded"
    )
    assert "progress" not in [fields["event"] for fields in events["c"]]
    assert client.hmget(keys.request("a"), ["step", "total"]) == ["4", "4"]
    assert client.hmget(keys.request("c"), ["step", "total"]) == ["0", None]  # as its claim left it
    hooks = [fields for _, fields in client.xrange(keys.webhooks)][hooks_before:]
    assert [(fields["id"], fields["event"], fields.get("step")) for fields in hooks] == [("a", "progress", "4")]


def test_the_owner_rides_on_the_stream_entry_and_survives_a_requeue(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    keys = k.RedisKeys(settings.key_prefix)
    assert submit(client, keys, "mine", key="alice", share="2.5") == 1
    assert submit(client, keys, "theirs", key="bob") == 1
    assert submit(client, keys, "anon") == 1
    store = SchedulerStore(client, settings)
    store.ensure_groups()
    entries = {e.request_id: e for e in store.read_new(block_ms=0).entries}
    assert (entries["mine"].owner, entries["mine"].share) == ("alice", 2.5)
    assert (entries["theirs"].owner, entries["theirs"].share) == ("bob", 1.0)
    assert (entries["anon"].owner, entries["anon"].share) == ("", 1.0)
    assert client.hget(keys.request("mine"), "share") == "2.5"
    # step-mode preemption's requeue copies the owner from the hash into the new entry
    client.hset(keys.request("mine"), mapping={"status": RequestStatus.RUNNING.value, "claim": "tok"})
    requeue = client.register_script(k.REQUEUE)
    stride = keys.request_keys("mine")
    step_keys = [keys.requests, keys.step_rows, keys.step_levels("w"), keys.events, keys.metrics, *stride]
    assert requeue(keys=step_keys, args=["tok", "w", "mine", k.EVENTS_MAXLEN]) == 1
    again = [e for e in store.read_new(block_ms=0).entries if e.request_id == "mine"]
    assert again and again[0].requeued and (again[0].owner, again[0].share) == ("alice", 2.5)
