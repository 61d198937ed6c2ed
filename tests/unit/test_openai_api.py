"""The OpenAI Images API against fakeredis: answer and error shapes, one fleet request per call, its outcomes,
disconnects and time limit, ``/v1/models``. A fake worker ends the queued requests with the ``FINISH`` script."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import httpx
import openai
import pytest
from PIL import Image
from starlette.types import ASGIApp, Message

from api.app import create_app
from api.openai import generation
from gpu_worker.families import FAMILIES
from shared.contracts import OutputFormat, RequestSpec
from shared.settings import Settings
from tests.support.api import Api, api_harness, unit_settings
from tests.unit.test_api_capabilities import announce

pytestmark = pytest.mark.anyio

T = TypeVar("T")
GENERATIONS = "/v1/images/generations"
EDITS = "/v1/images/edits"
JSON = {"content-type": "application/json"}


# --- a fake worker ---------------------------------------------------------------------------------------------


def encoded(
    width: int, height: int, shade: int = 0, fmt: OutputFormat = OutputFormat.PNG, quality: int | None = None
) -> bytes:
    """An image of the size in ``fmt`` (at ``quality`` for jpeg and webp), as the worker encodes it."""
    buffer = io.BytesIO()
    options = {"quality": quality} if quality is not None else {}
    Image.new("RGB", (width, height), (shade, 0, 0)).save(buffer, format=fmt.value.upper(), **options)
    return buffer.getvalue()


def png(width: int, height: int, shade: int = 0) -> bytes:
    return encoded(width, height, shade)


def image_info(data: bytes) -> tuple[str | None, tuple[int, int]]:
    """The format (as PIL names it: ``PNG``, ``JPEG``, ``WEBP``) and the size of encoded image bytes."""
    with Image.open(io.BytesIO(data)) as image:
        return image.format, image.size


def png_size(data: bytes) -> tuple[int, int]:
    fmt, size = image_info(data)
    assert fmt == "PNG"
    return size


async def queued_ids(api: Api) -> list[str]:
    entries = cast(list[tuple[str, dict[str, str]]], await api.redis.xrange(api.keys.requests))
    return [fields["id"] for _, fields in entries]


async def wait_queued(api: Api, count: int = 1) -> list[str]:
    with anyio.fail_after(5):
        while len(ids := await queued_ids(api)) < count:
            await anyio.sleep(0.01)
    return ids


async def spec_of(api: Api, request_id: str) -> RequestSpec:
    raw = await api.redis.hget(api.keys.request(request_id), "spec")
    assert isinstance(raw, str)
    return RequestSpec.model_validate_json(raw)


INPUTS_SEEN: dict[str, list[bytes | None]] = {}
"""The input image and mask each request had when ``finish`` ended it (the hash drops them then)."""


async def finish(api: Api, request_id: str, outcome: str = "succeeded", error: tuple[str, str] = ("", "")) -> None:
    """What a worker does: claim the request, then ``FINISH`` it with one image per image of its size, encoded
    in its ``output_format`` (at its ``output_compression``)."""
    spec = await spec_of(api, request_id)
    INPUTS_SEEN[request_id] = await api.binary.hmget(api.keys.request(request_id), ["input_image", "input_mask"])
    count = spec.n if outcome == "succeeded" else 0
    fmt, quality = spec.output_format, spec.output_compression
    images = [encoded(spec.width, spec.height, i, fmt, quality) for i in range(count)]
    await api.finish(request_id, outcome, images, error)


async def call_while(
    api: Api, send: Callable[[], Awaitable[T]], act: Callable[[str], Awaitable[object]]
) -> tuple[T, str]:
    """``send()`` while ``act(request_id)`` does something to the request it queues: its answer, and that id."""
    result: list[T] = []

    async def call() -> None:
        result.append(await send())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(call)
        (request_id,) = await wait_queued(api)
        await act(request_id)
    return result[0], request_id


async def call_while_finishing(
    api: Api,
    send: Callable[[], Awaitable[T]],
    outcome: str = "succeeded",
    error: tuple[str, str] = ("", ""),
) -> T:
    """``send()`` while a fake worker ends the request it queues."""
    response, _ = await call_while(api, send, lambda request_id: finish(api, request_id, outcome, error))
    return response


async def generate(api: Api, **body: Any) -> httpx.Response:
    """A generation that a fake worker completes."""
    return await call_while_finishing(api, lambda: api.http.post(GENERATIONS, json={"prompt": "a cat", **body}))


def openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The ``error`` object of an OpenAI error answer (strict JSON, every field present)."""
    assert response.status_code == status, response.text
    body = json.loads(response.content, parse_constant=lambda token: pytest.fail(f"{token} in {response.text}"))
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


# --- generations: answers ----------------------------------------------------------------------------------------


async def test_b64_json_answer_is_one_png_per_image_of_the_size(api: Api) -> None:
    response = await generate(api, n=2, size="64x32", seed=5)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"created", "data", "output_format"}
    assert isinstance(body["created"], int) and body["output_format"] == "png"
    assert [set(item) for item in body["data"]] == [{"b64_json"}, {"b64_json"}]
    images = [base64.b64decode(item["b64_json"]) for item in body["data"]]
    assert [png_size(image) for image in images] == [(64, 32), (64, 32)]
    assert images[0] != images[1]

    request_id = response.headers["x-request-id"]
    view = (await api.http.get(f"/v1/requests/{request_id}")).json()
    assert view["status"] == "succeeded"
    assert (view["params"]["width"], view["params"]["height"], view["params"]["n"], view["seed"]) == (64, 32, 2, 5)
    assert images[1] == (await api.http.get(f"/v1/requests/{request_id}/images/1")).content


async def test_url_answer_points_at_the_native_images(api: Api) -> None:
    response = await generate(api, n=2, response_format="url")
    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]
    urls = [item["url"] for item in response.json()["data"]]
    assert urls == [f"http://api/v1/requests/{request_id}/images/{i}" for i in range(2)]
    for url in urls:
        image = await api.http.get(url)
        assert image.status_code == 200
        assert png_size(image.content) == (64, 64)


async def test_defaults_and_the_served_model(api: Api) -> None:
    response = await generate(api, model="demo", size="auto", response_format=None, n=None, user="u-1")
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 1
    spec = await spec_of(api, response.headers["x-request-id"])
    assert (spec.model, spec.width, spec.height, spec.n, spec.num_inference_steps) == ("demo", 64, 64, 1, 4)


async def test_extensions_reach_the_request(api: Api) -> None:
    response = await generate(
        api,
        negative_prompt="blurry",
        num_inference_steps=7,
        guidance_scale=3.5,
        seed=42,
        lora={"name": "style", "scale": 0.5},
    )
    assert response.status_code == 200, response.text
    spec = await spec_of(api, response.headers["x-request-id"])
    assert (spec.negative_prompt, spec.num_inference_steps, spec.guidance_scale, spec.seed) == ("blurry", 7, 3.5, 42)
    assert spec.lora is not None and (spec.lora.name, spec.lora.scale) == ("style", 0.5)


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("quality", "standard"),
        ("quality", "auto"),
        ("style", "vivid"),
        ("background", "opaque"),
        ("moderation", "auto"),
        ("stream", False),
        ("partial_images", 0),
        ("safety_identifier", "someone"),
    ],
)
async def test_harmless_values_of_unimplemented_params_are_accepted(api: Api, param: str, value: Any) -> None:
    response = await generate(api, **{param: value})
    assert response.status_code == 200, response.text


# --- generations: output formats ------------------------------------------------------------------------------


async def test_jpeg_answer_carries_jpeg_bytes(api: Api) -> None:
    response = await generate(api, n=2, size="64x32", output_format="jpeg")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["output_format"] == "jpeg"
    images = [base64.b64decode(item["b64_json"]) for item in body["data"]]
    assert [image_info(image) for image in images] == [("JPEG", (64, 32))] * 2
    request_id = response.headers["x-request-id"]
    spec = await spec_of(api, request_id)
    assert (spec.output_format, spec.output_compression) == (OutputFormat.JPEG, None)
    native = await api.http.get(f"/v1/requests/{request_id}/images/0")
    assert native.headers["content-type"] == "image/jpeg" and native.content == images[0]


async def test_webp_with_compression(api: Api) -> None:
    response = await generate(api, output_format="webp", output_compression=40)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["output_format"] == "webp"
    assert image_info(base64.b64decode(body["data"][0]["b64_json"])) == ("WEBP", (64, 64))
    spec = await spec_of(api, response.headers["x-request-id"])
    assert (spec.output_format, spec.output_compression) == (OutputFormat.WEBP, 40)


async def test_url_answer_reports_the_format_of_its_images(api: Api) -> None:
    response = await generate(api, output_format="webp", response_format="url")
    assert response.status_code == 200, response.text
    assert response.json()["output_format"] == "webp"
    image = await api.http.get(response.json()["data"][0]["url"])
    assert image.headers["content-type"] == "image/webp" and image_info(image.content)[0] == "WEBP"


@pytest.mark.parametrize("body", [{"output_compression": 100}, {"output_format": "png", "output_compression": 100.0}])
async def test_png_with_compression_100_is_accepted_and_dropped(api: Api, body: dict[str, Any]) -> None:
    response = await generate(api, **body)
    assert response.status_code == 200, response.text
    assert response.json()["output_format"] == "png"
    assert png_size(base64.b64decode(response.json()["data"][0]["b64_json"])) == (64, 64)
    spec = await spec_of(api, response.headers["x-request-id"])
    assert (spec.output_format, spec.output_compression) == (OutputFormat.PNG, None)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"output_format": "png", "output_compression": 50}, "output_compression", "invalid_value"),
        ({"output_compression": 0}, "output_compression", "invalid_value"),  # png is the default
        ({"output_format": "jpeg", "output_compression": 101}, "output_compression", "invalid_value"),
        ({"output_format": "webp", "output_compression": -1}, "output_compression", "invalid_value"),
        ({"output_format": "jpeg", "output_compression": "high"}, "output_compression", "invalid_type"),
        ({"output_format": "gif"}, "output_format", "invalid_value"),
        ({"output_format": "JPEG"}, "output_format", "invalid_value"),
    ],
)
async def test_bad_output_format_or_compression_is_400_naming_it(
    api: Api, body: dict[str, Any], param: str, code: str
) -> None:
    error = await refused(api, prompt="a cat", **body)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code), error


async def test_png_compression_message_says_what_is_accepted(api: Api) -> None:
    error = await refused(api, prompt="a cat", output_format="png", output_compression=50)
    assert "50" in error["message"] and "100" in error["message"] and "jpeg" in error["message"]


async def test_the_openai_client_gets_jpeg(api: Api) -> None:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(api)))  # openai takes an httpx client too
    async with openai.AsyncOpenAI(
        base_url="http://api/v1",
        api_key="unused",
        max_retries=0,
        http_client=http,  # type: ignore[arg-type]
    ) as client:
        send = lambda: client.images.with_raw_response.generate(  # noqa: E731
            prompt="a cat", output_format="jpeg", output_compression=70, size="64x32"
        )
        raw = await call_while_finishing(api, send)
    result = raw.parse()
    assert result.output_format == "jpeg"
    [image] = result.data or []
    assert image_info(base64.b64decode(image.b64_json or "")) == ("JPEG", (64, 32))
    spec = await spec_of(api, raw.headers["x-request-id"])
    assert (spec.output_format, spec.output_compression) == (OutputFormat.JPEG, 70)


# --- generations: errors -----------------------------------------------------------------------------------------


async def refused(api: Api, status: int = 400, **body: Any) -> dict[str, Any]:
    """The error of a generation that is refused before anything is queued."""
    response = await api.http.post(GENERATIONS, json=body)
    error = openai_error(response, status)
    assert "x-request-id" not in response.headers
    assert await api.redis.xlen(api.keys.requests) == 0
    return error


@pytest.mark.parametrize("size", ["100x", "63x64", "0x64", "99999x64", "64", "64x64x64", "x64", "wide", "-8x64"])
async def test_bad_size_is_400_naming_size(api: Api, size: str) -> None:
    error = await refused(api, prompt="a cat", size=size)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "size", "invalid_value")
    assert repr(size) in error["message"] and "512" in error["message"]  # the value, and this server's limit


async def test_size_of_the_wrong_type_is_400(api: Api) -> None:
    error = await refused(api, prompt="a cat", size=64)
    assert (error["param"], error["code"]) == ("size", "invalid_type")


async def test_unknown_model_is_404(api: Api) -> None:
    error = await refused(api, 404, prompt="a cat", model="dall-e-3")
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "model", "model_not_found")
    assert "dall-e-3" in error["message"]


@pytest.mark.parametrize(("n", "code"), [(0, "invalid_value"), (5, "invalid_value"), (1.5, "invalid_type")])
async def test_bad_n_is_400(api: Api, n: Any, code: str) -> None:
    error = await refused(api, prompt="a cat", n=n)
    assert (error["param"], error["code"]) == ("n", code)


async def test_n_over_the_limit_names_the_setting(api: Api) -> None:
    error = await refused(api, prompt="a cat", n=5)
    assert "max_images_per_request" in error["message"]


async def test_unknown_field_is_400_naming_it(api: Api) -> None:
    error = await refused(api, prompt="a cat", steps=10)
    assert (error["param"], error["code"]) == ("steps", "unknown_parameter")
    assert error["message"] == "Unknown parameter: 'steps'."


async def test_missing_and_list_prompt(api: Api) -> None:
    error = await refused(api, n=1)
    assert (error["param"], error["code"]) == ("prompt", "missing_required_parameter")
    error = await refused(api, prompt=["a cat", "a dog"])
    assert (error["param"], error["code"]) == ("prompt", "invalid_type")
    error = await refused(api, prompt="")
    assert (error["param"], error["code"]) == ("prompt", "invalid_value")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"prompt": "a cat", "guidance_scale": NaN}', "guidance_scale"),
        (b'{"prompt": "a cat", "guidance_scale": Infinity}', "guidance_scale"),
        (b'{"prompt": "a cat", "n": NaN}', "n"),
        (b'{"prompt": "a cat", "extra\\ud800": NaN}', None),  # the key itself is refused (not UTF-8)
    ],
)
async def test_non_finite_numbers_are_400(api: Api, body: bytes, param: str | None) -> None:
    error = openai_error(await api.http.post(GENERATIONS, content=body, headers=JSON), 400)
    assert error["param"] == param
    assert await api.redis.xlen(api.keys.requests) == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"num_inference_steps": 51}, "num_inference_steps"),
        ({"seed": -1}, "seed"),
        ({"lora": {"name": "nope"}}, "lora.name"),
        ({"lora": {"name": "style", "scale": 11}}, "lora.scale"),
        ({"negative_prompt": "x" * 101}, "negative_prompt"),
        ({"user": 7}, "user"),
        ({"response_format": "png"}, "response_format"),
    ],
)
async def test_bad_extension_is_400_naming_it(api: Api, body: dict[str, Any], param: str) -> None:
    error = await refused(api, prompt="a cat", **body)
    assert error["param"] == param


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("quality", "hd"),
        ("style", "natural"),
        ("background", "transparent"),
        ("stream", True),
        ("partial_images", 2),
    ],
)
async def test_other_values_of_unimplemented_params_are_refused(api: Api, param: str, value: Any) -> None:
    error = await refused(api, prompt="a cat", **{param: value})
    assert (error["param"], error["code"]) == (param, "unsupported_value")
    assert repr(value) in error["message"]


async def test_undecodable_body_is_400(api: Api) -> None:
    error = openai_error(await api.http.post(GENERATIONS, content=b'{"prompt": ', headers=JSON), 400)
    assert error["code"] == "invalid_json"
    error = openai_error(await api.http.post(GENERATIONS, json=[{"prompt": "a cat"}]), 400)
    assert error["param"] is None


async def test_body_over_the_limit_is_413_in_openai_shape(tmp_path: Path) -> None:
    async for api in api_harness(unit_settings(tmp_path, max_body_bytes=1024)):
        big = {"prompt": "x" * 2000}
        error = openai_error(await api.http.post(GENERATIONS, json=big), 413)
        assert error["code"] == "request_too_large" and "max_body_bytes (1024 bytes)" in error["message"]
        native = await api.http.post("/v1/requests", json=big)
        assert native.status_code == 413 and set(native.json()) == {"detail"}


async def test_queue_full_is_503_with_retry_after(api: Api) -> None:
    for _ in range(5):
        assert (await api.http.post("/v1/requests", json={"prompt": "a cat"})).status_code == 202
    response = await api.http.post(GENERATIONS, json={"prompt": "a cat"})
    error = openai_error(response, 503)
    assert (error["type"], error["code"]) == ("server_error", "server_overloaded")
    assert int(response.headers["Retry-After"]) > 0


async def test_redis_down_is_503_with_retry_after(api: Api) -> None:
    api.server.connected = False
    response = await api.http.post(GENERATIONS, json={"prompt": "a cat"})
    error = openai_error(response, 503)
    assert (error["type"], error["code"]) == ("server_error", "service_unavailable")
    assert int(response.headers["Retry-After"]) > 0


async def test_native_routes_keep_their_error_format(api: Api) -> None:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", "size": "64x64"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "size"]


# --- generations: outcomes ---------------------------------------------------------------------------------------


async def test_failed_request_is_500_generation_failed(api: Api) -> None:
    send = lambda: api.http.post(GENERATIONS, json={"prompt": "a cat"})  # noqa: E731
    response = await call_while_finishing(api, send, "failed", ("RuntimeError", "boom"))
    error = openai_error(response, 500)
    assert (error["type"], error["code"]) == ("server_error", "generation_failed")
    assert "RuntimeError: boom" in error["message"]
    assert response.headers["x-should-retry"] == "false"
    request_id = response.headers["x-request-id"]
    assert (await api.http.get(f"/v1/requests/{request_id}")).json()["status"] == "failed"


async def test_request_failed_by_its_input_is_400(api: Api) -> None:
    send = lambda: api.http.post(GENERATIONS, json={"prompt": "a cat"})  # noqa: E731
    response = await call_while_finishing(api, send, "failed", ("InvalidInput", "image is not an image"))
    error = openai_error(response, 400)
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_input")
    assert response.headers["x-should-retry"] == "false"


async def test_request_aborted_elsewhere_is_409(api: Api) -> None:
    async def abort(request_id: str) -> None:
        assert (await api.http.post(f"/v1/requests/{request_id}/abort")).json()["status"] == "aborted"

    response, request_id = await call_while(api, lambda: api.http.post(GENERATIONS, json={"prompt": "a cat"}), abort)
    error = openai_error(response, 409)
    assert error["code"] == "request_aborted"
    assert response.headers["x-request-id"] == request_id


async def test_each_call_is_its_own_request(api: Api) -> None:
    results: list[httpx.Response] = []

    async def call(i: int) -> None:
        results.append(await api.http.post(GENERATIONS, json={"prompt": f"cat {i}"}))

    async with anyio.create_task_group() as tasks:
        for i in range(3):
            tasks.start_soon(call, i)
        ids = await wait_queued(api, 3)
        for request_id in ids:
            await finish(api, request_id)
    assert sorted(response.headers["x-request-id"] for response in results) == sorted(ids)
    assert all(response.status_code == 200 for response in results)


async def test_wait_limit_aborts_the_request_and_answers_504(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generation, "wait_limit_s", lambda settings: 0.3)
    response = await api.http.post(GENERATIONS, json={"prompt": "a cat"})
    error = openai_error(response, 504)
    assert error["code"] == "timeout"
    request_id = response.headers["x-request-id"]
    assert (await api.http.get(f"/v1/requests/{request_id}")).json()["status"] == "aborted"


async def test_a_lost_wake_up_costs_only_the_recheck(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generation, "RECHECK_S", 0.05)

    async def end_unannounced(request_id: str) -> None:
        # ended without the PUBLISH of FINISH: only a read of the state can see it
        await api.redis.hset(api.keys.request(request_id), mapping={"status": "failed", "error_type": "E"})

    response, _ = await call_while(api, lambda: api.http.post(GENERATIONS, json={"prompt": "a cat"}), end_unannounced)
    assert openai_error(response, 500)["code"] == "generation_failed"


def _app(api: Api) -> ASGIApp:
    transport = api.http._transport
    assert isinstance(transport, httpx.ASGITransport)
    return transport.app


async def test_client_disconnect_aborts_the_request(api: Api) -> None:
    body = json.dumps({"prompt": "a cat"}).encode()
    messages: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    gone = anyio.Event()
    sent: list[Message] = []

    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": GENERATIONS,
        "raw_path": GENERATIONS.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"api"), (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        "client": ("127.0.0.1", 50000),
        "server": ("api", 80),
    }

    async def serve() -> None:
        await _app(api)(scope, receive, send)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(serve)
            (request_id,) = await wait_queued(api)
            gone.set()
    assert (await api.http.get(f"/v1/requests/{request_id}")).json()["status"] == "aborted"
    assert sent[0]["status"] == 499


async def test_cancelled_call_aborts_the_request(api: Api) -> None:
    async def call() -> None:
        await api.http.post(GENERATIONS, json={"prompt": "a cat"})

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(call)
        (request_id,) = await wait_queued(api)
        tasks.cancel_scope.cancel()
    with anyio.fail_after(5):
        while (await api.http.get(f"/v1/requests/{request_id}")).json()["status"] != "aborted":
            await anyio.sleep(0.01)


# --- models ------------------------------------------------------------------------------------------------------


async def test_models_lists_the_served_model(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("api.store.CAPABILITIES_TTL_S", 0.0)  # each call reads what the workers announce
    assert (await api.http.get("/v1/models")).json() == {"object": "list", "data": []}  # no live worker yet
    idle = (await api.http.get("/v1/models/demo")).json()  # one of the fleet's models: known, served by none
    assert (idle["id"], idle["family"], idle["tasks"], idle["workers"], idle["resident"]) == (
        "demo",
        None,
        [],
        0,
        False,
    )
    await announce(api, "w1", FAMILIES["stable-diffusion"].traits, "StableDiffusionPipeline")
    response = await api.http.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    [model] = body["data"]
    assert set(model) == {"id", "object", "created", "owned_by", "family", "tasks", "workers", "resident"}
    assert (model["id"], model["object"], model["owned_by"]) == ("demo", "model", "fusefleet")
    assert (model["family"], model["tasks"], model["workers"], model["resident"]) == (
        "stable-diffusion",
        ["text-to-image"],
        1,
        True,
    )
    assert (await api.http.get("/v1/models/demo")).json() == model
    error = openai_error(await api.http.get("/v1/models/gpt-image-1"), 404)
    assert (error["param"], error["code"]) == ("model", "model_not_found")


async def test_model_id_is_the_fleets_model(settings: Settings) -> None:
    async for api in api_harness(settings.model_copy(update={"model": "org/sd-tiny"})):
        assert (await api.http.get("/v1/models/org/sd-tiny")).json()["id"] == "org/sd-tiny"
        openai_error(await api.http.post(GENERATIONS, json={"prompt": "a cat", "model": "demo"}), 404)
        response = await generate(api, model="org/sd-tiny")
        assert response.status_code == 200, response.text


def test_openai_routes_stay_out_of_the_native_openapi_document(settings: Settings) -> None:
    paths = create_app(settings).openapi()["paths"]
    assert not [path for path in paths if path.startswith(("/v1/images", "/v1/models"))]


# --- edits -------------------------------------------------------------------------------------------------------


def edit_files(image: bytes | None = None, mask: bytes | None = None) -> list[tuple[str, tuple[str, bytes, str]]]:
    files = [("image", ("in.png", image if image is not None else png(64, 64, 200), "image/png"))]
    if mask is not None:
        files.append(("mask", ("mask.png", mask, "image/png")))
    return files


async def edit(api: Api, files: Any, **data: Any) -> httpx.Response:
    form = {"prompt": "a cat", **{key: str(value) for key, value in data.items()}}
    return await call_while_finishing(api, lambda: api.http.post(EDITS, data=form, files=files))


async def test_edit_is_an_image_to_image_request(api: Api) -> None:
    response = await edit(api, edit_files(png(96, 96, 200)), size="64x32", strength=0.5, n=2, seed=3)
    assert response.status_code == 200, response.text
    images = [base64.b64decode(item["b64_json"]) for item in response.json()["data"]]
    assert [png_size(image) for image in images] == [(64, 32), (64, 32)]
    request_id = response.headers["x-request-id"]
    view = (await api.http.get(f"/v1/requests/{request_id}")).json()
    assert (view["params"]["task"], view["params"]["strength"], view["seed"]) == ("image-to-image", 0.5, 3)
    stored, _ = INPUTS_SEEN.pop(request_id)
    assert isinstance(stored, bytes) and png_size(stored) == (64, 32)  # resized to the requested size by the core
    assert not await api.binary.hexists(api.keys.request(request_id), "input_image")  # dropped once it finished


async def test_edit_with_a_mask_is_inpainting(api: Api) -> None:
    files = edit_files(mask=png(64, 64, 255))
    response = await edit(api, files, response_format="url", **{"lora[name]": "style", "lora[scale]": 0.5})
    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]
    assert response.json()["data"] == [{"url": f"http://api/v1/requests/{request_id}/images/0"}]
    spec = await spec_of(api, request_id)
    assert spec.task == "inpaint"
    assert spec.lora is not None and (spec.lora.name, spec.lora.scale) == ("style", 0.5)
    assert INPUTS_SEEN.pop(request_id)[1] is not None


@pytest.mark.parametrize(
    ("files", "data", "param", "code"),
    [
        ([], {}, "image", "missing_required_parameter"),
        (edit_files() + [("image[]", ("b.png", png(8, 8), "image/png"))], {}, "image", "invalid_value"),
        (edit_files(b"not an image"), {}, "image", "invalid_value"),
        (edit_files(mask=b"not an image"), {}, "mask", "invalid_value"),
        (edit_files(), {"strength": "0"}, "strength", "invalid_value"),
        (edit_files(), {"strength": "nan"}, "strength", "invalid_value"),
        (edit_files(), {"size": "63x64"}, "size", "invalid_value"),
        (edit_files(), {"n": "two"}, "n", "invalid_type"),
        (edit_files(), {"guidance_scale": "nan"}, "guidance_scale", "invalid_value"),
        (edit_files(), {"steps": "4"}, "steps", "unknown_parameter"),
        (edit_files(), {"input_fidelity": "high"}, "input_fidelity", "unsupported_value"),
        (edit_files(), {"output_compression": "50"}, "output_compression", "invalid_value"),
        (edit_files(), {"output_format": "jpeg", "output_compression": "x"}, "output_compression", "invalid_type"),
        (edit_files(), {"output_format": "bmp"}, "output_format", "invalid_value"),
        (edit_files(), {"lora[name]": "nope"}, "lora.name", "invalid_value"),
    ],
)
async def test_bad_edit_is_400_naming_the_param(
    api: Api, files: list[Any], data: dict[str, str], param: str, code: str
) -> None:
    response = await api.http.post(EDITS, data={"prompt": "a cat", **data}, files=files or None)
    error = openai_error(response, 400)
    assert (error["param"], error["code"]) == (param, code), error
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_edit_with_output_format(api: Api) -> None:
    response = await edit(api, edit_files(), output_format="webp", output_compression=30)
    assert response.status_code == 200, response.text
    assert response.json()["output_format"] == "webp"
    assert image_info(base64.b64decode(response.json()["data"][0]["b64_json"])) == ("WEBP", (64, 64))
    spec = await spec_of(api, response.headers["x-request-id"])
    assert (spec.task, spec.output_format, spec.output_compression) == ("image-to-image", OutputFormat.WEBP, 30)
    INPUTS_SEEN.pop(response.headers["x-request-id"])


async def test_edit_png_with_compression_100_is_accepted(api: Api) -> None:
    response = await edit(api, edit_files(), output_format="png", output_compression=100)
    assert response.status_code == 200, response.text
    spec = await spec_of(api, response.headers["x-request-id"])
    assert (spec.output_format, spec.output_compression) == (OutputFormat.PNG, None)
    INPUTS_SEEN.pop(response.headers["x-request-id"])


async def test_edit_of_an_unknown_model_is_404(api: Api) -> None:
    response = await api.http.post(EDITS, data={"prompt": "a cat", "model": "dall-e-2"}, files=edit_files())
    assert openai_error(response, 404)["code"] == "model_not_found"
