"""The batch executor on fakeredis: every way a run can go wrong still ends each request, and says why.

The runners here are small stand-ins for a pipeline (the executor is what is under test); Redis is fakeredis
with the real Lua scripts.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace

import fakeredis
import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded
from PIL import Image

from gpu_worker.executor import BatchExecutor, BatchOutcome
from gpu_worker.runner import Runner, StepCallback
from gpu_worker.store import Claimed, Locked, WorkerStore
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared.celery_config import queues_in_fleet_redis
from shared.compat import compat_key
from shared.contracts import BatchMessage, ErrorInfo, RequestSpec, RequestStatus, Task, WorkerCapabilities
from shared.results import ResultStoreError
from shared.results.filesystem import FilesystemResultStore
from shared.settings import Settings
from tests.unit.test_scripts import submit


@pytest.fixture
def settings() -> Settings:
    return Settings(key_prefix="t", max_batch_attempts=3, batch_lock_ttl_s=5, result_ttl_s=60)


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


_RESULTS: dict[str, FilesystemResultStore] = {}


@pytest.fixture(autouse=True)
def results(tmp_path: Path) -> Iterator[FilesystemResultStore]:
    """The test's result store (a folder of its ``tmp_path``), used by every executor it builds."""
    _RESULTS["store"] = FilesystemResultStore(tmp_path / "results")
    yield _RESULTS["store"]
    _RESULTS.clear()


def executor(
    client: fakeredis.FakeRedis, settings: Settings, runner: object, worker: str = "w1", **options: float
) -> BatchExecutor:
    """A worker's executor on ``client``, storing images in the test's result store."""
    store = WorkerStore(client, settings)
    return BatchExecutor(store, runner, worker, None, _RESULTS["store"], **options)  # type: ignore[arg-type]


def image() -> Image.Image:
    return Image.new("RGB", (8, 8), (10, 20, 30))


class ScriptedRunner(Runner):
    """Returns one image per request, except for prompts that ask otherwise; records each forward's size."""

    fused = True

    def __init__(self, oom_above: int | None = None) -> None:
        self.forwards: list[int] = []
        self.released = 0
        self.oom_above = oom_above

    def release_memory(self) -> None:
        self.released += 1

    def run(self, specs: Sequence[RequestSpec], on_step: StepCallback) -> list[list[object]]:
        self.forwards.append(len(specs))
        if self.oom_above is not None and len(specs) > self.oom_above:
            raise MemoryError(f"out of memory with {len(specs)} rows")
        for spec in specs:
            if "raise" in spec.prompt:
                raise ValueError(f"{spec.id} cannot be drawn")
            if "timeout" in spec.prompt:
                raise SoftTimeLimitExceeded()
        if any("short" in spec.prompt for spec in specs):
            return [[image()] for _ in specs[1:]]  # one list too few: nothing maps back
        outputs: list[list[object]] = []
        for spec in specs:
            if "garbage" in spec.prompt:
                outputs.append(["not an image"])
            elif "cmyk" in spec.prompt:
                outputs.append([Image.new("CMYK", (8, 8))])  # PNG cannot hold CMYK: encoding raises
            elif "none" in spec.prompt:
                outputs.append([])
            else:
                outputs.append([image()])
        return outputs


def scheduled_batch(client: fakeredis.FakeRedis, settings: Settings, prompts: list[str]) -> BatchMessage:
    """Submit one request per prompt (ids = prompts) and move them into batch B1, as the scheduler would."""
    keys = SchedulerStore(client, settings).keys
    submit(client, keys, *prompts)
    for rid in prompts:  # submit() uses the id as the prompt
        assert client.hget(keys.request(rid), "status") == "queued"
    store = SchedulerStore(client, settings)
    lease = Lease(client, keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    assert store.schedule(lease.key, lease.token, "B1", prompts) == prompts
    return BatchMessage(batch_id="B1", request_ids=tuple(prompts), created_at=time.time())


def run(client: fakeredis.FakeRedis, settings: Settings, prompts: list[str], runner: ScriptedRunner) -> BatchOutcome:
    batch = scheduled_batch(client, settings, prompts)
    outcome = executor(client, settings, runner).execute(batch)
    assert isinstance(outcome, BatchOutcome)
    return outcome


def error(client: fakeredis.FakeRedis, settings: Settings, rid: str) -> tuple[str, str]:
    raw = client.hmget(SchedulerStore(client, settings).keys.request(rid), ["error_type", "error_message"])
    return str(raw[0]), str(raw[1])


def in_flight(client: fakeredis.FakeRedis, settings: Settings) -> list[str]:
    return list(client.zrange(SchedulerStore(client, settings).keys.inflight, 0, -1))


def test_a_failing_request_fails_alone(client: fakeredis.FakeRedis, settings: Settings) -> None:
    runner = ScriptedRunner()
    outcome = run(client, settings, ["ok1", "raise", "ok2"], runner)
    assert outcome.statuses == {"ok1": "succeeded", "raise": "failed", "ok2": "succeeded"}
    assert error(client, settings, "raise") == ("ValueError", "raise cannot be drawn")
    assert runner.forwards == [3, 1, 1, 1]  # fused, then one by one
    assert in_flight(client, settings) == []


def test_output_that_maps_to_no_request_is_rerun_one_by_one(client: fakeredis.FakeRedis, settings: Settings) -> None:
    # today's main: zip(strict=True) raised outside every handler and left all three `running` forever
    outcome = run(client, settings, ["short", "ok1", "ok2"], ScriptedRunner())
    assert outcome.statuses == {"short": "failed", "ok1": "succeeded", "ok2": "succeeded"}
    assert error(client, settings, "short") == ("RunnerError", "runner returned 0 results for 1 requests")
    assert in_flight(client, settings) == []


def test_unusable_images_fail_their_request_only(client: fakeredis.FakeRedis, settings: Settings) -> None:
    outcome = run(client, settings, ["garbage", "cmyk", "none", "ok"], ScriptedRunner())
    assert outcome.statuses == {"garbage": "failed", "cmyk": "failed", "none": "failed", "ok": "succeeded"}
    assert error(client, settings, "garbage") == ("RunnerError", "runner returned str instead of an image")
    assert error(client, settings, "none") == ("RunnerError", "runner returned 0 images, expected 1")
    kind, message = error(client, settings, "cmyk")
    assert kind == "RunnerError" and message.startswith("encoding the image failed: OSError")


class RefusingStore(FilesystemResultStore):
    """A filesystem store that refuses the images of requests whose id says ``refused``."""

    def put(self, key: str, data: bytes) -> None:
        if key.startswith("refused/"):
            raise ResultStoreError(f"storing {key} failed: disk full")
        super().put(key, data)


def test_images_go_to_the_result_store_and_a_refused_one_fails_alone(
    client: fakeredis.FakeRedis, settings: Settings, results: FilesystemResultStore
) -> None:
    batch = scheduled_batch(client, settings, ["ok", "refused", "ok2"])
    store = WorkerStore(client, settings)
    outcome = BatchExecutor(store, ScriptedRunner(), "w1", None, RefusingStore(results.root)).execute(batch)
    assert isinstance(outcome, BatchOutcome)
    assert outcome.statuses == {"ok": "succeeded", "refused": "failed", "ok2": "succeeded"}
    kind, message = error(client, settings, "refused")
    assert kind == "ResultStoreError" and "disk full" in message
    for rid in ("ok", "ok2"):
        (key,) = str(client.hget(store.keys.request(rid), "results")).split()
        assert key.startswith(f"{rid}/") and key.endswith(".png")
        data = results.get(key)
        assert data is not None and Image.open(io.BytesIO(data)).size == (8, 8)
    # every key was journaled before its object was written, the refused one too (it falls due: nothing to delete)
    journaled = set(client.zrange(store.keys.results_journal, 0, -1))
    assert {key.split("/")[0] for key in journaled} == {"ok", "refused", "ok2"}


class OneAtATimeRunner(ScriptedRunner):
    """A pipeline not known to take prompt lists: the worker must call it once per request."""

    fused = False


def test_an_unfused_runner_runs_a_batch_request_by_request(client: fakeredis.FakeRedis, settings: Settings) -> None:
    runner = OneAtATimeRunner()
    outcome = run(client, settings, ["ok1", "raise", "ok2"], runner)
    assert runner.forwards == [1, 1, 1]  # three forwards, never a fused one
    assert outcome.statuses == {"ok1": "succeeded", "raise": "failed", "ok2": "succeeded"}
    assert error(client, settings, "raise") == ("ValueError", "raise cannot be drawn")
    keys = SchedulerStore(client, settings).keys
    assert all(client.hget(keys.request(rid), "results") for rid in ("ok1", "ok2"))


def test_time_limit_fails_what_is_unfinished(client: fakeredis.FakeRedis, settings: Settings) -> None:
    outcome = run(client, settings, ["timeout", "ok"], ScriptedRunner())
    assert outcome.statuses == {"timeout": "failed", "ok": "failed"}
    assert error(client, settings, "ok")[0] == "SoftTimeLimitExceeded"
    assert in_flight(client, settings) == []


def test_out_of_memory_halves_the_batch_then_fails_only_what_never_fits(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    runner = ScriptedRunner(oom_above=2)
    outcome = run(client, settings, [f"r{i}" for i in range(5)], runner)
    assert set(outcome.statuses.values()) == {RequestStatus.SUCCEEDED}
    assert runner.forwards == [5, 3, 2, 1, 2]  # 5 -> 3 + 2 -> (2 + 1) + 2
    assert runner.released == 2

    client.flushall()
    alone = ScriptedRunner(oom_above=0)
    outcome = run(client, settings, ["huge", "huge2"], alone)
    assert outcome.statuses == {"huge": "failed", "huge2": "failed"}
    kind, message = error(client, settings, "huge")
    assert kind == "OutOfMemory" and "does not fit in memory alone" in message


class RedisDown(WorkerStore):
    """The store of a worker that lost Redis right after claiming: every write that ends a request fails."""

    def finish_many(self, *args: object, **kwargs: object) -> dict[str, RequestStatus | None]:
        raise redis.ConnectionError("Connection refused")


def test_results_that_cannot_be_stored_leave_the_batch_to_the_reaper(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    batch = scheduled_batch(client, settings, ["a", "b"])
    broken = BatchExecutor(RedisDown(client, settings), ScriptedRunner(), "w1", None, results, outage_retry_s=0.3)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        broken.execute(batch)
    assert time.monotonic() - started < 5  # retried for outage_retry_s, then given up
    keys = SchedulerStore(client, settings).keys
    assert in_flight(client, settings) == ["B1"]  # still in flight: nothing was lost
    assert client.hget(keys.request("a"), "status") == "running"
    client.delete(keys.batch_lock("B1"))  # its lock lapses (the heartbeat no longer holds it)
    assert SchedulerStore(client, settings).reap().republish == ["B1"]
    healthy = executor(client, settings, ScriptedRunner(), "w2")
    outcome = healthy.execute(batch)  # a lost run is split: its first half, then (published again) the other
    assert isinstance(outcome, BatchOutcome) and outcome.statuses["a"] is RequestStatus.SUCCEEDED
    assert SchedulerStore(client, settings).reap().republish == ["B1"]
    outcome = healthy.execute(batch)
    assert isinstance(outcome, BatchOutcome) and set(outcome.statuses.values()) == {RequestStatus.SUCCEEDED}
    assert client.hget(keys.batch("B1"), "attempts") == "3"
    assert in_flight(client, settings) == []


def test_a_stale_run_cannot_finish_what_a_later_claim_runs(client: fakeredis.FakeRedis, settings: Settings) -> None:
    """Two live workers, one batch: the first one's lock lapsed (a stall) and a second claimed it."""
    batch = scheduled_batch(client, settings, ["a", "b"])
    store = WorkerStore(client, settings)
    first = store.claim(batch, "tok1", "w1")
    client.delete(store.keys.batch_lock("B1"))  # the stall outlived the lock
    assert SchedulerStore(client, settings).reap().republish == ["B1"]
    second = store.claim(batch, "tok2", "w2")  # the lost run is split: a runs, b is put aside
    assert isinstance(first, Claimed) and isinstance(second, Claimed) and second.running == ["a"]
    # the stale run learns it lost the rows (the one run again and the one put aside), its late writes change nothing
    assert [int(s) for s in store.progress(["a", "b"], 3, 4, "tok1")] == [2, 2]
    store.record_results(["a/tok1/0.png", "a/tok2/0.png", "b/tok3/0.png"])
    late = store.finish_many({"a": ["a/tok1/0.png"]}, {"b": ErrorInfo(type="X", message="stale")}, "tok1")
    assert late == {"a": RequestStatus.RUNNING, "b": RequestStatus.RUNNING}
    assert not client.hexists(store.keys.request("a"), "results")
    assert not store.batch_done("B1", "tok1")  # the other run holds it: it stays in flight
    assert in_flight(client, settings) == ["B1"]
    assert store.finish_many({"a": ["a/tok2/0.png"]}, {}, "tok2") == {"a": RequestStatus.SUCCEEDED}
    assert not store.batch_done("B1", "tok2")  # b waits for its own run
    third = store.claim(batch, "tok3", "w2")
    assert isinstance(third, Claimed) and third.running == ["b"]
    assert store.finish_many({"b": ["b/tok3/0.png"]}, {}, "tok3") == {"b": RequestStatus.SUCCEEDED}
    assert store.batch_done("B1", "tok3")
    assert client.hget(store.keys.request("a"), "results") == "a/tok2/0.png"
    # the kept key is due with its request (result_ttl_s); the stale run's stays due after the grace period
    journal, now_ms = store.keys.results_journal, time.time() * 1000
    assert client.zscore(journal, "a/tok2/0.png") == pytest.approx(now_ms + settings.result_ttl_s * 1000, abs=5000)
    stale_due = now_ms + settings.result_orphan_grace_s * 1000
    assert client.zscore(journal, "a/tok1/0.png") == pytest.approx(stale_due, abs=5000)


def test_deliveries_that_run_nothing_count_no_attempt(client: fakeredis.FakeRedis, settings: Settings) -> None:
    batch = scheduled_batch(client, settings, ["a"])
    store = WorkerStore(client, settings)
    repeated = executor(client, settings, ScriptedRunner())
    assert isinstance(repeated.execute(batch), BatchOutcome)
    for _ in range(settings.max_batch_attempts + 2):  # duplicates: Celery redelivery, republish after takeover
        outcome = repeated.execute(batch)
        assert isinstance(outcome, BatchOutcome) and outcome.statuses == {"a": RequestStatus.SUCCEEDED}
    assert client.hget(store.keys.batch("B1"), "attempts") == "1"


def test_a_lost_message_is_published_again_after_the_claim_timeout(client: fakeredis.FakeRedis) -> None:
    settings = Settings(key_prefix="t", batch_claim_timeout_s=30.0, queue_name="q")
    scheduled_batch(client, settings, ["a"])
    reaper = SchedulerStore(client, settings)
    assert reaper.reap().republish == []  # just published
    (queue,) = queues_in_fleet_redis(settings)  # "t:q": the broker's keys follow the fleet's prefix
    client.lpush(queue, '{"headers": {"id": "B1", "task": "fusefleet.run_batch"}}')  # its message waits in the queue
    published_long_ago = 0  # the epoch: past any claim timeout, with no clock waited on
    client.hset(reaper.keys.batch("B1"), "published_ms", published_long_ago)
    assert reaper.reap().republish == []  # overdue, but its message is still queued: a worker will take it
    client.delete(queue)  # the message is lost
    assert reaper.reap().republish == ["B1"]
    assert reaper.reap().republish == []  # stamped: not again before another timeout
    client.hset(reaper.keys.batch("B1"), "published_ms", published_long_ago)
    assert reaper.reap().republish == ["B1"]


def test_finished_batches_leave_flight_and_expire(client: fakeredis.FakeRedis, settings: Settings) -> None:
    run(client, settings, ["a"], ScriptedRunner())
    keys = SchedulerStore(client, settings).keys
    assert in_flight(client, settings) == []
    assert 0 < client.ttl(keys.batch("B1")) <= settings.result_ttl_s
    assert 0 < client.ttl(keys.request("a")) <= settings.result_ttl_s
    assert not client.exists(keys.batch_lock("B1"))


def test_an_unreadable_entry_fails_with_a_ttl_and_wakes_waiters(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    store = SchedulerStore(client, settings)
    submit(client, store.keys, "a", "b")
    pubsub = client.pubsub()
    pubsub.subscribe(store.keys.finished)
    store.fail_unreadable("a", "the queued request could not be read")
    assert client.hget(store.keys.request("a"), "status") == "failed"
    assert 0 < client.ttl(store.keys.request("a")) <= settings.result_ttl_s
    messages = [m for m in iter(lambda: pubsub.get_message(timeout=0.1), None) if m["type"] == "message"]
    assert [m["data"] for m in messages] == ["a"]
    client.hset(store.keys.request("b"), "status", "succeeded")
    store.fail_unreadable("b", "late")  # never moves a finished request back
    assert client.hget(store.keys.request("b"), "status") == "succeeded"


def test_a_task_the_runner_does_not_do_fails_clearly(client: fakeredis.FakeRedis, settings: Settings) -> None:
    """ScriptedRunner declares no ``tasks``: text-to-image only. An image-to-image request fails, saying so,
    and the runner is never called for it."""
    keys = SchedulerStore(client, settings).keys
    batch = scheduled_batch(client, settings, ["img"])
    spec = RequestSpec.model_validate_json(client.hget(keys.request("img"), "spec"))
    client.hset(keys.request("img"), "spec", spec.model_copy(update={"task": Task.IMAGE_TO_IMAGE}).model_dump_json())
    runner = ScriptedRunner()
    outcome = executor(client, settings, runner).execute(batch)
    assert isinstance(outcome, BatchOutcome) and outcome.statuses == {"img": RequestStatus.FAILED}
    kind, message = error(client, settings, "img")
    assert kind == "UnsupportedTask"
    assert message == "this fleet's runner (ScriptedRunner) does not do image-to-image; it does text-to-image"
    assert runner.forwards == []
    assert in_flight(client, settings) == []


def test_a_replayed_claim_answers_what_the_first_did(client: fakeredis.FakeRedis, settings: Settings) -> None:
    """The first claim ran but its reply was lost; the worker retries with the same token (call_with_retry)."""
    batch = scheduled_batch(client, settings, ["a", "b"])
    store = WorkerStore(client, settings)
    first = store.claim(batch, "tok", "w1")
    again = store.claim(batch, "tok", "w1")
    assert isinstance(first, Claimed) and isinstance(again, Claimed)
    assert again.running == first.running == ["a", "b"]
    assert again.attempts == first.attempts == 1  # no attempt burned
    assert client.hget(store.keys.batch("B1"), "seq") == "2"  # published 1, claimed 2: nothing new
    assert isinstance(store.claim(batch, "other", "w2"), Locked)


def test_worker_liveness_ignores_host_clocks(
    client: fakeredis.FakeRedis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker host whose clock runs an hour behind the scheduler's still counts as a live slot: liveness is
    scored and swept in Redis time. (The skew is given to the two stores' own view of the clock only.)"""
    import gpu_worker.store
    import scheduler.store

    monkeypatch.setattr(gpu_worker.store, "time", SimpleNamespace(time=lambda: time.time() - 3600))
    monkeypatch.setattr(scheduler.store, "time", SimpleNamespace(time=lambda: time.time() + 3600))
    capabilities = WorkerCapabilities(model="demo", pipeline="Test", tasks=(Task.TEXT_TO_IMAGE,))
    WorkerStore(client, settings).heartbeat("late-clock@host", capabilities, first=True)
    assert SchedulerStore(client, settings).free_slots() == 1


class RecordingRunner(ScriptedRunner):
    """Records the request ids of each forward, and refuses a forward that mixes compatibility keys (as the
    diffusers runner's ``check_batch`` does)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def run(self, specs: Sequence[RequestSpec], on_step: StepCallback) -> list[list[object]]:
        self.calls.append([spec.id for spec in specs])
        if len({compat_key(spec) for spec in specs}) > 1:
            raise ValueError("not one batch")
        return super().run(specs, on_step)


def test_a_batch_of_several_compatibility_keys_runs_one_fused_forward_per_key(
    client: fakeredis.FakeRedis, settings: Settings
) -> None:
    """A step-mode scheduler batches by step key (steps and guidance left out): a request-level worker runs each
    compatibility key's requests as one forward, in the order of each key's first request."""
    batch = scheduled_batch(client, settings, ["a", "b", "c", "d", "e"])
    keys = SchedulerStore(client, settings).keys
    for rid, update in {"b": {"num_inference_steps": 8}, "d": {"num_inference_steps": 8}, "e": {"n": 2}}.items():
        spec = RequestSpec.model_validate_json(client.hget(keys.request(rid), "spec"))
        client.hset(keys.request(rid), "spec", spec.model_copy(update=update).model_dump_json())
    runner = RecordingRunner()
    outcome = executor(client, settings, runner).execute(batch)
    assert isinstance(outcome, BatchOutcome)
    assert runner.calls == [["a", "c"], ["b", "d"], ["e"]]
    assert outcome.statuses == {rid: RequestStatus.FAILED if rid == "e" else RequestStatus.SUCCEEDED for rid in "abcde"}
    assert error(client, settings, "e") == ("RunnerError", "runner returned 1 images, expected 2")
    assert in_flight(client, settings) == []
