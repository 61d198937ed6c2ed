"""Image-conditioned requests at the api (fakeredis): decoded, checked, resized and stored once; bad ones refused.

Every refusal is a 422 naming the field, with a message that says what is wrong, and queues nothing.
"""

from __future__ import annotations

import base64
import io
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from shared.contracts import RequestSpec, Task, WorkerCapabilities
from tests.support.api import Api, api_harness, unit_settings

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    settings = unit_settings(tmp_path, max_input_image_bytes=4096, max_input_image_pixels=200 * 200)
    async for harness in api_harness(settings):
        yield harness


def encoded(image: Image.Image, format: str = "PNG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return base64.b64encode(buffer.getvalue()).decode()


RED = Image.new("RGB", (32, 48), (200, 10, 10))
MASK = Image.new("L", (64, 64), 255)


async def submit(api: Api, **body: Any) -> tuple[int, Any]:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", "width": 64, "height": 64, **body})
    return response.status_code, response.json()


async def test_image_to_image_is_stored_once_resized_and_keyed(api: Api) -> None:
    status, answer = await submit(api, image=encoded(RED, "JPEG"), strength=0.6)
    assert status == 202, answer
    key = api.keys.request(answer["id"])
    stored = await api.binary.hget(key, "input_image")
    image = Image.open(io.BytesIO(stored))
    assert (image.format, image.mode, image.size) == ("PNG", "RGB", (64, 64))  # resized to the output size
    assert await api.binary.hget(key, "input_mask") is None
    spec = RequestSpec.model_validate_json(await api.redis.hget(key, "spec"))
    assert (spec.task, spec.strength) == (Task.IMAGE_TO_IMAGE, 0.6)
    ((_, fields),) = await api.redis.xrange(api.keys.requests)
    assert set(fields) == {"id", "spec"}  # the stream entry carries no bytes
    view = (await api.http.get(f"/v1/requests/{answer['id']}")).json()
    assert view["params"]["task"] == "image-to-image" and view["params"]["strength"] == 0.6


async def test_inpainting_stores_the_mask_and_defaults_the_strength(api: Api) -> None:
    data_url = "data:image/png;base64," + encoded(RED)
    status, answer = await submit(api, image=data_url, mask_image=encoded(MASK))
    assert status == 202, answer
    key = api.keys.request(answer["id"])
    mask = Image.open(io.BytesIO(await api.binary.hget(key, "input_mask")))
    assert (mask.mode, mask.size) == ("L", (64, 64))
    spec = RequestSpec.model_validate_json(await api.redis.hget(key, "spec"))
    assert (spec.task, spec.strength) == (Task.INPAINT, 0.8)


async def test_text_to_image_has_no_strength(api: Api) -> None:
    status, answer = await submit(api)
    assert status == 202
    spec = RequestSpec.model_validate_json(await api.redis.hget(api.keys.request(answer["id"]), "spec"))
    assert (spec.task, spec.strength) == (Task.TEXT_TO_IMAGE, None)


GIF = io.BytesIO()
Image.new("RGB", (8, 8)).save(GIF, format="GIF")
BIG = Image.frombytes("RGB", (60, 60), random.Random(1).randbytes(60 * 60 * 3))  # noise: > 4096 bytes as PNG


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"image": "not base64 !!"}, "image", "is not valid base64"),
        ({"image": base64.b64encode(b"plain text").decode()}, "image", "could not be decoded as an image"),
        ({"image": base64.b64encode(GIF.getvalue()).decode()}, "image", "is GIF; send PNG, JPEG or WebP"),
        ({"image": encoded(BIG)}, "image", "max_input_image_bytes is 4096"),
        ({"image": encoded(Image.new("RGB", (300, 200)))}, "image", "max_input_image_pixels is 40000"),
        ({"image": encoded(RED), "mask_image": "%%%"}, "mask_image", "is not valid base64"),
        ({"mask_image": encoded(MASK)}, "mask_image", "mask_image needs an input image"),
        ({"strength": 0.5}, "strength", "strength needs an input image"),
        ({"image": encoded(RED), "strength": 0}, "strength", "greater than 0"),
        ({"image": encoded(RED), "strength": 1.5}, "strength", "less than or equal to 1"),
    ],
    ids=["base64", "not-an-image", "gif", "bytes", "pixels", "mask-base64", "mask-alone", "strength-alone",
         "strength-zero", "strength-high"],
)
async def test_bad_inputs_are_422_naming_the_field_and_queue_nothing(
    api: Api, body: dict[str, Any], field: str, says: str
) -> None:
    status, answer = await submit(api, **body)
    assert status == 422, answer
    (error,) = answer["detail"]
    assert error["loc"] == ["body", field]
    assert says in error["msg"], error["msg"]
    assert len(str(error.get("input"))) < 200  # megabytes of base64 are never echoed
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_one_bad_image_in_a_batch_refuses_the_batch_and_names_it(api: Api) -> None:
    requests = [{"prompt": "ok", "image": encoded(RED)}, {"prompt": "bad", "image": "%%%"}]
    response = await api.http.post("/v1/requests/batch", json={"requests": requests})
    assert response.status_code == 422
    assert [error["loc"] for error in response.json()["detail"]] == [["body", "requests", 1, "image"]]
    assert await api.redis.xlen(api.keys.requests) == 0


async def announce(api: Api, worker: str, *tasks: Task) -> None:
    """A live worker's heartbeat, as heartbeat.lua writes it."""
    await api.redis.zadd(api.keys.workers, {worker: 1})
    capabilities = WorkerCapabilities(model="demo", pipeline="StableDiffusionPipeline", tasks=tasks)
    await api.redis.hset(api.keys.capabilities, worker, capabilities.model_dump_json())


async def test_a_task_no_live_worker_does_is_refused_up_front(api: Api) -> None:
    await announce(api, "w1", Task.TEXT_TO_IMAGE)
    status, answer = await submit(api, image=encoded(RED))
    assert status == 422, answer
    (error,) = answer["detail"]
    assert error["loc"] == ["body", "image"]
    assert error["msg"] == (
        "this fleet's model, demo (StableDiffusionPipeline), does not do image-to-image; it does text-to-image"
    )
    assert await api.redis.xlen(api.keys.requests) == 0
    assert (await submit(api))[0] == 202  # text-to-image still goes


async def test_a_task_one_live_worker_does_is_accepted(api: Api) -> None:
    await announce(api, "w1", Task.TEXT_TO_IMAGE)
    await announce(api, "w2", Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE, Task.INPAINT)
    assert (await submit(api, image=encoded(RED), mask_image=encoded(MASK)))[0] == 202


async def test_nothing_is_refused_while_no_worker_has_announced_itself(api: Api) -> None:
    await api.redis.zadd(api.keys.workers, {"w-without-announcement": 1})
    assert (await submit(api, image=encoded(RED)))[0] == 202
