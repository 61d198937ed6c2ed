"""A step-mode worker of each step-mode family (SDXL, PixArt-Sigma, Flux, Sana, Qwen-Image, LTX-Video: the real
tiny demo pipeline, ``FUSEFLEET_DEMO_FAMILY``) is SIGKILLed while its running set holds two requests of two batches
(the one that opened the set, one that joined it with other steps and guidance): nothing is lost. Both batches are
published again once their locks lapse, and each request ends ``succeeded`` exactly once, on the worker that
replaced it, with the image its solo run gives (within 1/255: it ran again from step 0 with its own seed).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from demo_models import ensure_demo_model
from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.families import FAMILIES
from shared.settings import Settings
from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.processes import wait_for
from tests.support.solo import png_array, solo_image

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

# every family with a step-mode adapter, ~20 s each (SD 1.x's kill is tests/chaos/test_step_mode_kill.py)
STEP_FAMILIES = [
    "stable-diffusion-xl",
    "pixart",
    "flux",
    "sana",
    "qwen-image",
    "ltx-video",
]
FRAMES = 9
SIDE = 32
# (opener, joiner) steps: both must still run when the worker is killed, after the joiner's step 2 shows (progress
# is written every 250 ms); with one torch thread a tiny family takes 1-3 ms a step alone on the 2-core VM (tiny
# LTX-Video ran 120 steps in 0.23 s), so 150 steps could end before the kill
STEPS = {"sana": (1500, 1200), "ltx-video": (1500, 1200), "qwen-image": (600, 480)}
DEFAULT_STEPS = (150, 120)  # PixArt's scheduler takes at most 1000


@pytest.mark.parametrize("family", STEP_FAMILIES)
def test_a_killed_step_mode_worker_of_each_family_loses_nothing(
    family: str, chaos_redis: RedisFactory, chaos_fleet: FleetFactory, tmp_path: Path
) -> None:
    cache = tmp_path / "model-cache"  # the chaos fleet's FUSEFLEET_MODEL_CACHE_DIR
    ensure_demo_model(cache, family)  # built once here, not under the worker's start timeout
    fleet = chaos_fleet(
        chaos_redis(),
        workers=1,
        FUSEFLEET_RUNNER="gpu_worker.diffusers_runner:DiffusersRunner",
        FUSEFLEET_DEMO_FAMILY=family,
        FUSEFLEET_STEP_MODE="1",
        FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS="0",
        FUSEFLEET_MAX_INFERENCE_STEPS="2000",
    )
    first = fleet.workers[0]
    node = first.env["FUSEFLEET_WORKER_NAME"]
    shape = {"width": SIDE, "height": SIDE} | ({"num_frames": FRAMES} if FAMILIES[family].traits.video else {})
    opener_steps, joiner_steps = STEPS.get(family, DEFAULT_STEPS)
    opener = fleet.submit(prompt="opens the set", num_inference_steps=opener_steps, seed=1, **shape)
    fleet.wait_running(opener, min_step=2, timeout=120)
    traits = FAMILIES[family].traits
    negative = {"negative_prompt": "blurry"} if traits.negative_prompt else {}
    if traits.true_cfg_scale:  # guided by its negative prompt with its own scale
        negative = {"negative_prompt": "blurry", "true_cfg_scale": 2.5}
    joiner = fleet.submit(
        prompt="joins it", num_inference_steps=joiner_steps, guidance_scale=3.0, seed=2, **shape, **negative
    )
    fleet.wait_running(joiner, min_step=2, timeout=60)
    assert fleet.redis.hget(fleet.keys.request(joiner), "batch_id") != fleet.redis.hget(
        fleet.keys.request(opener), "batch_id"
    )
    assert fleet.redis.hget(fleet.keys.request(joiner), "worker") == node

    statuses = {rid: fleet.redis.hget(fleet.keys.request(rid), "status") for rid in (opener, joiner)}
    first.kill()
    assert statuses == dict.fromkeys((opener, joiner), "running"), f"{family}: ended before the kill: {statuses}"
    killed_at = time.monotonic()
    fleet.add_worker("second")
    ids = [opener, joiner]
    states = fleet.wait_done(ids, timeout=180)
    print(f"\n{family}: both requests ended {time.monotonic() - killed_at:.1f} s after the kill")
    assert {rid: s["status"] for rid, s in states.items()} == dict.fromkeys(ids, "succeeded"), states
    solo_runner = DiffusersRunner(Settings(model_cache_dir=cache, demo_family=family))
    for rid in ids:
        assert fleet.redis.hget(fleet.keys.request(rid), "worker") != node
        events = [fields["event"] for _, fields in fleet.redis.xrange(fleet.keys.request_events(rid))]
        assert events.count("succeeded") == 1 and events[-1] == "succeeded", events
        stored = np.stack([png_array(fleet.image(rid, i)) for i in range(len(states[rid]["images"]))])
        difference = np.abs(stored - solo_image(solo_runner, states[rid])).max()
        assert difference <= 1, f"{family}: {rid} differs from its solo run by {difference}/255"
    wait_for(lambda: not fleet.redis.zcard(fleet.keys.inflight), 10, "every batch to leave flight")
