"""The input budget on a real fleet (Redis, api, scheduler, a worker on the tiny demo model): input images held by
unfinished requests are counted in Redis (``P:inputs:bytes``), a submission past ``max_queued_input_bytes`` is
refused (429 with Retry-After, or 413 when it alone exceeds it), and every way a request ends gives its bytes back:
succeeded, failed, aborted (queued and running) and timed out (its ``timeout_s`` passed while queued).
"""

from __future__ import annotations

import base64
import io
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.integration.conftest import Fleet, running_fleet
from tests.support.redis_server import RedisServer

SIDE = 64


def noise_png(seed: int) -> bytes:
    """A ``SIDE`` x ``SIDE`` noise PNG: the request's size, so the api stores these very bytes."""
    image = Image.frombytes("RGB", (SIDE, SIDE), random.Random(seed).randbytes(SIDE * SIDE * 3))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


INPUTS = [noise_png(seed) for seed in range(4)]
ONE = max(len(data) for data in INPUTS)
BUDGET = 2 * ONE + ONE // 2  # two inputs fit, a third does not


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    log_dir = tmp_path_factory.mktemp("input-budget-fleet")
    env = {"FUSEFLEET_MAX_QUEUED_INPUT_BYTES": str(BUDGET)}
    with running_fleet(redis_server, model_cache, lora_dir, log_dir, **env) as one:
        yield one


def body(prompt: str, data: bytes, **params: Any) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "width": SIDE,
        "height": SIDE,
        "num_inference_steps": 4,
        "image": base64.b64encode(data).decode(),
        "strength": 0.5,
        **params,
    }


def held(fleet: Fleet) -> int:
    return int(fleet.redis.get(fleet.keys.input_bytes) or 0)


def test_the_budget_refuses_past_it_and_every_ending_frees_it(fleet: Fleet) -> None:
    blocker = fleet.submit(prompt="endless", num_inference_steps=900)  # holds the one worker: the rest stay queued
    fleet.wait_running(blocker, min_step=1)
    late = fleet.submit(**body("late", INPUTS[0], timeout_s=1.0))
    dropped = fleet.submit(**body("dropped", INPUTS[1]))
    assert fleet.redis.hstrlen(fleet.keys.request(late), "input_image") == len(INPUTS[0])  # the bytes as sent
    assert held(fleet) == len(INPUTS[0]) + len(INPUTS[1])

    refused = fleet.http.post("/v1/requests", json=body("one too many", INPUTS[2]))
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == "5"
    assert refused.json()["detail"].startswith("body.image: "), refused.text
    assert held(fleet) == len(INPUTS[0]) + len(INPUTS[1])  # nothing of the refused one was counted

    alone = fleet.http.post("/v1/requests/batch", json={"requests": [body(f"b{i}", INPUTS[i]) for i in range(3)]})
    assert alone.status_code == 413, alone.text  # 3 inputs exceed the whole budget: never accepted
    assert alone.json()["detail"].startswith("body.requests.0.image: "), alone.text

    assert fleet.http.post(f"/v1/requests/{dropped}/abort").json()["status"] == "aborted"  # aborted queued
    assert held(fleet) == len(INPUTS[0])
    state = fleet.wait_done([late], timeout=30)[late]  # its timeout_s passes while queued: expire.lua
    assert (state["status"], state["error"]["type"]) == ("failed", "Timeout"), state
    assert held(fleet) == 0

    fleet.http.post(f"/v1/requests/{blocker}/abort")
    fleet.wait_done([blocker], timeout=30)
    ok = fleet.submit(**body("a watercolor fox", INPUTS[2]))
    culprit = fleet.submit(**body("explode", INPUTS[3]))  # the test runner raises for it
    states = fleet.wait_done([ok, culprit], timeout=60)
    assert states[ok]["status"] == "succeeded" and states[culprit]["status"] == "failed", states
    assert held(fleet) == 0

    running = fleet.submit(**body("slow", INPUTS[0], num_inference_steps=900))
    fleet.wait_running(running, min_step=1)
    assert held(fleet) == len(INPUTS[0])  # held while it runs
    fleet.http.post(f"/v1/requests/{running}/abort")
    assert fleet.wait_done([running], timeout=30)[running]["status"] == "aborted"  # aborted running: finish.lua
    assert held(fleet) == 0
    for rid in (late, dropped, ok, culprit, running):
        assert not fleet.redis.hexists(fleet.keys.request(rid), "input_image")
