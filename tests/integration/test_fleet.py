"""End to end through real processes: api -> Redis stream -> scheduler -> Celery -> worker -> results."""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gpu_worker.diffusers_runner import DiffusersRunner
from shared.contracts import LoraRef
from tests.integration.conftest import LORA_NAME, Fleet
from tests.support.runners import EXPLODE_MARKER
from tests.support.solo import png_array, solo_image


def test_concurrent_compatible_requests_are_fused_and_match_solo_runs(
    fleet: Fleet, solo_runner: DiffusersRunner
) -> None:
    prompts = [f"a lighthouse number {i}" for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = list(pool.map(lambda p: fleet.submit(prompt=p), prompts))
    states = fleet.wait_done(ids)

    assert {s["status"] for s in states.values()} == {"succeeded"}
    sizes = [s["batch_size"] for s in states.values()]
    assert max(sizes) > 1, f"no request was fused: batch sizes {sizes}"
    assert max(sizes) <= 4
    members: dict[str, int] = defaultdict(int)
    for state in states.values():
        members[state["batch_id"]] += 1
    for state in states.values():
        assert members[state["batch_id"]] == state["batch_size"]
        assert state["progress"] == {"step": 4, "total": 4}
    for rid, state in states.items():
        fused = png_array(fleet.image(rid))
        assert np.abs(fused - solo_image(solo_runner, state)).max() <= 1, f"request {rid} differs from solo"


def test_requests_of_two_sizes_never_share_a_batch(fleet: Fleet) -> None:
    sizes = [64, 32] * 4
    ids = fleet.http.post(
        "/v1/requests/batch",
        json={
            "requests": [
                {"prompt": f"tile {i}", "width": s, "height": s, "num_inference_steps": 4} for i, s in enumerate(sizes)
            ]
        },
    ).json()["ids"]
    states = fleet.wait_done(ids)
    size_of_batch: dict[str, set[int]] = defaultdict(set)
    for state in states.values():
        assert state["status"] == "succeeded", state
        size_of_batch[state["batch_id"]].add(state["params"]["width"])
    assert all(len(widths) == 1 for widths in size_of_batch.values()), size_of_batch
    assert png_array(fleet.image(ids[1])).shape == (32, 32, 3)


def test_a_failing_request_fails_alone(fleet: Fleet) -> None:
    ids = fleet.http.post(
        "/v1/requests/batch",
        json={
            "requests": [
                {"prompt": p, "num_inference_steps": 4}
                for p in ["calm sea", f"please {EXPLODE_MARKER}", "quiet forest", "old town"]
            ]
        },
    ).json()["ids"]
    states = fleet.wait_done(ids)
    culprit = states[ids[1]]
    assert culprit["status"] == "failed"
    assert culprit["error"]["type"] == "ValueError"
    assert "explode" in culprit["error"]["message"]
    assert culprit["images"] == []
    for rid in (ids[0], ids[2], ids[3]):
        assert states[rid]["status"] == "succeeded", states[rid]
        assert states[rid]["error"] is None
        assert len(fleet.image(rid)) > 0
    assert len({s["batch_id"] for s in states.values()}) < 4, "the four requests should have been fused"


def test_lora_adapters_and_scales_share_a_batch_and_each_equals_its_solo_run(
    fleet: Fleet, solo_runner: DiffusersRunner
) -> None:
    """Requests with different adapters, scales, or none are fused into one forward (the LoRA is per row), and each
    image equals its solo run; the adapter and the scale really change the image."""
    loras = [
        LoraRef(name=LORA_NAME, scale=1.0),
        LoraRef(name=LORA_NAME, scale=1.0),
        LoraRef(name=LORA_NAME, scale=0.5),
        None,
    ]
    prompts = [("a castle", 11), ("a bridge", 12), ("a castle", 11), ("a castle", 11)]
    requests = [
        {"prompt": prompt, "seed": seed, **({"lora": lora.model_dump()} if lora else {})}
        for (prompt, seed), lora in zip(prompts, loras, strict=True)
    ]
    ids = fleet.http.post("/v1/requests/batch", json={"requests": requests}).json()["ids"]
    states = fleet.wait_done(ids)
    assert all(s["status"] == "succeeded" for s in states.values()), states
    assert len({s["batch_id"] for s in states.values()}) == 1, "the four requests should share one batch"
    images = [png_array(fleet.image(rid)) for rid in ids]
    for rid, image, lora in zip(ids, images, loras, strict=True):
        assert np.abs(image - solo_image(solo_runner, states[rid], lora)).max() <= 1, f"{rid} ({lora}) != solo"
    with_lora, half_lora, without = images[0], images[2], images[3]
    assert np.abs(with_lora - without).max() > 1
    assert np.abs(with_lora - half_lora).max() > 1


def test_abort_while_running_stops_it_and_spares_peers(fleet: Fleet) -> None:
    slow = {"num_inference_steps": 150}
    ids = fleet.http.post(
        "/v1/requests/batch", json={"requests": [{"prompt": "victim", **slow}, {"prompt": "peer", **slow}]}
    ).json()["ids"]
    victim, peer = ids
    assert fleet.wait_running(victim, min_step=2)["status"] == "running"
    answer = fleet.http.post(f"/v1/requests/{victim}/abort")
    assert answer.status_code == 200 and answer.json()["status"] == "running"
    ended = fleet.http.get(f"/v1/requests/{victim}?wait_s=20").json()  # a long poll: woken when it ends
    assert ended["status"] == "aborted"
    during = fleet.get(peer)  # the victim ended at once, while the fused forward still runs for its peer
    assert during["status"] == "running" and during["progress"]["step"] < slow["num_inference_steps"], during
    states = fleet.wait_done(ids)
    assert states[victim]["status"] == "aborted"
    assert states[victim]["images"] == []
    assert fleet.http.get(f"/v1/requests/{victim}/images/0").status_code == 404
    assert states[peer]["status"] == "succeeded"
    assert states[peer]["batch_id"] == states[victim]["batch_id"]
    assert fleet.http.post(f"/v1/requests/{peer}/abort").status_code == 409


def test_aborting_every_request_of_a_forward_stops_it_early(fleet: Fleet) -> None:
    rid = fleet.submit(prompt="endless", num_inference_steps=900)
    fleet.wait_running(rid, min_step=2)
    fleet.http.post(f"/v1/requests/{rid}/abort")
    state = fleet.wait_done([rid], timeout=30)[rid]
    assert state["status"] == "aborted"
    assert state["progress"]["step"] < 900


def test_abort_while_queued_never_runs(fleet: Fleet) -> None:
    fleet.scheduler.stop()
    try:
        queued = fleet.submit(prompt="never")
        assert fleet.http.post(f"/v1/requests/{queued}/abort").json()["status"] == "aborted"
        assert fleet.http.post(f"/v1/requests/{queued}/abort").json()["status"] == "aborted"  # idempotent
    finally:
        fleet.scheduler.start()
    later = fleet.submit(prompt="after")
    fleet.wait_done([later])
    state = fleet.get(queued)
    assert state["status"] == "aborted"
    assert state["batch_id"] is None and state["started_at"] is None


def test_killed_and_restarted_scheduler_loses_nothing(fleet: Fleet) -> None:
    ids = [fleet.submit(prompt=f"wave one {i}") for i in range(6)]
    fleet.scheduler.kill()
    ids += [fleet.submit(prompt=f"while down {i}") for i in range(6)]
    time.sleep(0.2)
    fleet.scheduler.start()
    ids += [fleet.submit(prompt=f"after restart {i}") for i in range(6)]
    states = fleet.wait_done(ids)
    assert {s["status"] for s in states.values()} == {"succeeded"}
    for batch_id in {s["batch_id"] for s in states.values()}:
        assert fleet.redis.hget(fleet.keys.batch(batch_id), "attempts") == "1", f"batch {batch_id} ran twice"


def test_a_standby_scheduler_takes_over_when_the_active_one_dies(fleet: Fleet) -> None:
    standby = fleet.new_scheduler("scheduler-standby").start()
    try:
        time.sleep(1.0)  # let the standby find the lease taken
        first = fleet.submit(prompt="before the crash")
        fleet.wait_done([first])
        fleet.scheduler.kill()
        after = [fleet.submit(prompt=f"after the crash {i}") for i in range(4)]
        states = fleet.wait_done(after, timeout=60)
        assert {s["status"] for s in states.values()} == {"succeeded"}
        assert "is active" in standby.log()
    finally:
        standby.stop()
        fleet.scheduler.start()
