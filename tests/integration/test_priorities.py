"""Priorities and deadlines on a real fleet: api, scheduler and one worker process running ``SimulatedGpuRunner``
(simulated forwards: 300 ms + 300 ms per image, reported step by step; no model to load), one request per batch.

A high-priority request overtakes a queued backlog; a request that cannot start within its ``timeout_s`` fails
with ``Timeout``; one still running at its deadline is aborted mid-forward, its error saying ``Timeout``.
"""

from __future__ import annotations

from datetime import datetime

from tests.support.fleet import Fleet, fleet_fixture

FORWARD_S = {1: 0.6, 8: 2.7}  # the simulated forward of a request of n images: 0.3 s + 0.3 s x n
PRIORITY_ENV = {
    "FUSEFLEET_RUNNER": "bench.runners:SimulatedGpuRunner",
    "FUSEFLEET_SIM_BASE_MS": "300",
    "FUSEFLEET_SIM_PER_IMAGE_MS": "300",
    "FUSEFLEET_MAX_NUM_SEQS": "1",
    "FUSEFLEET_MAX_IMAGES_PER_REQUEST": "8",
    "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
    "FUSEFLEET_MAX_TIMEOUT_S": "60",
}


fleet = fleet_fixture(PRIORITY_ENV, "priorities-fleet")


def _at(view: dict[str, object], field: str) -> float:
    value = view[field]
    assert isinstance(value, str), (field, view)
    return datetime.fromisoformat(value).timestamp()


def test_a_high_priority_request_overtakes_a_queued_backlog(fleet: Fleet) -> None:
    backlog = fleet.submit_batch([{"prompt": f"backlog {i}", "priority": -1} for i in range(6)])
    high = fleet.submit(prompt="urgent", priority=2)
    states = fleet.wait_done([*backlog, high], timeout=60)
    assert {state["status"] for state in states.values()} == {"succeeded"}, fleet.logs_hint()
    high_started = _at(states[high], "started_at")
    started_before = [rid for rid in backlog if _at(states[rid], "started_at") < high_started]
    # at most the backlog request running when it arrived (and the next one, had its batch just been published)
    assert len(started_before) <= 2, (started_before, fleet.logs_hint())
    # and the backlog itself ran in submission order (FIFO within a level)
    assert sorted(backlog, key=lambda rid: _at(states[rid], "started_at")) == backlog
    assert states[high]["params"]["priority"] == 2


def test_a_request_that_cannot_start_in_time_fails_with_timeout(fleet: Fleet) -> None:
    blocker = fleet.submit(prompt="blocker", n=8, num_inference_steps=30)
    fleet.wait_running(blocker, min_step=1)
    hasty = fleet.submit(prompt="hasty", timeout_s=0.5)
    state = fleet.wait_done([hasty], timeout=10)[hasty]
    assert state["status"] == "failed" and state["error"]["type"] == "Timeout", state
    assert state["started_at"] is None
    waited = _at(state, "finished_at") - _at(state, "created_at")
    assert 0.5 <= waited < 1.5, waited  # the scheduler woke for the deadline, well before the blocker ended
    print(f"\nqueued past timeout_s 0.5: failed Timeout {waited:.3f} s after submission")
    assert fleet.get(blocker)["status"] == "running"
    fleet.http.post(f"/v1/requests/{blocker}/abort")
    assert fleet.wait_done([blocker], timeout=10)[blocker]["status"] == "aborted"


def test_a_request_still_running_at_its_deadline_is_aborted(fleet: Fleet) -> None:
    slow = fleet.submit(prompt="slow", n=8, num_inference_steps=30, timeout_s=0.5)
    state = fleet.wait_done([slow], timeout=10)[slow]
    assert state["status"] == "aborted", state
    assert state["error"]["type"] == "Timeout" and "deadline" in state["error"]["message"], state
    ran = _at(state, "finished_at") - _at(state, "started_at")
    # the deadline sweep (about every second) flagged it; the forward stopped at its next step, long before its end
    assert ran < FORWARD_S[8] - 0.5, ran
    ended = _at(state, "finished_at") - _at(state, "created_at")
    print(f"\nrunning past timeout_s 0.5: aborted {ended:.3f} s after submission, {ran:.3f} s into its run")
    assert state["progress"]["step"] < state["progress"]["total"], state
    assert state["images"] == []
