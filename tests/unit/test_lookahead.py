"""The worker's lookahead (``gpu_worker.lookahead``): when it takes the next batch, how long a chain runs, its thread
(armed, due, polling, collected), the broker reader on kombu's in-memory transport, and a batch claimed ahead on
fakeredis with the real scripts (claimed and journaled before the current forward ends, run later as if at once)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta

import fakeredis
import pytest
from celery import Celery

from gpu_worker.executor import BatchOutcome, Prepared
from gpu_worker.lookahead import CHAIN_S, Lookahead, Miss, chain_may_start, chain_open, take_now
from gpu_worker.queue_reader import QueueReader, due
from gpu_worker.runner import StepCallback
from gpu_worker.store import Locked
from shared.celery_config import RUN_BATCH_TASK
from shared.contracts import BatchMessage, RequestSpec, Task
from shared.settings import Settings
from tests.unit.test_executor import ScriptedRunner, executor, results, scheduled_batch

__all__ = ["results"]  # the executor tests' result store fixture (autouse)


@pytest.mark.parametrize(
    ("step", "total", "elapsed_s", "lead_s", "now"),
    [
        (0, 20, 0.0, 10.0, False),  # no step yet: no pace to estimate from
        (1, 20, 0.005, 0.1, True),  # 19 steps of 5 ms left: 95 ms <= 100 ms
        (1, 20, 0.1, 0.1, False),  # 19 steps of 100 ms left
        (19, 20, 1.9, 0.1, True),  # the last step of 100 ms
        (10, 20, 1.0, 0.5, False),  # halfway: 1 s left
        (20, 20, 2.0, 0.0, True),  # done
        (3, 0, 0.1, 1.0, False),  # no total: nothing to estimate
    ],
)
def test_the_next_batch_is_taken_once_the_forward_ends_within_the_lead(
    step: int, total: int, elapsed_s: float, lead_s: float, now: bool
) -> None:
    assert take_now(step, total, elapsed_s, lead_s) is now


@pytest.mark.parametrize(
    ("chain_s", "batch_s", "soft_limit_s", "open_"),
    [
        (0.0, 0.09, 810, True),
        (CHAIN_S - 1, 0.5, 810, True),
        (CHAIN_S - 1, 2.0, 810, False),  # one more as long would pass CHAIN_S
        (0.0, 6.0, 10, False),  # half the soft limit is 5 s
        (1.0, 3.0, 10, True),
    ],
)
def test_a_chain_takes_no_batch_that_would_end_past_its_bound(
    chain_s: float, batch_s: float, soft_limit_s: float, open_: bool
) -> None:
    assert chain_open(chain_s, batch_s, soft_limit_s) is open_


@pytest.mark.parametrize(
    ("chain_s", "soft_limit_s", "lead_s", "starts"),
    [
        (CHAIN_S - 0.5, 810, 0.1, True),
        (CHAIN_S + 0.05, 810, 0.1, True),  # taken at the bound, its forward ending within the lead: it runs
        (CHAIN_S + 0.5, 810, 0.1, False),  # the forward before ran far past its estimate: given back
        (4.6, 9, 0.1, True),  # half a 9 s soft limit, plus the lead
        (5.0, 9, 0.1, False),
    ],
)
def test_a_batch_taken_ahead_starts_only_within_the_chains_bound(
    chain_s: float, soft_limit_s: float, lead_s: float, starts: bool
) -> None:
    assert chain_may_start(chain_s, soft_limit_s, lead_s) is starts


class Inbox:
    """A take over a list of items: each look pops the first, ``Miss.EMPTY`` when none is left (or ``end`` when
    set); a look can be held (``hold``) until ``release``."""

    def __init__(self, *items: str, end: Miss = Miss.EMPTY) -> None:
        self.items = list(items)
        self.end = end
        self.looks = 0
        self.held = threading.Event()
        self.held.set()
        self.in_look = threading.Event()

    def take(self) -> str | Miss:
        self.looks += 1
        self.in_look.set()
        self.held.wait(5)
        return self.items.pop(0) if self.items else self.end


@pytest.fixture
def inbox() -> Inbox:
    return Inbox()


@pytest.fixture
def lookahead(inbox: Inbox) -> Iterator[Lookahead[str]]:
    one = Lookahead(inbox.take, lead_s=0.05, poll_every_s=0.01)
    yield one
    one.close()


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_a_batch_waiting_is_taken_near_the_forwards_end_and_collected(inbox: Inbox) -> None:
    now = [0.0]
    lookahead = Lookahead(inbox.take, lead_s=0.5, poll_every_s=0.01, clock=lambda: now[0])
    try:
        inbox.items.append("B2")
        lookahead.arm()
        lookahead.forward_started()
        now[0] = 0.1
        lookahead.step(1, 100)  # 99 steps of 0.1 s to go: not yet
        now[0] = 9.0
        lookahead.step(90, 100)  # 1 s to go: not yet
        time.sleep(0.05)
        assert inbox.looks == 0
        now[0] = 9.6
        lookahead.step(96, 100)  # 0.4 s to go
        wait_until(lambda: inbox.looks == 1)
        assert lookahead.collect() == "B2"
        assert lookahead.collect() is None  # collected once
    finally:
        lookahead.close()


def test_no_forward_step_means_no_look(inbox: Inbox, lookahead: Lookahead[str]) -> None:
    inbox.items.append("B2")
    lookahead.arm()
    lookahead.forward_started()
    time.sleep(0.05)
    assert lookahead.collect() is None and inbox.looks == 0
    assert inbox.items == ["B2"]  # left in the queue for whichever worker frees first


def test_an_empty_queue_is_looked_at_again_until_the_forward_ends(inbox: Inbox, lookahead: Lookahead[str]) -> None:
    lookahead.arm()
    lookahead.forward_started()
    lookahead.step(10, 10)
    wait_until(lambda: inbox.looks >= 3)  # every poll_every_s
    inbox.items.append("B2")
    wait_until(lambda: not inbox.items)
    assert lookahead.collect() == "B2"
    looks = inbox.looks
    time.sleep(0.05)
    assert inbox.looks == looks  # taken: it looks no more


def test_a_stop_ends_the_look_for_that_batch_only() -> None:
    inbox = Inbox(end=Miss.STOP)
    lookahead = Lookahead(inbox.take, lead_s=1.0, poll_every_s=0.001)
    try:
        lookahead.arm()
        lookahead.forward_started()
        lookahead.step(1, 2)
        wait_until(lambda: inbox.looks == 1)
        lookahead.step(2, 2)
        time.sleep(0.03)
        assert inbox.looks == 1 and lookahead.collect() is None
        inbox.items.append("B3")  # the next batch's forward looks again
        lookahead.arm()
        lookahead.forward_started()
        lookahead.step(2, 2)
        wait_until(lambda: inbox.looks == 2)
        assert lookahead.collect() == "B3"
    finally:
        lookahead.close()


def test_collect_waits_for_a_take_in_progress(inbox: Inbox, lookahead: Lookahead[str]) -> None:
    """A take under way (claiming) when the forward ends is waited for: its batch is never left claimed and idle."""
    inbox.items.append("B2")
    inbox.held.clear()
    lookahead.arm()
    lookahead.forward_started()
    lookahead.step(1, 1)
    assert inbox.in_look.wait(5)
    collected: list[str | None] = []
    collector = threading.Thread(target=lambda: collected.append(lookahead.collect()))
    collector.start()
    time.sleep(0.05)
    assert collected == []  # still waiting for the take
    inbox.held.set()
    collector.join(5)
    assert collected == ["B2"]


def test_a_take_that_raises_ends_that_look_and_the_thread_lives_on() -> None:
    calls: list[int] = []

    def failing() -> str | Miss:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the broker went away")
        return "B9"

    def look() -> str | None:
        one.arm()
        one.forward_started()
        looks = len(calls)
        one.step(1, 1)
        wait_until(lambda: len(calls) > looks)
        return one.collect()

    one = Lookahead(failing, lead_s=1.0, poll_every_s=0.001)
    try:
        assert look() is None  # raised: logged, nothing taken
        assert look() == "B9"
    finally:
        one.close()


@pytest.mark.parametrize(
    ("eta", "runs"),
    [(None, True), ("", True), (-5, True), (60, False)],
)
def test_a_message_runs_ahead_only_when_due(eta: int | str | None, runs: bool) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    header = (now + timedelta(seconds=eta)).isoformat() if isinstance(eta, int) else eta
    assert due(header, now) is runs
    naive = (now + timedelta(seconds=60)).replace(tzinfo=None).isoformat()  # read as UTC
    assert due(naive, now) is False


@pytest.fixture
def memory_app() -> Celery:
    """A Celery app on kombu's in-memory transport (a virtual transport, as Redis's), JSON only."""
    app = Celery("lookahead-test", broker="memory://", set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    return app


def batch_message(batch_id: str) -> dict[str, object]:
    return BatchMessage(batch_id=batch_id, request_ids=("a",), created_at=1.0).model_dump(mode="json")


def test_the_reader_takes_batch_messages_in_order_and_gives_back_what_must_wait(memory_app: Celery) -> None:
    memory_app.send_task(RUN_BATCH_TASK, args=[batch_message("B1")], task_id="B1", queue="q")
    memory_app.send_task(RUN_BATCH_TASK, args=[batch_message("B2")], task_id="B2", queue="q")
    memory_app.send_task(RUN_BATCH_TASK, args=[batch_message("B3")], task_id="B3", queue="q", countdown=60)
    reader = QueueReader(memory_app, ["q"])
    try:
        taken = [reader.take(), reader.take()]
        assert [(message["batch_id"], queue) for message, queue in taken] == [("B1", "q"), ("B2", "q")]  # type: ignore[misc]
        assert reader.take() is Miss.STOP  # a retry not due yet: back in the queue, for Celery's consumer
        with memory_app.connection_for_read() as connection:
            assert connection.default_channel.queue_declare("q", passive=True).message_count == 1
    finally:
        reader.close()
    assert QueueReader(memory_app, ["empty"]).take() is Miss.EMPTY


def test_a_batch_claimed_ahead_is_running_and_journaled_before_it_runs(fake_settings: Settings) -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    runner = ScriptedRunner()
    worker = executor(client, fake_settings, runner)
    batch = scheduled_batch(client, fake_settings, ["one", "two"])
    prepared = worker.claim_ahead(batch)
    assert isinstance(prepared, Prepared) and prepared.error is None
    keys = worker._store.keys
    assert [client.hget(keys.request(rid), "status") for rid in ("one", "two")] == ["running", "running"]
    assert client.get(keys.batch_lock(batch.batch_id)) == prepared.claim.token
    assert runner.forwards == []  # nothing ran yet
    assert client.zcard(keys.results_journal) == 2  # its result keys journaled before any forward can write them
    assert isinstance(worker.claim_ahead(batch), Locked)  # a duplicate delivery meanwhile: held
    outcome = worker.run_prepared(prepared)
    assert isinstance(outcome, BatchOutcome)
    assert outcome.wait(5) == {"one": "succeeded", "two": "succeeded"}
    assert runner.forwards == [2]


class UnreadableTasks(ScriptedRunner):
    """A runner whose task list cannot be read: preparing a batch for it raises."""

    @property
    def tasks(self) -> frozenset[Task]:
        raise RuntimeError("no task list")


def test_what_escapes_while_preparing_ahead_fails_the_batch_where_it_runs(fake_settings: Settings) -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    runner = UnreadableTasks()
    worker = executor(client, fake_settings, runner)
    prepared = worker.claim_ahead(scheduled_batch(client, fake_settings, ["one", "two"]))
    assert isinstance(prepared, Prepared)
    assert isinstance(prepared.error, RuntimeError)  # kept, not raised on the lookahead's thread
    outcome = worker.run_prepared(prepared)
    assert outcome.wait(5) == {"one": "failed", "two": "failed"}
    assert runner.forwards == []


@pytest.fixture
def fake_settings() -> Settings:
    return Settings(key_prefix="t", max_batch_attempts=3, batch_lock_ttl_s=5, result_ttl_s=60)


class OneAtATime(ScriptedRunner):
    """A runner that is not fused (one forward per request), each forward reporting its two steps; records which
    request each forward ran."""

    fused = False

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []

    def run(self, specs: Sequence[RequestSpec], on_step: StepCallback) -> list[list[object]]:
        self.ran.append(specs[0].id)
        on_step(1, 2)
        on_step(2, 2)
        return super().run(specs, on_step)


class SeenSteps:
    """A ``ForwardWatch`` that notes, for each step it is told of, the request whose forward reported it."""

    def __init__(self, runner: OneAtATime) -> None:
        self.runner = runner
        self.stepped: list[str] = []

    def forward_started(self) -> None:
        pass

    def step(self, step: int, total: int) -> None:
        self.stepped.append(self.runner.ran[-1])


def test_only_a_batchs_last_forward_is_looked_ahead_of(fake_settings: Settings) -> None:
    """A batch of several forwards (a runner that is not fused): the lookahead is told of the last one's steps only,
    so a batch it takes waits for that forward's end, not for every forward left after the first."""
    client = fakeredis.FakeRedis(decode_responses=True)
    runner = OneAtATime()
    worker = executor(client, fake_settings, runner)
    watch = worker.watch = SeenSteps(runner)
    outcome = worker.execute(scheduled_batch(client, fake_settings, ["one", "two", "three"]))
    assert isinstance(outcome, BatchOutcome)
    assert outcome.wait(5) == dict.fromkeys(("one", "two", "three"), "succeeded")
    assert runner.ran == ["one", "two", "three"]
    assert watch.stepped == ["three", "three"]


def test_a_batch_taken_and_not_collected_in_time_is_handed_back(inbox: Inbox) -> None:
    """The forward it was taken ahead of stalls (a native hang up to the hard time limit): past ``stale_after_s``
    the batch taken goes to ``on_stale`` (the worker gives it back uncounted, another worker runs it) and the
    forward's end collects nothing; one collected in time is never handed back."""
    stale: list[str] = []
    lookahead = Lookahead(inbox.take, lead_s=1.0, poll_every_s=0.001, on_stale=stale.append, stale_after_s=0.1)
    try:
        inbox.items += ["B2", "B3"]
        lookahead.arm()
        lookahead.forward_started()
        lookahead.step(1, 1)
        wait_until(lambda: stale == ["B2"])
        assert lookahead.collect() is None
        assert inbox.looks == 1  # no look after it for that forward
        lookahead.arm()
        lookahead.forward_started()
        lookahead.step(1, 1)
        wait_until(lambda: inbox.looks == 2)
        assert lookahead.collect() == "B3"
        time.sleep(0.2)
        assert stale == ["B2"]
    finally:
        lookahead.close()
