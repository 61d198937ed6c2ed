"""The worker's step-mode loop (``gpu_worker.step_loop``) on fakeredis with the real Lua scripts and the real
diffusers runner on the tiny demo model: a claimed batch opens a running set and runs to success; a batch the
scheduler sends to the worker's inbox (``step_join.lua``) joins it; an aborted request ends ``aborted`` while its
peer succeeds; a request whose step raises fails alone; the set's count of requests returns to 0 and the set
closes (``step_close.lua``); a batch the step engine cannot run goes request-level.

``Hooked`` wraps the real runner's sets: it runs a test's actions before a given step (the loop's thread) and stands
in for a pipeline that raises on a marked prompt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import fakeredis
import numpy as np
import pytest
from PIL import Image

pytest.importorskip("diffusers")

from gpu_worker.diffusers_runner import DiffusersRunner  # noqa: E402
from gpu_worker.executor import BatchExecutor, BatchOutcome  # noqa: E402
from gpu_worker.finisher import BackgroundFinisher  # noqa: E402
from gpu_worker.heartbeat import Heartbeat  # noqa: E402
from gpu_worker.runner import InputImages, Runner, StepCallback, StepSet  # noqa: E402
from gpu_worker.step_loop import SetOutcome, StepLoop  # noqa: E402
from gpu_worker.store import WorkerStore  # noqa: E402
from scheduler.lease import Lease  # noqa: E402
from scheduler.store import SchedulerStore  # noqa: E402
from shared import keys as k  # noqa: E402
from shared.compat import StepKey, step_key  # noqa: E402
from shared.contracts import BatchMessage, LoraRef, RequestSpec, Task, WorkerCapabilities  # noqa: E402
from shared.results.filesystem import FilesystemResultStore  # noqa: E402
from shared.settings import Settings  # noqa: E402
from tests.support.diffusers_runners import ExplodingSet  # noqa: E402
from tests.support.processes import wait_for  # noqa: E402
from tests.support.solo import png_array, solo_arrays  # noqa: E402
from tests.support.specs import demo_spec  # noqa: E402
from tests.unit.test_scripts import submit  # noqa: E402

WORKER = "w1"
SIDE = 32
EXPLODE = "explode"
JOIN_FAILS = "cannot join"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # and ``runner``, ``client``: tests/unit/conftest.py


@pytest.fixture
def settings() -> Settings:
    return Settings(key_prefix="t", batch_lock_ttl_s=5, result_ttl_s=60)


class Hooked(Runner):
    """The real runner, whose sets run ``hooks[k]`` before their k-th full step and raise (as a broken pipeline
    would) when a step includes a request whose prompt says ``explode``."""

    def __init__(self, runner: DiffusersRunner) -> None:
        self.runner = runner
        self.hooks: dict[int, Callable[[], None]] = {}
        self.steps = 0
        self.live: list[int] = []  # the requests in the set at each full step

    @property
    def fused(self) -> bool:
        return self.runner.fused

    def run(self, specs: Sequence[RequestSpec], on_step: StepCallback, inputs: Any = None) -> list[list[Image.Image]]:
        return self.runner.run(specs, on_step, inputs)

    @property
    def step_mode(self) -> bool:
        return self.runner.step_mode

    def step_set(self, key: StepKey) -> StepSet:
        return HookedSet(self, self.runner.step_set(key))

    def release_memory(self) -> None:
        self.runner.release_memory()


class HookedSet(ExplodingSet):
    """``ExplodingSet`` that runs the owner's hook of each whole step first, and whose join fails on a prompt with
    ``cannot join``."""

    def __init__(self, owner: Hooked, inner: StepSet) -> None:
        super().__init__(inner)
        self.owner = owner

    def join(
        self, specs: Sequence[RequestSpec], inputs: Mapping[str, InputImages] | None = None
    ) -> dict[str, str]:
        if any(JOIN_FAILS in spec.prompt for spec in specs):
            raise RuntimeError("the text encoder broke on this batch")
        return super().join(specs, inputs)

    def step(self, only: Collection[str] | None = None) -> list[str]:
        if only is None:
            self.owner.steps += 1
            self.owner.live.append(len(self.requests))
            hook = self.owner.hooks.pop(self.owner.steps, None)
            if hook is not None:
                hook()
        return super().step(only)


class ClosingStore(WorkerStore):
    """The worker's store, noting the set's request count each time the loop closes its set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows_at_close: list[str | None] = []

    def step_close(self, worker: str) -> bool:
        self.rows_at_close.append(self._redis.hget(self.keys.step_rows, worker))  # type: ignore[arg-type]
        return super().step_close(worker)


class Worker:
    """One step-mode worker process's pieces, on ``client``."""

    def __init__(self, client: fakeredis.FakeRedis, settings: Settings, runner: Hooked, results: Path) -> None:
        self.client = client
        self.settings = settings
        self.store = ClosingStore(client, settings)
        self.keys = self.store.keys
        capabilities = WorkerCapabilities(model="demo", pipeline="Test", tasks=(Task.TEXT_TO_IMAGE,))
        self.store.heartbeat(WORKER, capabilities, first=True)
        self.heartbeat = Heartbeat(self.store, WORKER, 1.0, capabilities)  # never started: holds are observed
        self.results = FilesystemResultStore(results)
        self.executor = BatchExecutor(self.store, runner.runner, WORKER, self.heartbeat, self.results)
        self.loop = StepLoop(runner, WORKER, self.heartbeat, self.executor.writer, self.executor, seal_after_s=60)
        self.lease = Lease(client, self.keys.scheduler_lease, 60_000)
        assert self.lease.try_acquire()

    def schedule(self, batch_id: str, specs: Sequence[RequestSpec]) -> BatchMessage:
        """Submit the requests and move them into batch ``batch_id``, as the api and the scheduler would."""
        ids = [spec.id for spec in specs]
        submit(self.client, self.keys, *ids)
        for spec in specs:
            self.client.hset(self.keys.request(spec.id), "spec", spec.model_dump_json())
        scheduler = SchedulerStore(self.client, self.settings)
        assert scheduler.schedule(self.lease.key, self.lease.token, batch_id, ids) == ids
        return BatchMessage(batch_id=batch_id, request_ids=tuple(ids), created_at=time.time())

    def send(self, message: BatchMessage, digest: str, cap: int = 8) -> None:
        """What the scheduler does for a join: ``step_join.lua`` puts the batch in this worker's inbox (its one
        heartbeat, at start, counts for a minute), within the set's ``cap``."""
        scheduler = SchedulerStore(self.client, self.settings.model_copy(update={"worker_ttl_s": 60}))
        count = len(message.request_ids)
        assert scheduler.step_join(WORKER, digest, message.model_dump_json(), message.batch_id, count, cap)

    def request(self, rid: str) -> dict[str, str]:
        return dict(self.client.hgetall(self.keys.request(rid)))

    def assert_closed(self) -> None:
        """The set closed with no request counted, and nothing of it is left in flight or held."""
        assert self.store.rows_at_close[-1] == "0"
        assert not self.client.hexists(self.keys.step_sets, WORKER)
        assert not self.client.hexists(self.keys.step_rows, WORKER)
        assert self.client.zcard(self.keys.inflight) == 0
        assert self.client.zcard(self.keys.storing) == 0
        assert self.heartbeat.held == []
        assert not self.client.keys(f"{self.keys.tag}:batch:*:lock")


@pytest.fixture
def hooked(runner: DiffusersRunner) -> Hooked:
    return Hooked(runner)


@pytest.fixture
def worker(client: fakeredis.FakeRedis, settings: Settings, hooked: Hooked, tmp_path: Path) -> Worker:
    return Worker(client, settings, hooked, tmp_path / "results")


def spec(rid: str, steps: int, guidance: float = 5.0, *, n: int = 1, seed: int = 1, side: int = SIDE) -> RequestSpec:
    return demo_spec(rid, steps, guidance, side=side, n=n, seed=seed, created_at=time.time())


def stored_images(worker: Worker, rid: str) -> list[np.ndarray]:
    arrays = []
    for key in worker.request(rid)["results"].split():
        data = worker.results.get(key)
        assert data is not None
        arrays.append(png_array(data))
    return arrays


def test_a_claimed_batch_runs_as_a_set_to_success(worker: Worker, hooked: Hooked, runner: DiffusersRunner) -> None:
    quick = spec("quick", steps=2, guidance=1.0, n=2, seed=3)
    slow = spec("slow", steps=3, guidance=5.0, seed=4)
    batch = worker.schedule("B1", [quick, slow])
    seen: dict[str, object] = {}

    def look() -> None:
        seen["set"] = worker.client.hget(worker.keys.step_sets, WORKER)
        seen["rows"] = worker.client.hget(worker.keys.step_rows, WORKER)
        seen["storing"] = worker.client.zrange(worker.keys.storing, 0, -1)
        seen["held"] = worker.heartbeat.held

    hooked.hooks[1] = look
    outcome = worker.loop.run(batch)
    assert isinstance(outcome, SetOutcome)
    assert outcome.batches == ["B1"]
    assert outcome.statuses == {"quick": "succeeded", "slow": "succeeded"}
    # while it ran: the set was open on the batch's step key, counted its requests, and held the worker's slot
    assert seen == {"set": step_key(quick).digest, "rows": "2", "storing": ["B1"], "held": ["B1"]}
    for request in (quick, slow):
        state = worker.request(request.id)
        assert state["status"] == "succeeded" and state["worker"] == WORKER
        assert (state["step"], state["total"]) == (str(request.num_inference_steps),) * 2
        for image, reference in zip(stored_images(worker, request.id), solo_arrays(runner, request), strict=True):
            assert int(np.abs(image - reference).max()) <= 1
    assert hooked.steps == 3
    worker.assert_closed()
    events = [fields for _, fields in worker.client.xrange(worker.keys.events)]
    assert {"type": "slot_free", "worker": WORKER} in events  # the close woke the scheduler


def test_a_batch_sent_to_the_inbox_joins_the_running_set(worker: Worker, hooked: Hooked) -> None:
    long = spec("long", steps=8, seed=5)
    joiner = spec("joiner", steps=2, guidance=1.0, n=2, seed=6)
    first = worker.schedule("B1", [long])
    rows: list[str | None] = []

    def send() -> None:
        worker.send(worker.schedule("B2", [joiner]), step_key(joiner).digest)
        worker.loop.settle()  # claimed ahead of the boundary, as a batch sent one step earlier would be

    def count() -> None:
        worker.loop.settle()  # the count-outs made (off the loop)
        rows.append(worker.client.hget(worker.keys.step_rows, WORKER))

    hooked.hooks[3] = send  # during step 3: it joins at the next boundary and takes the long one's steps 4 and 5
    hooked.hooks[4] = count
    hooked.hooks[5] = count
    outcome = worker.loop.run(first)
    assert isinstance(outcome, SetOutcome)
    assert outcome.batches == ["B1", "B2"]
    assert outcome.statuses == {"long": "succeeded", "joiner": "succeeded"}
    assert rows == ["2", "1"]  # both counted at step 4; the joiner counted out at the boundary before its last, 5
    assert float(worker.request("joiner")["finished_at"]) < float(worker.request("long")["finished_at"])
    assert worker.request("joiner")["worker"] == WORKER
    assert len(stored_images(worker, "joiner")) == 2
    assert hooked.steps == 8  # one set: the joiner's steps were the long request's
    worker.assert_closed()


def test_a_request_is_counted_out_one_step_before_it_leaves_so_its_joiner_takes_its_room_at_once(
    worker: Worker, hooked: Hooked
) -> None:
    cap = 2  # max_num_seqs
    first = [spec("a", steps=3, seed=1), spec("b", steps=6, seed=2)]
    waiting = [spec("c", steps=3, seed=3), spec("d", steps=2, seed=4), spec("e", steps=1, seed=5)]
    rooms: list[int] = []

    def scheduler() -> None:  # before each step: a scheduler that sends a waiting request as soon as it sees room
        worker.loop.settle()  # the count-outs made (off the loop)
        rows = int(worker.client.hget(worker.keys.step_rows, WORKER) or 0)
        rooms.append(cap - rows)
        for _ in range(min(cap - rows, len(waiting))):
            joiner = waiting.pop(0)
            worker.send(worker.schedule(f"B-{joiner.id}", [joiner]), step_key(joiner).digest, cap)
        worker.loop.settle()  # claimed ahead of the boundary: they join at the next one

    hooked.hooks = dict.fromkeys(range(1, 20), scheduler)
    outcome = worker.loop.run(worker.schedule("B1", first))
    assert isinstance(outcome, SetOutcome)
    assert outcome.statuses == dict.fromkeys("abcde", "succeeded")
    # the room of a request appears at the boundary before its last step (a before step 3; b and c before 6; e,
    # whose first step is its last, as it joins; d before 8), while it still runs: its joiner takes it at the
    # boundary where it leaves, so the set runs no step a row short, and never runs more than cap requests
    assert rooms == [0, 0, 1, 0, 0, 2, 1, 2]
    assert hooked.live == [2, 2, 2, 2, 2, 2, 2, 1]
    worker.assert_closed()  # each counted out once


def test_an_aborted_request_ends_aborted_while_its_peer_succeeds(worker: Worker, hooked: Hooked) -> None:
    peer = spec("peer", steps=6, seed=7)
    victim = spec("victim", steps=40, seed=8)
    batch = worker.schedule("B1", [peer, victim])
    abort = worker.client.register_script(k.ABORT)

    def flag() -> None:
        args = [time.time(), 60, worker.keys.finished, "victim"]
        assert abort(keys=k.abort_keys(worker.keys, "victim"), args=args) == "running"

    hooked.hooks[2] = flag
    outcome = worker.loop.run(batch)
    assert isinstance(outcome, SetOutcome)
    assert outcome.statuses == {"peer": "succeeded", "victim": "aborted"}
    victim_state = worker.request("victim")
    assert victim_state["status"] == "aborted" and "results" not in victim_state
    assert int(victim_state["step"]) < 40
    assert hooked.steps < 40  # the set did not run the victim's steps to the end
    assert worker.request("peer")["status"] == "succeeded"
    worker.assert_closed()


def test_a_request_whose_step_raises_fails_alone(worker: Worker, hooked: Hooked, runner: DiffusersRunner) -> None:
    fine = spec("fine", steps=3, seed=9)
    culprit = spec(EXPLODE, steps=3, seed=10)
    later = spec("later", steps=2, guidance=1.0, seed=11)
    batch = worker.schedule("B1", [fine, culprit, later])
    outcome = worker.loop.run(batch)
    assert isinstance(outcome, SetOutcome)
    assert outcome.statuses == {"fine": "succeeded", EXPLODE: "failed", "later": "succeeded"}
    state = worker.request(EXPLODE)
    assert (state["error_type"], state["error_message"]) == (
        "ValueError",
        f"prompt of request {EXPLODE} asked the pipeline to explode",
    )
    for request in (fine, later):  # re-stepped one by one after the failed step, and still their solo images
        (image,) = stored_images(worker, request.id)
        assert int(np.abs(image - solo_arrays(runner, request)[0]).max()) <= 1
    worker.assert_closed()


def test_a_set_is_sealed_after_half_the_time_limit(worker: Worker, hooked: Hooked) -> None:
    worker.loop.seal_after_s = 0.0
    batch = worker.schedule("B1", [spec("a", steps=2)])
    seen: list[str | None] = []
    hooked.hooks[1] = lambda: seen.append(worker.client.hget(worker.keys.step_sets, WORKER))
    outcome = worker.loop.run(batch)
    assert isinstance(outcome, SetOutcome) and outcome.statuses == {"a": "succeeded"}
    assert seen == ["sealed"]
    worker.assert_closed()


def test_a_batch_the_step_engine_cannot_take_runs_request_level(worker: Worker, hooked: Hooked) -> None:
    """Two step keys in one batch (32 and 40 px): the executor runs it, one fused forward per compatibility key."""
    batch = worker.schedule("B1", [spec("small", steps=2), spec("large", steps=2, side=40)])
    outcome = worker.loop.run(batch)
    assert isinstance(outcome, BatchOutcome)
    assert outcome.wait(30) == {"small": "succeeded", "large": "succeeded"}
    assert hooked.steps == 0
    assert not worker.store.rows_at_close  # no set was opened
    assert worker.client.zcard(worker.keys.inflight) == 0


def test_a_joiner_whose_lora_cannot_load_fails_alone_saying_why(
    worker: Worker, hooked: Hooked, runner: DiffusersRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row carries its LoRA (not in the step key): one missing from the LoRA folder (FileNotFoundError) fails its
    request at its join, saying why, instead of leaving it running; the set closes with no row left."""
    monkeypatch.setattr(runner.loras, "lora_dir", tmp_path)
    lora = spec("lora", steps=2).model_copy(update={"lora": LoraRef(name="missing")})
    outcome = worker.loop.run(worker.schedule("B1", [lora]))
    assert isinstance(outcome, SetOutcome)
    assert outcome.statuses == {"lora": "failed"}
    state = worker.request("lora")
    assert state["error_type"] == "FileNotFoundError" and "LoRA 'missing' not found" in state["error_message"]
    assert hooked.steps == 0 and worker.store.rows_at_close[-1] == "0"
    assert worker.client.zcard(worker.keys.inflight) == 0


class GatedResults(FilesystemResultStore):
    """The filesystem result store, whose writes wait until ``gate`` is set (a slow result store)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()

    def put(self, key: str, data: bytes) -> None:
        assert self.gate.wait(30), "the test never opened the gate"
        super().put(key, data)


def test_the_set_steps_on_while_a_finished_request_is_stored_behind_it(
    client: fakeredis.FakeRedis, settings: Settings, hooked: Hooked, runner: DiffusersRunner, tmp_path: Path
) -> None:
    worker = Worker(client, settings, hooked, tmp_path / "results")
    gated = GatedResults(tmp_path / "gated")
    worker.executor = BatchExecutor(worker.store, runner, WORKER, worker.heartbeat, gated)
    finisher = BackgroundFinisher()
    worker.loop = StepLoop(
        hooked, WORKER, worker.heartbeat, worker.executor.writer, worker.executor, seal_after_s=60, finisher=finisher
    )
    worker.results = gated
    quick = spec("quick", steps=2, guidance=1.0, seed=3)
    slow = spec("slow", steps=5, guidance=5.0, seed=4)
    batch = worker.schedule("B1", [quick, slow])
    seen: dict[str, object] = {}

    def while_quick_is_stored() -> None:  # before step 4: quick finished at step 2, its store is still blocked
        seen["quick"] = worker.request("quick")["status"]
        worker.loop.settle()
        seen["rows"] = worker.client.hget(worker.keys.step_rows, WORKER)  # counted out at once: room for joiners
        seen["held"] = worker.heartbeat.held  # its batch stays held while it is stored
        gated.gate.set()

    hooked.hooks[4] = while_quick_is_stored
    try:
        outcome = worker.loop.run(batch)
    finally:
        assert finisher.close(30)
    assert seen == {"quick": "running", "rows": "1", "held": ["B1"]}
    assert isinstance(outcome, SetOutcome)
    assert outcome.statuses == {"quick": "succeeded", "slow": "succeeded"}
    for request in (quick, slow):
        for got, want in zip(stored_images(worker, request.id), solo_arrays(runner, request), strict=True):
            assert np.abs(got - want).max() <= 1
    worker.assert_closed()


def test_a_joiner_whose_join_raises_fails_alone(worker: Worker, hooked: Hooked) -> None:
    first = spec("first", steps=4, seed=1)
    broken = spec("broken", steps=2, seed=2).model_copy(update={"prompt": f"{JOIN_FAILS}: broken"})
    joiner = worker.schedule("B2", [broken])
    hooked.hooks[1] = lambda: worker.send(joiner, step_key(first).digest)
    outcome = worker.loop.run(worker.schedule("B1", [first]))
    assert isinstance(outcome, SetOutcome)
    assert outcome.statuses == {"first": "succeeded", "broken": "failed"}
    state = worker.request("broken")
    assert (state["error_type"], state["error_message"]) == ("RuntimeError", "the text encoder broke on this batch")
    worker.assert_closed()


def test_a_set_left_behind_is_taken_down_after_a_beat_when_no_set_runs(worker: Worker) -> None:
    assert worker.loop.drop_pending  # a new process first takes down what a dead predecessor of its name left
    worker.client.hset(worker.keys.step_sets, WORKER, "a-digest")  # as a run that lost Redis leaves it
    worker.client.hset(worker.keys.step_rows, WORKER, 3)
    worker.client.rpush(worker.keys.step_inbox(WORKER), "{}")
    worker.loop.drop_pending = True
    worker.loop._running = True  # a set runs: nothing is touched
    worker.loop.repair()
    assert worker.client.hget(worker.keys.step_sets, WORKER) == "a-digest"
    worker.loop._running = False
    worker.heartbeat._beat()  # the beat runs the repair once Redis answers
    assert not worker.client.hexists(worker.keys.step_sets, WORKER)
    assert not worker.client.hexists(worker.keys.step_rows, WORKER)
    assert not worker.client.exists(worker.keys.step_inbox(WORKER))
    assert not worker.loop.drop_pending


def test_counting_out_and_sealing_never_recreate_a_swept_set(worker: Worker) -> None:
    worker.store.step_leave(WORKER, 2)  # no set registered (swept with a late heartbeat)
    worker.store.step_seal(WORKER)
    assert not worker.client.hexists(worker.keys.step_rows, WORKER)
    assert not worker.client.hexists(worker.keys.step_sets, WORKER)


def sweep_late_beat(worker: Worker) -> None:
    """What the scheduler's ``free_slots.lua`` does once the worker's beat is older than ``worker_ttl_s``: the
    worker leaves the live ones, with its capabilities and its set's registration."""
    worker.client.zadd(worker.keys.workers, {WORKER: 1})  # its last beat, long ago
    assert SchedulerStore(worker.client, worker.settings).slots().live == 0
    assert not worker.client.hexists(worker.keys.step_sets, WORKER)
    assert not worker.client.hexists(worker.keys.step_rows, WORKER)


def registration(worker: Worker) -> tuple[str, str]:
    """The set's registration once the reader made it again (``Arrivals`` registers it between two reads)."""
    wait_for(lambda: worker.client.hexists(worker.keys.step_sets, WORKER), 5, "the set to be registered again")
    digest, rows = worker.client.hget(worker.keys.step_sets, WORKER), worker.client.hget(worker.keys.step_rows, WORKER)
    return str(digest), str(rows)


def test_a_set_swept_with_a_late_beat_registers_again_with_its_count_and_takes_joins(
    worker: Worker, hooked: Hooked
) -> None:
    long, short, joiner = spec("long", steps=8, seed=5), spec("short", steps=2, seed=6), spec("joiner", steps=2)
    digest = step_key(long).digest
    worker.heartbeat._beat()  # the worker's first announced beat
    seen: dict[str, object] = {}

    def swept() -> None:
        sweep_late_beat(worker)
        late = BatchMessage(batch_id="B-late", request_ids=("late",), created_at=time.time()).model_dump_json()
        scheduler = SchedulerStore(worker.client, worker.settings)
        seen["refused"] = not scheduler.step_join(WORKER, digest, late, "B-late", 1, 8)

    def beat() -> None:  # short counted out meanwhile (before its last step, 2), with no set registered to count
        worker.loop.settle()
        worker.heartbeat._beat()  # announced anew: the set registers again, counting what it holds
        seen["registered"] = registration(worker)
        worker.send(worker.schedule("B2", [joiner]), digest)  # it takes joins again
        worker.loop.settle()

    hooked.hooks[1] = swept
    hooked.hooks[4] = beat
    outcome = worker.loop.run(worker.schedule("B1", [long, short]))
    assert isinstance(outcome, SetOutcome)
    assert outcome.batches == ["B1", "B2"]
    assert outcome.statuses == dict.fromkeys(("long", "short", "joiner"), "succeeded")
    assert seen == {"refused": True, "registered": (digest, "1")}  # long alone: short's count-out was not lost
    assert hooked.live[4:6] == [2, 2]  # the joiner ran in the set
    worker.assert_closed()  # counted out to 0: the count it registered again with was exact


def test_a_swept_set_whose_seal_fell_due_registers_again_sealed(worker: Worker, hooked: Hooked) -> None:
    worker.heartbeat._beat()
    seen: dict[str, object] = {}

    def swept() -> None:
        sweep_late_beat(worker)
        worker.loop.seal_after_s = 0.0  # due at the next boundary, while no set is registered to seal

    def beat() -> None:
        worker.heartbeat._beat()
        seen["registered"] = registration(worker)

    hooked.hooks[1] = swept
    hooked.hooks[3] = beat
    outcome = worker.loop.run(worker.schedule("B1", [spec("a", steps=4)]))
    assert isinstance(outcome, SetOutcome) and outcome.statuses == {"a": "succeeded"}
    assert seen == {"registered": (k.STEP_SEALED, "1")}
    worker.assert_closed()


def test_batches_sent_before_the_sweep_are_counted_popped_or_still_in_the_inbox(worker: Worker, hooked: Hooked) -> None:
    long, first, second = spec("long", steps=8, seed=5), spec("first", steps=3, seed=6), spec("second", steps=3)
    digest = step_key(long).digest
    worker.heartbeat._beat()
    seen: dict[str, object] = {}

    def sent_then_swept() -> None:
        arrivals = worker.loop._current.arrivals  # type: ignore[union-attr]
        worker.send(worker.schedule("B2", [first]), digest)
        worker.loop.settle()  # popped and claimed: counted by the worker
        assert arrivals.pause(5)
        worker.send(worker.schedule("B3", [second]), digest)  # left in the inbox
        sweep_late_beat(worker)
        worker.heartbeat._beat()  # announced anew while the reader is paused: it registers before its next read
        arrivals.resume()
        seen["registered"] = registration(worker)

    hooked.hooks[2] = sent_then_swept
    outcome = worker.loop.run(worker.schedule("B1", [long]))
    assert isinstance(outcome, SetOutcome) and outcome.batches == ["B1", "B2", "B3"]
    assert outcome.statuses == dict.fromkeys(("long", "first", "second"), "succeeded")
    assert seen == {"registered": (digest, "3")}  # long, the popped joiner, the one in the inbox
    worker.assert_closed()


def test_a_request_requeued_while_its_set_is_swept_is_not_counted_again(worker: Worker, hooked: Hooked) -> None:
    stays, evicted = spec("stays", steps=6, seed=5), spec("evicted", steps=6, seed=6)
    digest = step_key(stays).digest
    worker.heartbeat._beat()
    seen: dict[str, object] = {}

    def evict_then_sweep() -> None:
        assert SchedulerStore(worker.client, worker.settings).step_evict(WORKER, digest, "evicted")
        worker.loop.settle()  # the eviction read: it is done at the next boundary, with no set registered
        sweep_late_beat(worker)

    def beat() -> None:
        worker.heartbeat._beat()
        seen["registered"] = registration(worker)

    hooked.hooks[2] = evict_then_sweep
    hooked.hooks[3] = beat
    outcome = worker.loop.run(worker.schedule("B1", [stays, evicted]))
    assert isinstance(outcome, SetOutcome)
    assert outcome.statuses == {"stays": "succeeded", "evicted": "queued"}
    assert seen == {"registered": (digest, "1")}  # requeue.lua had no count to lower: the worker's did
    assert worker.store.rows_at_close[-1] == "0"


def test_a_set_dropped_before_its_late_registration_stays_gone(worker: Worker, hooked: Hooked) -> None:
    """A registration that comes after the set's cleanup (its reader outlived ``Arrivals.stop``, in a stalled
    Redis) is fenced off by the set's id: no set that no loop reads is left holding the slot."""
    worker.heartbeat._beat()
    seen: dict[str, object] = {}

    def swept_then_dropped() -> None:
        arrivals = worker.loop._current.arrivals  # type: ignore[union-attr]
        assert arrivals.pause(5)
        sweep_late_beat(worker)
        worker.heartbeat._beat()
        worker.store.step_drop(WORKER)  # what _abandon does once the reader did not stop in time
        arrivals.resume()
        wait_for(lambda: not arrivals._register.is_set(), 5, "the reader's late try")
        seen["set"] = worker.client.hget(worker.keys.step_sets, WORKER)

    hooked.hooks[2] = swept_then_dropped
    outcome = worker.loop.run(worker.schedule("B1", [spec("a", steps=4)]))
    assert isinstance(outcome, SetOutcome) and outcome.statuses == {"a": "succeeded"}
    assert seen == {"set": None}
