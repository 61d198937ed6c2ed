"""Step-mode preemption end to end (``FUSEFLEET_STEP_MODE=1``, docs/step_mode.md "Priorities and preemption"): real
api, scheduler and one worker process on the tiny demo model, a running set of at most 2 requests. Two long
low-priority requests fill the set; a high-priority request arrives, takes one's room at a step boundary and ends
first; the evicted one is requeued (its event stream says so, the api serves the event) and still ends succeeded
with its solo image.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from fusefleet.client import Client
from gpu_worker.diffusers_runner import DiffusersRunner
from shared.events import RequeuedEvent
from tests.integration.conftest import Fleet, running_fleet
from tests.support.redis_server import RedisServer
from tests.support.solo import png_array, solo_image

LOW_STEPS = 60  # 12x the high request's steps: the low ones still run when it ends, however slow a step is
HIGH_STEPS = 5


def _position(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _story(fleet: Fleet, statuses: dict[str, str], request_ids: list[str]) -> str:
    """What a failed timing assertion prints: the statuses, each request's events and what the services logged
    about the set (CI keeps no log files)."""
    events = {
        rid: [(entry, f["event"], f.get("step")) for entry, f in fleet.redis.xrange(fleet.keys.request_events(rid))]
        for rid in request_ids
    }
    logged = fleet.log_excerpt(r"preempt|evict|joined|refused|published|sealed|closed|heartbeat|lease|WARNING|ERROR")
    return f"{statuses}\nevents: {events}\nlogs:\n{logged}"


@pytest.fixture(scope="module")
def small_set_fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    log_dir = tmp_path_factory.mktemp("preemption-fleet-logs")
    env = {"FUSEFLEET_STEP_MODE": "1", "FUSEFLEET_MAX_NUM_SEQS": "2", "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "0"}
    with running_fleet(redis_server, model_cache, lora_dir, log_dir, **env) as fleet:
        yield fleet


def test_a_higher_priority_request_preempts_a_low_one_which_is_requeued_and_still_succeeds(
    small_set_fleet: Fleet, solo_runner: DiffusersRunner
) -> None:
    fleet = small_set_fleet
    lows = fleet.submit_batch(
        [{"prompt": f"low {i}", "num_inference_steps": LOW_STEPS, "priority": -2, "seed": 40 + i} for i in (0, 1)]
    )
    for rid in lows:
        fleet.wait_running(rid, min_step=2)
    submitted = time.monotonic()
    high = fleet.submit(prompt="urgent", num_inference_steps=HIGH_STEPS, priority=2, seed=50)
    state = fleet.wait_done([high], timeout=30)[high]
    waited = time.monotonic() - submitted
    # read at once: the solo run below takes seconds on a loaded host, while the low ones go on
    still = {rid: fleet.get(rid)["status"] for rid in lows}
    assert state["status"] == "succeeded", (state, fleet.logs_hint())
    assert "succeeded" not in still.values(), _story(fleet, still, [*lows, high])  # it waited for no low one
    assert np.abs(png_array(fleet.image(high)) - solo_image(solo_runner, state)).max() <= 1
    # one low request was requeued: its events say so, at the step it had reached, on the set's worker
    requeued = {
        rid: [f for _, f in fleet.redis.xrange(fleet.keys.request_events(rid)) if f["event"] == "requeued"]
        for rid in lows
    }
    evicted = [rid for rid, events in requeued.items() if events]
    assert len(evicted) == 1, requeued
    [event] = requeued[evicted[0]]
    assert 2 <= int(event["step"]) < LOW_STEPS // 2 and event["worker"], event
    # the high request took the freed room: scheduled (joined) after the eviction, not in a set of its own
    high_events = fleet.redis.xrange(fleet.keys.request_events(high))
    scheduled_at = next(entry for entry, f in high_events if f["event"] == "scheduled")
    requeued_at = next(
        entry for entry, f in fleet.redis.xrange(fleet.keys.request_events(evicted[0])) if f["event"] == "requeued"
    )
    assert _position(scheduled_at) > _position(requeued_at)
    print(f"\nhigh priority: ended {waited:.2f} s after submission; {evicted[0]} requeued at step {event['step']}")

    states = fleet.wait_done(lows, timeout=120)
    assert {s["status"] for s in states.values()} == {"succeeded"}, (states, fleet.logs_hint())
    assert len({view["worker"] for view in [state, *states.values()]}) == 1  # one worker, one set at a time
    for rid in lows:  # the requeued one ran again from step 0: its image is still its solo run's
        assert states[rid]["progress"] == {"step": LOW_STEPS, "total": LOW_STEPS}, states[rid]["progress"]
        assert np.abs(png_array(fleet.image(rid)) - solo_image(solo_runner, states[rid])).max() <= 1, rid
    ended = {rid: datetime.fromisoformat(view["finished_at"]) for rid, view in {**states, high: state}.items()}
    assert ended[high] < min(ended[rid] for rid in lows), ended
    with Client(fleet.base_url, timeout=30) as client:  # the api serves the event
        names = [(sse.name, sse.data) for sse in client.events(evicted[0])]
    served = [data for name, data in names if name == "requeued"]
    assert len(served) == 1 and isinstance(served[0], RequeuedEvent) and served[0].step == int(event["step"])
    after = [name for name, _ in names][[name for name, _ in names].index("requeued") :]
    assert after[:3] == ["requeued", "scheduled", "running"] and after[-1] == "succeeded", after
