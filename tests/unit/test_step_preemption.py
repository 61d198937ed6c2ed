"""Step-mode preemption on the worker (``gpu_worker.step_loop``), on fakeredis with the real Lua scripts and the real
diffusers runner on the tiny demo model (the fixtures of ``tests/unit/test_step_loop.py`` and its conftest): an
eviction the scheduler sends (``step_evict.lua``) takes a running request out of the set at the next step boundary
and requeues it (``requeue.lua``); a higher-priority request joins the freed room and finishes first; the evicted
request's batch still completes with its other request; run again, the evicted request gives its solo images.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("diffusers")

from gpu_worker.diffusers_runner import DiffusersRunner  # noqa: E402
from gpu_worker.step_loop import SetOutcome  # noqa: E402
from scheduler.store import SchedulerStore  # noqa: E402
from shared.compat import step_key  # noqa: E402
from shared.contracts import BatchMessage, StepEviction  # noqa: E402
from tests.support.solo import solo_arrays  # noqa: E402
from tests.unit.test_step_loop import (  # noqa: E402, F401 - fixtures
    WORKER,
    Hooked,
    Worker,
    hooked,
    settings,
    spec,
    stored_images,
    worker,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # and ``runner``, ``client``: tests/unit/conftest.py


def test_an_evicted_request_is_requeued_and_a_higher_level_takes_its_room(
    worker: Worker,  # noqa: F811 - the fixture
    hooked: Hooked,  # noqa: F811
    runner: DiffusersRunner,  # noqa: F811
) -> None:
    low1 = spec("low1", steps=8, seed=21).model_copy(update={"priority": -2})
    low2 = spec("low2", steps=8, seed=22).model_copy(update={"priority": -2})
    high = spec("high", steps=2, seed=23).model_copy(update={"priority": 2})
    digest = step_key(low1).digest
    scheduler = SchedulerStore(worker.client, worker.settings)
    seen: dict[str, object] = {}

    def look() -> None:
        worker.loop.settle()  # the levels written (off the loop)
        levels = worker.client.hgetall(worker.keys.step_levels(WORKER))
        seen["levels"] = {rid: value.split()[0] for rid, value in levels.items()}

    def preempt() -> None:  # what the scheduler does: evict low2, then (once its room is free) join high
        worker.client.rpush(worker.keys.step_inbox(WORKER), StepEviction(evict="nobody").model_dump_json())
        assert scheduler.step_evict(WORKER, digest, "low2")
        worker.send(worker.schedule("B2", [high]), step_key(high).digest)

    def after() -> None:
        seen["rows"] = worker.client.hget(worker.keys.step_rows, WORKER)
        seen["low2"] = worker.request("low2")["status"]

    hooked.hooks[1] = look
    hooked.hooks[3] = preempt  # read at the boundary after step 3
    hooked.hooks[4] = after
    outcome = worker.loop.run(worker.schedule("B1", [low1, low2]))
    assert isinstance(outcome, SetOutcome)
    assert outcome.batches == ["B1", "B2"]
    assert outcome.statuses == {"low1": "succeeded", "low2": "queued", "high": "succeeded"}
    assert seen == {"levels": {"low1": "-2", "low2": "-2"}, "rows": "2", "low2": "queued"}
    assert float(worker.request("high")["finished_at"]) < float(worker.request("low1")["finished_at"])
    assert hooked.steps == 8  # low1's steps: the high request ran within them

    state = worker.request("low2")
    assert state["status"] == "queued" and state["step"] == "0" and "claim" not in state and "results" not in state
    [(entry_id, fields)] = worker.client.xrange(worker.keys.requests, count=10)[-1:]
    assert fields["id"] == "low2" and fields["requeued"] == "1" and state["entry"] == entry_id
    events = [f["event"] for _, f in worker.client.xrange(worker.keys.request_events("low2"))]
    assert events[-1] == "requeued" and "running" in events
    worker.assert_closed()  # B1 left flight with low1 (low2 no longer counts in it); nothing held or counted
    assert not worker.client.exists(worker.keys.step_levels(WORKER))

    # the requeued request runs again from step 0 and gives its solo images
    assert scheduler.schedule(worker.lease.key, worker.lease.token, "B3", ["low2"]) == ["low2"]
    again = worker.loop.run(BatchMessage(batch_id="B3", request_ids=("low2",), created_at=time.time()))
    assert isinstance(again, SetOutcome) and again.statuses == {"low2": "succeeded"}
    (image,) = stored_images(worker, "low2")
    assert int(np.abs(image - solo_arrays(runner, low2)[0]).max()) <= 1
    assert worker.request("low2")["batch_id"] == "B3"
    worker.assert_closed()


def test_a_sealed_set_ignores_an_eviction(worker: Worker, hooked: Hooked) -> None:  # noqa: F811 - the fixtures
    worker.loop.seal_after_s = 0.0
    low = spec("low", steps=4, seed=31).model_copy(update={"priority": -2})

    def evict() -> None:  # sent before the set was sealed (the scheduler's read was older)
        worker.client.rpush(worker.keys.step_inbox(WORKER), StepEviction(evict="low").model_dump_json())

    hooked.hooks[1] = evict
    outcome = worker.loop.run(worker.schedule("B1", [low]))
    assert isinstance(outcome, SetOutcome) and outcome.statuses == {"low": "succeeded"}
    assert hooked.steps == 4
    worker.assert_closed()


def test_an_eviction_of_a_request_in_its_last_step_is_ignored(worker: Worker, hooked: Hooked) -> None:  # noqa: F811
    low = spec("low", steps=3, seed=41).model_copy(update={"priority": -2})
    peer = spec("peer", steps=5, seed=42).model_copy(update={"priority": -2})

    def evict() -> None:  # sent before its count-out: read at the boundary before its last step (step 3)
        worker.client.rpush(worker.keys.step_inbox(WORKER), StepEviction(evict="low").model_dump_json())
        worker.loop.settle()  # read ahead of that boundary

    hooked.hooks[2] = evict
    outcome = worker.loop.run(worker.schedule("B1", [low, peer]))
    # counted out there already (its room went to the scheduler), it finishes instead of being requeued, and the
    # set's count drops by it once
    assert isinstance(outcome, SetOutcome) and outcome.statuses == {"low": "succeeded", "peer": "succeeded"}
    assert hooked.steps == 5
    worker.assert_closed()


# --- the fair order's swap (step_swap.lua: the eviction and the batch taking its room, together) -----------------


def swap(worker: Worker, evict: str, message: BatchMessage, digest: str, cap: int) -> None:  # noqa: F811
    """What the scheduler does for a swap: ``step_swap.lua`` puts the eviction, then the batch, in the inbox."""
    scheduler = SchedulerStore(worker.client, worker.settings.model_copy(update={"worker_ttl_s": 60}))
    sent = scheduler.step_swap(WORKER, digest, message.model_dump_json(), message.batch_id, 1, cap, evict)
    assert sent == 2


def test_a_swap_evicts_in_a_sealed_set_too_and_its_batch_takes_the_room(worker: Worker, hooked: Hooked) -> None:  # noqa: F811
    flood1 = spec("flood1", steps=6, seed=51)
    flood2 = spec("flood2", steps=6, seed=52)
    probe = spec("probe", steps=2, seed=53)
    digest = step_key(flood1).digest

    def send() -> None:  # sent while the set was open; it is sealed by the boundary that reads it
        swap(worker, "flood2", worker.schedule("B2", [probe]), digest, cap=2)
        worker.loop.seal_after_s = 0.0
        worker.loop.settle()

    hooked.hooks[2] = send
    outcome = worker.loop.run(worker.schedule("B1", [flood1, flood2]))
    assert isinstance(outcome, SetOutcome) and outcome.batches == ["B1", "B2"]
    assert outcome.statuses == {"flood1": "succeeded", "flood2": "queued", "probe": "succeeded"}
    assert max(hooked.live) == 2  # the probe ran in flood2's row, never beside it
    assert float(worker.request("probe")["finished_at"]) < float(worker.request("flood1")["finished_at"])
    worker.assert_closed()


def test_a_swap_whose_request_is_in_its_last_step_holds_its_batch_back_a_boundary(
    worker: Worker,  # noqa: F811 - the fixture
    hooked: Hooked,  # noqa: F811
) -> None:
    last = spec("last", steps=3, seed=61)
    peer = spec("peer", steps=6, seed=62)
    probe = spec("probe", steps=2, seed=63)

    def send() -> None:  # read at the boundary before last's last step (step 3), where it is counted out
        swap(worker, "last", worker.schedule("B2", [probe]), step_key(last).digest, cap=2)
        worker.loop.settle()  # claimed ahead of that boundary: it would join there beside "last"

    hooked.hooks[2] = send
    outcome = worker.loop.run(worker.schedule("B1", [last, peer]))
    assert isinstance(outcome, SetOutcome) and outcome.batches == ["B1", "B2"]
    assert outcome.statuses == {"last": "succeeded", "peer": "succeeded", "probe": "succeeded"}
    assert max(hooked.live) == 2  # the probe joined once "last" was done: the set never ran 3 rows
    assert hooked.steps == 6
    worker.assert_closed()
