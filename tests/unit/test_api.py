"""The HTTP API against fakeredis (with Lua): submission, validation, state, output formats, images, abort,
delete, backpressure."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any, cast

import httpx
import pytest
from PIL import Image

from api.app import create_app
from shared.contracts import OutputFormat, RequestSpec
from shared.settings import Settings
from tests.support.api import Api, api_harness

pytestmark = pytest.mark.anyio

PNG = b"\x89PNG\r\n\x1a\nfake"


def encoded(fmt: str, width: int = 8, height: int = 8) -> bytes:
    """A real image in PIL's format ``fmt`` (``PNG``, ``JPEG``, ``WEBP``)."""
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (20, 120, 220)).save(buffer, format=fmt)
    return buffer.getvalue()


async def _submit(api: Api, **body: Any) -> str:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", **body})
    assert response.status_code == 202, response.text
    request_id: str = response.json()["id"]
    return request_id


async def _stream(api: Api) -> list[dict[str, str]]:
    entries = cast(list[tuple[str, dict[str, str]]], await api.redis.xrange(api.keys.requests))
    return [fields for _, fields in entries]


def _error_locs(response: httpx.Response) -> list[list[str | int]]:
    assert response.status_code == 422, response.text
    return [error["loc"] for error in response.json()["detail"]]


async def test_submit_stores_spec_and_stream_entry(api: Api) -> None:
    response = await api.http.post(
        "/v1/requests",
        json={
            "prompt": "a cat",
            "negative_prompt": "blurry",
            "seed": 7,
            "lora": {"name": "style", "scale": 0.5},
        },
    )
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "queued"
    request_id = body["id"]
    assert len(request_id) == 32

    raw = await api.redis.hgetall(api.keys.request(request_id))
    assert raw["status"] == "queued"
    spec = RequestSpec.model_validate_json(raw["spec"])
    assert (spec.id, spec.model, spec.prompt, spec.negative_prompt, spec.seed) == (
        request_id,
        "demo",
        "a cat",
        "blurry",
        7,
    )
    assert (spec.width, spec.height, spec.num_inference_steps) == (64, 64, 4)
    assert (spec.n, spec.num_frames) == (1, None)
    assert spec.guidance_scale == 5.0 and spec.guidance_rescale == 0.0
    assert spec.lora is not None and (spec.lora.name, spec.lora.scale) == ("style", 0.5)
    assert float(raw["created_at"]) == spec.created_at

    entries = await _stream(api)
    assert len(entries) == 1
    fields = entries[0]
    assert fields["id"] == request_id
    assert RequestSpec.model_validate_json(fields["spec"]) == spec


async def test_seed_picked_when_absent_and_reported(api: Api) -> None:
    request_id = await _submit(api)
    response = await api.http.get(f"/v1/requests/{request_id}")
    assert response.status_code == 200
    view = response.json()
    assert isinstance(view["seed"], int) and 0 <= view["seed"] < 2**63
    assert view["params"]["seed"] == view["seed"]
    raw = await api.redis.hgetall(api.keys.request(request_id))
    assert RequestSpec.model_validate_json(raw["spec"]).seed == view["seed"]


async def test_get_reports_state(api: Api) -> None:
    request_id = await _submit(api, prompt="a dog", n=2, seed=3)
    view = (await api.http.get(f"/v1/requests/{request_id}")).json()
    assert view["id"] == request_id
    assert view["status"] == "queued"
    assert view["progress"] == {"step": 0, "total": 4}
    assert view["error"] is None
    assert view["images"] == []
    assert view["batch_id"] is None and view["worker"] is None
    assert view["created_at"].endswith("Z") or view["created_at"].endswith("+00:00")
    assert view["started_at"] is None and view["finished_at"] is None
    assert view["params"]["prompt"] == "a dog" and view["params"]["n"] == 2

    await api.redis.hset(
        api.keys.request(request_id),
        mapping={
            "status": "failed",
            "error_type": "RuntimeError",
            "error_message": "boom",
            "worker": "w1",
            "batch_id": "b1",
            "batch_size": 3,
            "step": 2,
            "total": 4,
            "started_at": 1700000000.0,
            "finished_at": 1700000001.5,
        },
    )
    view = (await api.http.get(f"/v1/requests/{request_id}")).json()
    assert view["status"] == "failed"
    assert view["error"] == {"type": "RuntimeError", "message": "boom"}
    assert (view["worker"], view["batch_id"], view["batch_size"]) == ("w1", "b1", 3)
    assert view["progress"] == {"step": 2, "total": 4}
    assert view["started_at"].startswith("2023-11-14T22:13:20")
    assert view["images"] == []


async def test_list_prompt_says_submit_each_prompt_alone(api: Api) -> None:
    response = await api.http.post("/v1/requests", json={"prompt": ["a cat", "a dog"]})
    assert _error_locs(response) == [["body", "prompt"]]
    assert "own request" in response.json()["detail"][0]["msg"]


async def test_list_body_points_to_batch_endpoint(api: Api) -> None:
    response = await api.http.post("/v1/requests", json=[{"prompt": "a cat"}])
    assert response.status_code == 422
    assert "/v1/requests/batch" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"width": 100}, ["body", "width"]),
        ({"height": 0}, ["body", "height"]),
        ({"width": 1024}, ["body", "width"]),  # > max_image_side (settings)
        ({"height": "64"}, ["body", "height"]),
        ({"n": 5}, ["body", "n"]),  # > max_images_per_request (settings)
        ({"n": 0}, ["body", "n"]),
        ({"num_inference_steps": 0}, ["body", "num_inference_steps"]),
        ({"num_inference_steps": 51}, ["body", "num_inference_steps"]),  # > max_inference_steps (settings)
        ({"guidance_scale": 51}, ["body", "guidance_scale"]),
        ({"guidance_scale": -1}, ["body", "guidance_scale"]),
        ({"guidance_rescale": 1.5}, ["body", "guidance_rescale"]),
        ({"seed": -1}, ["body", "seed"]),
        ({"seed": 2**63}, ["body", "seed"]),
        ({"prompt": ""}, ["body", "prompt"]),
        ({"prompt": "x" * 101}, ["body", "prompt"]),  # > max_prompt_chars (settings)
        ({"negative_prompt": "x" * 101}, ["body", "negative_prompt"]),
        ({"steps": 10}, ["body", "steps"]),
        ({"lora": {"name": "nope"}}, ["body", "lora", "name"]),
        ({"lora": {"name": "../loras"}}, ["body", "lora", "name"]),
        ({"lora": {"name": "style", "scale": 11}}, ["body", "lora", "scale"]),
        ({"output_format": "gif"}, ["body", "output_format"]),
        ({"output_format": "JPEG"}, ["body", "output_format"]),
        ({"output_format": "jpeg", "output_compression": 101}, ["body", "output_compression"]),
        ({"output_format": "webp", "output_compression": -1}, ["body", "output_compression"]),
        ({"output_format": "jpeg", "output_compression": 50.5}, ["body", "output_compression"]),
        ({"output_format": "jpeg", "output_compression": "80"}, ["body", "output_compression"]),
    ],
)
async def test_bad_field_is_422_naming_it(api: Api, body: dict[str, Any], loc: list[str]) -> None:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", **body})
    assert _error_locs(response) == [loc]
    assert response.json()["detail"][0]["msg"]
    assert await api.redis.xlen(api.keys.requests) == 0


@pytest.mark.parametrize(("fmt", "compression"), [("jpeg", 75), ("webp", 0), ("webp", None), ("png", None)])
async def test_output_format_is_stored_and_echoed(api: Api, fmt: str, compression: int | None) -> None:
    body: dict[str, Any] = {"output_format": fmt}
    if compression is not None:
        body["output_compression"] = compression
    request_id = await _submit(api, **body)
    raw = await api.redis.hget(api.keys.request(request_id), "spec")
    spec = RequestSpec.model_validate_json(str(raw))
    assert (spec.output_format, spec.output_compression) == (OutputFormat(fmt), compression)
    params = (await api.http.get(f"/v1/requests/{request_id}")).json()["params"]
    assert (params["output_format"], params["output_compression"]) == (fmt, compression)


async def test_output_format_defaults_to_png(api: Api) -> None:
    request_id = await _submit(api)
    params = (await api.http.get(f"/v1/requests/{request_id}")).json()["params"]
    assert (params["output_format"], params["output_compression"]) == ("png", None)


@pytest.mark.parametrize("body", [{"output_format": "png", "output_compression": 80}, {"output_compression": 100}])
async def test_output_compression_with_png_is_422_naming_it(api: Api, body: dict[str, Any]) -> None:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", **body})
    assert _error_locs(response) == [["body", "output_compression"]]
    msg = response.json()["detail"][0]["msg"]
    assert "output_compression" in msg and "jpeg" in msg and "webp" in msg
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_missing_prompt_is_422(api: Api) -> None:
    assert _error_locs(await api.http.post("/v1/requests", json={})) == [["body", "prompt"]]


async def test_settings_bound_message_names_the_limit(api: Api) -> None:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", "width": 1024})
    error = response.json()["detail"][0]
    assert error["type"] == "less_than_equal"
    assert "512" in error["msg"] and "max_image_side" in error["msg"]


async def test_lora_needs_a_lora_dir(settings: Settings) -> None:
    async for api in api_harness(settings.model_copy(update={"lora_dir": None})):
        response = await api.http.post("/v1/requests", json={"prompt": "a cat", "lora": {"name": "style"}})
        assert _error_locs(response) == [["body", "lora", "name"]]


async def test_model_name_from_settings(settings: Settings) -> None:
    async for api in api_harness(settings.model_copy(update={"model": "org/sd"})):
        request_id = await _submit(api)
        view = (await api.http.get(f"/v1/requests/{request_id}")).json()
        assert view["params"]["model"] == "org/sd"


async def test_batch_creates_independent_requests(api: Api) -> None:
    items = [{"prompt": "a cat"}, {"prompt": "a dog", "n": 2}, {"prompt": "a cow", "seed": 11}]
    response = await api.http.post("/v1/requests/batch", json={"requests": items})
    assert response.status_code == 202, response.text
    ids = response.json()["ids"]
    assert len(ids) == 3 and len(set(ids)) == 3

    views = [(await api.http.get(f"/v1/requests/{i}")).json() for i in ids]
    assert [v["params"]["prompt"] for v in views] == ["a cat", "a dog", "a cow"]
    assert [v["status"] for v in views] == ["queued"] * 3
    assert views[1]["params"]["n"] == 2
    assert views[2]["seed"] == 11
    assert len({v["seed"] for v in views}) == 3
    assert [fields["id"] for fields in await _stream(api)] == ids


async def test_batch_bad_item_names_its_index(api: Api) -> None:
    items = [{"prompt": "a cat"}, {"prompt": "a dog", "width": 1024}, {"prompt": ["x", "y"]}]
    response = await api.http.post("/v1/requests/batch", json={"requests": items})
    assert _error_locs(response) == [["body", "requests", 2, "prompt"]]

    items = [{"prompt": "a cat"}, {"prompt": "a dog", "width": 1024}, {"prompt": "a cow", "n": 9}]
    response = await api.http.post("/v1/requests/batch", json={"requests": items})
    assert _error_locs(response) == [["body", "requests", 1, "width"], ["body", "requests", 2, "n"]]
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_batch_size_bounds(api: Api) -> None:
    assert _error_locs(await api.http.post("/v1/requests/batch", json={"requests": []})) == [["body", "requests"]]
    many = {"requests": [{"prompt": "a"}] * 257}
    assert _error_locs(await api.http.post("/v1/requests/batch", json=many)) == [["body", "requests"]]


async def test_queue_full_is_503_all_or_nothing(api: Api) -> None:
    for _ in range(4):
        await _submit(api)
    response = await api.http.post("/v1/requests/batch", json={"requests": [{"prompt": "a"}] * 2})
    assert response.status_code == 503
    assert "Retry-After" in response.headers
    assert "queue is full" in response.json()["detail"]
    assert await api.redis.xlen(api.keys.requests) == 4

    await _submit(api)  # the fifth fits
    response = await api.http.post("/v1/requests", json={"prompt": "a cat"})
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) > 0
    assert await api.redis.xlen(api.keys.requests) == 5


async def test_aborting_queued_requests_frees_their_place_in_the_queue(api: Api) -> None:
    ids = [await _submit(api) for _ in range(5)]  # max_queue_len 5: full
    assert (await api.http.post("/v1/requests", json={"prompt": "a cat"})).status_code == 503
    for rid in ids[:3]:
        assert (await api.http.post(f"/v1/requests/{rid}/abort")).json()["status"] == "aborted"
    assert await api.redis.xlen(api.keys.requests) == 2
    response = await api.http.post("/v1/requests/batch", json={"requests": [{"prompt": "a"}] * 3})
    assert response.status_code == 202, response.text


async def test_a_submit_and_abort_loop_with_no_scheduler_names_at_most_max_queue_len_aborted_ids(api: Api) -> None:
    """Each abort deletes the request's stream entry (max_queue_len never stops the loop) and names it in
    ``P:scheduler:aborted`` for a scheduler to take: with none running, today's main grew the set by one id per abort
    (its TTL refreshed each time), for good. Past the cap the ids are left out (the scheduler's status check of its
    head window finds such requests) and the TTL is no longer refreshed."""
    ids = []
    for _ in range(4 * api.settings.max_queue_len):
        ids.append(await _submit(api))
        assert (await api.http.post(f"/v1/requests/{ids[-1]}/abort")).json()["status"] == "aborted"
    assert await api.redis.scard(api.keys.scheduler_aborted) == api.settings.max_queue_len
    assert await api.redis.smembers(api.keys.scheduler_aborted) == set(ids[: api.settings.max_queue_len])
    assert 0 < await api.redis.ttl(api.keys.scheduler_aborted) <= api.settings.result_ttl_s
    await api.redis.expire(api.keys.scheduler_aborted, 5)
    await api.http.post(f"/v1/requests/{await _submit(api)}/abort")
    assert await api.redis.ttl(api.keys.scheduler_aborted) <= 5  # full: not refreshed, it goes in time


async def test_get_unknown_is_404(api: Api) -> None:
    response = await api.http.get("/v1/requests/nope")
    assert response.status_code == 404
    assert "nope" in response.json()["detail"]


async def test_image_404_until_stored_then_png(api: Api) -> None:
    request_id = await _submit(api, n=2)
    assert (await api.http.get(f"/v1/requests/{request_id}/images/0")).status_code == 404

    assert await api.finish(request_id, images=[PNG, PNG + b"1"]) == "succeeded"

    view = (await api.http.get(f"/v1/requests/{request_id}")).json()
    assert view["status"] == "succeeded"
    assert view["images"] == [f"/v1/requests/{request_id}/images/0", f"/v1/requests/{request_id}/images/1"]
    for k, url in enumerate(view["images"]):
        response = await api.http.get(url)
        assert response.status_code == 200
        assert response.headers["content-type"] == "image/png"
        assert response.content == (PNG if k == 0 else PNG + b"1")
    assert (await api.http.get(f"/v1/requests/{request_id}/images/2")).status_code == 404
    assert (await api.http.get(f"/v1/requests/{request_id}/images/-1")).status_code == 422


@pytest.mark.parametrize(("fmt", "pil_format"), [("jpeg", "JPEG"), ("webp", "WEBP")])
async def test_image_is_served_in_the_requests_format(api: Api, fmt: str, pil_format: str) -> None:
    request_id = await _submit(api, output_format=fmt, output_compression=60)
    data = encoded(pil_format)
    assert await api.finish(request_id, images=[data]) == "succeeded"
    view = (await api.http.get(f"/v1/requests/{request_id}")).json()
    response = await api.http.get(view["images"][0])
    assert response.status_code == 200
    assert response.headers["content-type"] == f"image/{fmt}"
    assert response.content == data
    with Image.open(io.BytesIO(response.content)) as image:
        assert image.format == pil_format


async def test_abort_queued_is_idempotent(api: Api) -> None:
    request_id = await _submit(api)
    for _ in range(2):
        response = await api.http.post(f"/v1/requests/{request_id}/abort")
        assert response.status_code == 200
        assert response.json() == {"id": request_id, "status": "aborted"}
    view = (await api.http.get(f"/v1/requests/{request_id}")).json()
    assert view["status"] == "aborted"
    assert view["finished_at"] is not None
    assert await api.redis.ttl(api.keys.request(request_id)) > 0


async def test_abort_running_flags_it(api: Api) -> None:
    request_id = await _submit(api)
    # a run holds it (its claim token): the worker ends it; one with no claim is put aside and ends at once
    await api.redis.hset(api.keys.request(request_id), mapping={"status": "running", "claim": "t1"})
    response = await api.http.post(f"/v1/requests/{request_id}/abort")
    assert response.status_code == 200
    assert response.json() == {"id": request_id, "status": "running"}
    assert await api.redis.hget(api.keys.request(request_id), "abort") == "1"


@pytest.mark.parametrize("final", ["succeeded", "failed"])
async def test_abort_after_finish_is_409(api: Api, final: str) -> None:
    request_id = await _submit(api)
    await api.redis.hset(api.keys.request(request_id), "status", final)
    response = await api.http.post(f"/v1/requests/{request_id}/abort")
    assert response.status_code == 409
    assert final in response.json()["detail"]
    assert await api.redis.hget(api.keys.request(request_id), "status") == final


async def test_abort_unknown_is_404(api: Api) -> None:
    assert (await api.http.post("/v1/requests/nope/abort")).status_code == 404
    assert await api.redis.exists(api.keys.request("nope")) == 0


async def test_delete_unknown_is_404(api: Api) -> None:
    response = await api.http.delete("/v1/requests/nope")
    assert response.status_code == 404
    assert "nope" in response.json()["detail"]


@pytest.mark.parametrize("status", ["queued", "scheduled", "running"])
async def test_delete_unfinished_is_409_saying_abort_first(api: Api, status: str) -> None:
    request_id = await _submit(api)
    if status != "queued":
        await api.redis.hset(api.keys.request(request_id), "status", status)
    response = await api.http.delete(f"/v1/requests/{request_id}")
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert status in detail and "abort" in detail
    assert (await api.http.get(f"/v1/requests/{request_id}")).json()["status"] == status  # left alone


async def test_delete_succeeded_request_drops_its_state_and_images(api: Api) -> None:
    request_id = await _submit(api, n=2)
    assert await api.finish(request_id, images=[PNG, PNG + b"1"]) == "succeeded"
    keys = str(await api.redis.hget(api.keys.request(request_id), "results")).split()
    assert len(keys) == 2
    assert [api.results.get(key) for key in keys] == [PNG, PNG + b"1"]

    response = await api.http.delete(f"/v1/requests/{request_id}")
    assert response.status_code == 204
    assert response.content == b""
    assert (await api.http.get(f"/v1/requests/{request_id}")).status_code == 404
    assert (await api.http.get(f"/v1/requests/{request_id}/images/0")).status_code == 404
    assert [api.results.get(key) for key in keys] == [None, None]
    assert [await api.redis.zscore(api.keys.results_journal, key) for key in keys] == [None, None]
    assert await api.redis.exists(api.keys.request(request_id)) == 0
    assert (await api.http.delete(f"/v1/requests/{request_id}")).status_code == 404


@pytest.mark.parametrize("final", ["aborted", "failed"])
async def test_delete_aborted_or_failed_request(api: Api, final: str) -> None:
    request_id = await _submit(api)
    if final == "aborted":
        assert (await api.http.post(f"/v1/requests/{request_id}/abort")).json()["status"] == "aborted"
    else:
        assert await api.finish(request_id, "failed", error=("RuntimeError", "boom")) == "failed"
    assert (await api.http.delete(f"/v1/requests/{request_id}")).status_code == 204
    assert (await api.http.get(f"/v1/requests/{request_id}")).status_code == 404
    assert (await api.http.delete(f"/v1/requests/{request_id}")).status_code == 404


async def test_healthz(api: Api) -> None:
    response = await api.http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_healthz_503_when_redis_is_down(api: Api) -> None:
    api.server.connected = False
    response = await api.http.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable"}


async def test_redis_down_is_503_not_500(api: Api) -> None:
    api.server.connected = False
    response = await api.http.post("/v1/requests", json={"prompt": "a cat"})
    assert response.status_code == 503
    assert "Retry-After" in response.headers
    assert "unavailable" in response.json()["detail"]


def test_openapi_schema_builds(settings: Settings) -> None:
    schema = create_app(settings).openapi()
    assert "/v1/requests/{request_id}/abort" in schema["paths"]
    assert json.dumps(schema)


async def test_long_poll_answers_when_the_request_finishes(api: Api) -> None:
    import anyio

    from shared import keys as k

    rid = await _submit(api)
    quick = await api.http.get(f"/v1/requests/{rid}", params={"wait_s": 0.05})
    assert quick.json()["status"] == "queued"  # nothing happened: answered after the wait

    async def finish_soon() -> None:
        await anyio.sleep(0.2)
        await api.redis.hset(api.keys.request(rid), mapping={"status": "running", "claim": "c1"})
        finish = api.redis.register_script(k.FINISH)
        args: list[str | float] = [1.0, 60, api.keys.finished, "c1", rid, "failed", "E", "boom", "", 0]
        await finish(keys=k.finish_keys(api.keys, rid), args=args)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(finish_soon)
        started = anyio.current_time()
        answer = await api.http.get(f"/v1/requests/{rid}", params={"wait_s": 10})
        elapsed = anyio.current_time() - started
    assert answer.json()["status"] == "failed"
    assert 0.15 < elapsed < 5, elapsed  # woken by the finish, not by the 10 s bound
    assert (await api.http.get(f"/v1/requests/{rid}", params={"wait_s": 61})).status_code == 422


async def test_long_poll_of_a_request_accepted_here_skips_the_first_read_and_still_answers_its_ending(api: Api) -> None:
    """Accepted by this api while subscribed and its ending not published: it has not finished, so the long poll
    waits without reading first (one HMGET less a request). Here the hash turns terminal behind the api's back (no
    publish), which only the read after the wait can see."""
    for _ in range(200):  # the subscription is confirmed shortly after the app starts
        if api.app.state.waiter.epoch is not None:
            break
        await asyncio.sleep(0.01)
    rid = await _submit(api)
    assert api.app.state.waiter.unfinished_here(rid, None)
    await api.redis.hset(api.keys.request(rid), mapping={"status": "failed", "error_type": "E", "error_message": "x"})
    started = asyncio.get_running_loop().time()
    answer = await api.http.get(f"/v1/requests/{rid}", params={"wait_s": 0.3})
    assert answer.json()["status"] == "failed"
    assert asyncio.get_running_loop().time() - started >= 0.3  # it did not read before the wait
    other = await _submit(api)
    await api.redis.publish(api.keys.finished, other)  # its ending came: read first, as any request
    for _ in range(200):
        if not api.app.state.waiter.unfinished_here(other, None):
            break
        await asyncio.sleep(0.01)
    assert not api.app.state.waiter.unfinished_here(other, None)
