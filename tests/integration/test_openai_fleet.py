"""The OpenAI Images API of a real fleet (tiny demo model, real diffusers runner), called with the official
``openai`` client: answers, errors, fused batches, edits, models, and a client that hangs up."""

from __future__ import annotations

import base64
import io
import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from PIL import Image

from tests.integration.conftest import Fleet, running_fleet
from tests.support.processes import wait_for
from tests.support.redis_server import RedisServer


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("openai-fleet-logs")
    runner = "gpu_worker.diffusers_runner:DiffusersRunner"
    with running_fleet(redis_server, model_cache, lora_dir, logs, FUSEFLEET_RUNNER=runner) as one:
        yield one


@pytest.fixture(scope="module")
def client(fleet: Fleet) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet.base_url + "/v1", api_key="unused", max_retries=0, timeout=120) as one:
        yield one


def png_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "PNG"
        return image.size


def png(width: int, height: int, color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_generate_b64_json_and_url(fleet: Fleet, client: openai.OpenAI) -> None:
    raw = client.images.with_raw_response.generate(prompt="a lighthouse at dusk", n=2, size="64x32")
    result = raw.parse()
    request_id = raw.headers["x-request-id"]
    assert [png_size(base64.b64decode(image.b64_json or "")) for image in result.data or []] == [(64, 32)] * 2
    state = fleet.get(request_id)
    assert (state["status"], state["params"]["n"], state["params"]["width"]) == ("succeeded", 2, 64)

    result = client.images.generate(prompt="a red fox", response_format="url", extra_body={"seed": 7})
    [image] = result.data or []
    assert image.url is not None and image.url.startswith(fleet.base_url + "/v1/requests/")
    fetched = httpx.get(image.url, timeout=30)
    assert fetched.status_code == 200 and png_size(fetched.content) == (64, 64)


def test_errors_are_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad_size:
        client.images.generate(prompt="a red fox", size="63x64")
    assert (bad_size.value.param, bad_size.value.code) == ("size", "invalid_value")
    assert "max_image_side" in bad_size.value.message
    with pytest.raises(openai.NotFoundError) as unknown_model:
        client.images.generate(prompt="a red fox", model="dall-e-3")
    assert unknown_model.value.code == "model_not_found" and "dall-e-3" in unknown_model.value.message
    with pytest.raises(openai.BadRequestError) as unknown_field:
        client.images.generate(prompt="a red fox", extra_body={"steps": 4})
    assert (unknown_field.value.param, unknown_field.value.code) == ("steps", "unknown_parameter")


def test_models(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == ["demo"]
    assert client.models.retrieve("demo").owned_by == "fusefleet"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-image-1")


def test_concurrent_calls_are_fused(fleet: Fleet, client: openai.OpenAI) -> None:
    def call(i: int) -> str:
        raw = client.images.with_raw_response.generate(prompt=f"a lighthouse number {i}")
        assert len(raw.parse().data or []) == 1
        return raw.headers["x-request-id"]

    with ThreadPoolExecutor(max_workers=6) as pool:
        ids = list(pool.map(call, range(6)))
    sizes = [fleet.get(request_id)["batch_size"] for request_id in ids]
    assert len(set(ids)) == 6
    assert max(sizes) > 1, f"no call was fused: batch sizes {sizes}"


def test_a_client_that_hangs_up_aborts_its_request(fleet: Fleet) -> None:
    prompt = f"a very long dream {uuid.uuid4().hex}"
    body = {"prompt": prompt, "num_inference_steps": 999}  # the scheduler's most; minutes on CPU
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(fleet.base_url + "/v1/images/generations", json=body, timeout=1)

    def aborted() -> bool:
        # hashes only: the pattern also matches each request's event stream (P:req:{id}:events)
        for key in fleet.redis.scan_iter(match=fleet.keys.request("*"), count=1000, _type="hash"):
            spec, status = fleet.redis.hmget(key, ["spec", "status"])
            if spec and json.loads(spec)["prompt"] == prompt:
                return status == "aborted"
        return False

    wait_for(aborted, 30, "the abandoned request to be aborted")


def _edit(client: openai.OpenAI, **kwargs: object) -> openai.types.ImagesResponse:
    return client.images.edit(**kwargs)  # type: ignore[call-overload, no-any-return]


def test_edit_with_and_without_a_mask(client: openai.OpenAI) -> None:
    image = ("in.png", png(96, 96, (200, 40, 40)), "image/png")
    result = _edit(client, image=image, prompt="a red fox", size="64x32", n=2, extra_body={"strength": 0.6})
    assert [png_size(base64.b64decode(item.b64_json or "")) for item in result.data or []] == [(64, 32)] * 2

    mask = ("mask.png", png(64, 64, (255, 255, 255)), "image/png")
    result = _edit(client, image=image, mask=mask, prompt="a red fox", response_format="url")
    [item] = result.data or []
    assert item.url is not None and png_size(httpx.get(item.url, timeout=30).content) == (64, 64)


def test_a_call_sent_again_under_its_idempotency_key_runs_once(fleet: Fleet, client: openai.OpenAI) -> None:
    """The official client with ``Idempotency-Key`` (``extra_headers``) on a real Redis: the second call is answered
    from the first request, the same images, and the fleet queued one request; another body with the key is a 400
    (OpenAI's shape of the 422) naming the header."""
    key = {"Idempotency-Key": uuid.uuid4().hex}
    accepted_before = fleet.redis.xinfo_stream(fleet.keys.requests)["entries-added"]
    first = client.images.with_raw_response.generate(prompt="a kite", size="64x32", extra_headers=key)
    again = client.images.with_raw_response.generate(prompt="a kite", size="64x32", extra_headers=key)
    assert again.headers["x-request-id"] == first.headers["x-request-id"]
    assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    images = [[image.b64_json for image in raw.parse().data or []] for raw in (first, again)]
    assert images[0] == images[1] and images[0]
    assert fleet.redis.xinfo_stream(fleet.keys.requests)["entries-added"] == accepted_before + 1
    with pytest.raises(openai.BadRequestError) as caught:
        client.images.generate(prompt="a kite", size="64x64", extra_headers=key)
    assert caught.value.status_code == 400 and "Idempotency-Key" in str(caught.value.body)


def test_a_keyed_call_that_hangs_up_leaves_its_request_to_the_retry(fleet: Fleet) -> None:
    """With an Idempotency-Key, a call whose client went away does not abort its request: the retry with the key
    waits for that same request and answers its images."""
    body = {"prompt": f"a slow tide {uuid.uuid4().hex}", "num_inference_steps": 200}
    key = {"Idempotency-Key": uuid.uuid4().hex}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(fleet.base_url + "/v1/images/generations", json=body, headers=key, timeout=0.5)
    retried = httpx.post(fleet.base_url + "/v1/images/generations", json=body, headers=key, timeout=120)
    assert retried.status_code == 200, retried.text
    assert retried.headers["idempotent-replayed"] == "true" and len(retried.json()["data"]) == 1
    assert fleet.get(retried.headers["x-request-id"])["status"] == "succeeded"
