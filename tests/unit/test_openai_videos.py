"""The OpenAI Videos API against fakeredis: how ``size`` and ``seconds`` map onto the model's frame and size rules,
every refusal as an OpenAI 400 naming ``param``, the Video object through a job's life (queued, in progress with
its progress, completed, failed, aborted), ``/content``, the paged list (per API key, ids gone dropped) and DELETE
(abort, then delete), with the official ``openai`` client where it sends (a multipart form). A fake worker ends
jobs with the ``FINISH`` script, as test_openai_api.py does."""

from __future__ import annotations

import base64
import io
import time
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import openai
import pytest
from PIL import Image

from api.openai.video_schemas import VideoCreateRequest, frames_for, played_seconds, video_of
from api.outage import StoreUnavailable
from api.store import RequestStore
from gpu_worker.families import FAMILIES
from shared import keys as k
from shared.api_keys import ApiKey, key_table, token_hash
from shared.contracts import (
    ModelCapabilities,
    ModelTraits,
    RequestSpec,
    RequestState,
    RequestStatus,
    Task,
    WorkerCapabilities,
)
from shared.settings import Settings
from tests.support.api import Api, api_harness, unit_settings
from tests.unit.test_api_capabilities import announce
from tests.unit.test_openai_api import encoded, openai_error, spec_of

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]

LTX = FAMILIES["ltx-video"].traits
SD = FAMILIES["stable-diffusion"].traits
VIDEOS = "/v1/videos"
MP4 = b"\x00\x00\x00\x18ftypmp42fake-mp4"


# --- the mapping (pure) ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "fps", "multiple", "frames"),
    [
        ("1", 8, 8, 9),  # 8 frames wanted: 9 is the nearest 8k + 1
        ("2", 8, 8, 17),
        ("4", 25, 8, 97),  # 100 wanted: 97 (3 short) beats 105 (5 over)
        ("4.5", 8, 8, 33),  # 36 wanted: 33 and 41 tie on the rule's grid? 36-33=3, 41-36=5: 33
        ("0.25", 8, 8, 1),  # 2 wanted: 1 beats 9
        ("0.625", 8, 8, 9),  # 5 wanted: halfway between 1 and 9, the longer clip
        ("4", 24, 1, 96),  # no frame rule: seconds x fps exactly
        ("0.01", 24, 1, 1),  # at least one frame
    ],
)
def test_seconds_map_to_the_nearest_frame_count_the_model_takes(
    seconds: str, fps: int, multiple: int, frames: int
) -> None:
    assert frames_for(Decimal(seconds), fps, multiple) == frames
    assert frames % multiple == 1 % multiple


@pytest.mark.parametrize(("frames", "fps", "text"), [(9, 8, "1.125"), (97, 25, "3.88"), (96, 24, "4"), (1, 1, "1")])
def test_the_answer_states_the_played_duration(frames: int, fps: int, text: str) -> None:
    assert played_seconds(frames, fps) == text


def native(settings: Settings, traits: ModelTraits = LTX, **body: Any) -> dict[str, Any]:
    request = VideoCreateRequest.model_validate({"prompt": "a fox", **body}).native(settings, traits)
    return request.model_dump(exclude_unset=True)


def test_size_seconds_and_extensions_reach_the_native_request(settings: Settings) -> None:
    fields = native(
        settings, size="96x32", seconds="1", fps=8, seed=3, num_inference_steps=2, guidance_scale=3.0, priority=1
    )
    assert fields == {
        "prompt": "a fox",
        "width": 96,
        "height": 32,
        "num_frames": 9,
        "fps": 8,
        "seed": 3,
        "num_inference_steps": 2,
        "guidance_scale": 3.0,
        "priority": 1,
    }


def test_absent_size_and_seconds_are_the_native_and_model_defaults(settings: Settings) -> None:
    fields = native(settings, size="auto")
    assert (fields["width"], fields["height"]) == (64, 64)
    assert (fields["num_frames"], fields["fps"]) == (LTX.default_frames, LTX.default_fps)
    assert native(settings, seconds=4)["num_frames"] == 97  # a number too; 4 s at LTX's 25 fps


# --- the api on fakeredis ----------------------------------------------------------------------------------------


@pytest.fixture
async def video_api(api: Api) -> Api:
    await announce(api, "w1", LTX, "LTXPipeline")
    return api


@pytest.fixture
async def client(api: Api) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official client on the api (the test's fixtures announce its model)."""
    transport = api.http._transport
    assert isinstance(transport, httpx.ASGITransport)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=transport.app))
    async with openai.AsyncOpenAI(
        base_url="http://api/v1",
        api_key="unused",
        max_retries=0,
        http_client=http,  # type: ignore[arg-type]
    ) as one:
        yield one


async def create(api: Api, status: int = 200, headers: dict[str, str] | None = None, **body: Any) -> dict[str, Any]:
    response = await api.http.post(VIDEOS, json={"prompt": "a fox", "size": "32x32", **body}, headers=headers)
    assert response.status_code == status, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def refused(api: Api, status: int = 400, **body: Any) -> dict[str, Any]:
    before = await api.redis.xlen(api.keys.requests)
    response = await api.http.post(VIDEOS, json={"prompt": "a fox", **body})
    error = openai_error(response, status)
    assert await api.redis.xlen(api.keys.requests) == before  # nothing queued
    return error


async def finish_video(api: Api, request_id: str, frames: int) -> None:
    """What a worker does for a video request: its MP4, then its frames as images, then ``FINISH``."""
    spec = await spec_of(api, request_id)
    token = "c1"
    await api.redis.hset(api.keys.request(request_id), mapping={"status": "running", "claim": token})
    keys = [f"{request_id}/{token}/0.mp4", *(f"{request_id}/{token}/0-{f}.png" for f in range(frames))]
    await api.redis.register_script(k.RESULTS_RECORD)(keys=[api.keys.results_journal], args=[60_000, *keys])
    blobs = [MP4, *(encoded(spec.width, spec.height, f) for f in range(frames))]
    for key, blob in zip(keys, blobs, strict=True):
        await anyio.to_thread.run_sync(api.results.put, key, blob)
    error_type, error_message, none_held = "", "", ""  # FINISH's per-request ARGV (finish.lua's legend)
    args: list[Any] = [time.time(), 60, api.keys.finished, token, request_id, "succeeded", error_type, error_message]
    args += [none_held, len(keys), *keys]
    await api.redis.register_script(k.FINISH)(keys=k.finish_keys(api.keys, request_id), args=args)


async def test_the_openai_client_creates_polls_and_downloads(video_api: Api, client: openai.AsyncOpenAI) -> None:
    extra = {"seed": 7, "num_inference_steps": 2, "guidance_scale": 3.0, "fps": 8, "negative_prompt": "blur"}
    video = await client.videos.create(prompt="a fox", size="32x32", seconds="1", extra_body=extra)  # type: ignore[arg-type]
    assert (video.object, video.status, video.progress, video.size, video.seconds) == (
        "video",
        "queued",
        0,
        "32x32",
        "1.125",
    )
    assert video.model == "demo" and video.completed_at is None and video.error is None
    spec = await spec_of(video_api, video.id)  # the job is a native request, same id
    assert (spec.width, spec.height, spec.num_frames, spec.fps, spec.seed) == (32, 32, 9, 8, 7)
    assert (spec.num_inference_steps, spec.guidance_scale, spec.negative_prompt) == (2, 3.0, "blur")

    await video_api.redis.hset(video_api.keys.request(video.id), mapping={"status": "running", "step": 1, "total": 2})
    raw = await client.videos.with_raw_response.retrieve(video.id)
    running = raw.parse()
    assert (running.status, running.progress) == ("in_progress", 50)
    assert raw.headers["openai-poll-after-ms"] == "500"

    await finish_video(video_api, video.id, frames=9)
    done = await client.videos.poll(video.id, poll_interval_ms=10)
    assert (done.status, done.progress) == ("completed", 100)
    assert done.completed_at is not None and done.expires_at == done.completed_at + video_api.settings.result_ttl_s
    content = await client.videos.download_content(video.id)
    assert content.content == MP4
    thumbnail = await client.videos.download_content(video.id, variant="thumbnail")
    assert thumbnail.content == encoded(32, 32, 0)  # the first frame
    with pytest.raises(openai.BadRequestError) as spritesheet:
        await client.videos.download_content(video.id, variant="spritesheet")
    assert spritesheet.value.param == "variant"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"size": "48x32"}, "size", "invalid_value"),  # LTX: multiples of 32
        ({"size": "1024x32"}, "size", "invalid_value"),  # past max_image_side (512)
        ({"size": "big"}, "size", "invalid_value"),
        ({"seconds": "abc"}, "seconds", "invalid_value"),
        ({"seconds": "0"}, "seconds", "invalid_value"),
        ({"seconds": True}, "seconds", "invalid_type"),
        ({"seconds": "60"}, "seconds", "invalid_value"),  # 1497 frames: past max_num_frames (the native bound)
        ({"size": "512x512", "seconds": "10"}, "size", "invalid_value"),  # 249 frames of 512x512: the pixel budget
        ({"fps": 0, "seconds": "1"}, "fps", "invalid_value"),
        ({"fps": 500}, "fps", "invalid_value"),
        ({"fps": 8.5, "seconds": "1"}, "fps", "invalid_type"),
        ({"input_reference": "data:image/png;base64,AAAA"}, "input_reference", "invalid_value"),  # no i2v here
        ({"n": 2}, "n", "unknown_parameter"),
        ({"steps": 4}, "steps", "unknown_parameter"),
        ({"seed": "7"}, "seed", "invalid_type"),  # JSON: as strict as the native API
        ({"prompt": ""}, "prompt", "invalid_value"),
    ],
)
async def test_what_the_model_cannot_do_is_a_400_naming_param(
    video_api: Api, body: dict[str, Any], param: str, code: str
) -> None:
    error = await refused(video_api, **body)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code), error


async def test_no_job_before_a_worker_announced_the_model(api: Api) -> None:
    error = await refused(api, 503)  # its frame and size rules are unknown yet
    assert (error["type"], error["code"]) == ("server_error", "model_unavailable")


async def test_the_model_must_make_videos(api: Api) -> None:
    await announce(api, "w1", FAMILIES["stable-diffusion"].traits)
    error = await refused(api)
    assert (error["param"], error["code"]) == ("model", "invalid_value") and "images" in error["message"]
    error = await refused(api, 404, model="sora-2")
    assert (error["param"], error["code"]) == ("model", "model_not_found")


async def test_a_multipart_form_reads_numbers(video_api: Api, client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad_size:
        await client.videos.create(prompt="a fox", size="720x1280")  # past this server's max_image_side
    assert bad_size.value.param == "size"
    form = {"prompt": "a fox", "size": "32x64", "seconds": "2", "fps": "8", "webhook_events[]": "completed"}
    response = await video_api.http.post(VIDEOS, data=form)
    assert response.status_code == 422 or response.status_code == 400, response.text
    assert openai_error(response, 400)["param"] == "webhook_events"  # needs a webhook: the native rule
    del form["webhook_events[]"]
    response = await video_api.http.post(VIDEOS, data=form)
    assert response.status_code == 200, response.text
    spec = await spec_of(video_api, response.json()["id"])
    assert (spec.width, spec.height, spec.num_frames, spec.fps) == (32, 64, 17, 8)


async def test_failed_and_aborted_jobs_say_why(video_api: Api) -> None:
    failed = await create(video_api)
    await video_api.finish(failed["id"], "failed", error=("RuntimeError", "boom"))
    video = (await video_api.http.get(f"{VIDEOS}/{failed['id']}")).json()
    assert video["status"] == "failed" and video["error"] == {
        "code": "generation_failed",
        "message": "RuntimeError: boom",
    }
    bad = await create(video_api)
    await video_api.finish(bad["id"], "failed", error=("InvalidInput", "no"))
    assert (await video_api.http.get(f"{VIDEOS}/{bad['id']}")).json()["error"]["code"] == "invalid_input"
    assert (await video_api.http.get(f"{VIDEOS}/{failed['id']}/content")).status_code == 404


async def test_delete_aborts_an_unfinished_job_then_deletes_it(video_api: Api, client: openai.AsyncOpenAI) -> None:
    job = await create(video_api)
    first = await client.videos.delete(job["id"])
    assert (first.id, first.object, first.deleted) == (job["id"], "video.deleted", False)
    native = (await video_api.http.get(f"/v1/requests/{job['id']}")).json()
    assert native["status"] == "aborted"  # the native abort
    video = await client.videos.retrieve(job["id"])
    assert video.status == "failed" and video.error is not None and video.error.code == "aborted"
    second = await client.videos.delete(job["id"])
    assert second.deleted is True
    with pytest.raises(openai.NotFoundError) as gone:
        await client.videos.retrieve(job["id"])
    assert gone.value.code == "video_not_found"
    assert (await video_api.http.get(f"/v1/requests/{job['id']}")).status_code == 404
    assert (await client.videos.list()).data == []


async def test_unknown_ids_and_image_requests_are_not_videos(video_api: Api) -> None:
    image = await video_api.http.post("/v1/requests", json={"prompt": "a cat", "width": 32, "height": 32})
    for video_id in (image.json()["id"], "0" * 32, "not-an-id", "x" * 300):
        for method, path in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
            response = await video_api.http.request(method, f"{VIDEOS}/{video_id}{path}")
            assert openai_error(response, 404)["code"] == "video_not_found", (method, path)


async def test_list_pages_newest_first_and_drops_the_gone(video_api: Api, client: openai.AsyncOpenAI) -> None:
    ids = [(await create(video_api, prompt=f"clip {i}"))["id"] for i in range(5)]
    page = await client.videos.list(limit=2)
    assert [video.id for video in page.data] == ids[:-3:-1] and page.has_more
    assert [video.id async for video in await client.videos.list(limit=2)] == ids[::-1]  # the client pages on
    oldest = await client.videos.list(order="asc", limit=3)
    assert [video.id for video in oldest.data] == ids[:3] and oldest.last_id == ids[2]
    rest = await client.videos.list(order="asc", after=ids[2])
    assert [video.id for video in rest.data] == ids[3:] and not rest.has_more

    await video_api.redis.delete(video_api.keys.request(ids[3]), video_api.keys.request(ids[2]))  # expired
    page = await client.videos.list(limit=2)
    assert [video.id for video in page.data] == [ids[4], ids[1]] and page.has_more
    assert await video_api.redis.zrange(video_api.keys.videos, 0, -1) == [ids[0], ids[1], ids[4]]  # dropped
    for query, param in (({"limit": 0}, "limit"), ({"limit": "x"}, "limit"), ({"order": "up"}, "order")):
        assert openai_error(await video_api.http.get(VIDEOS, params=query), 400)["param"] == param
    assert openai_error(await video_api.http.get(VIDEOS, params={"after": ids[2]}), 400)["param"] == "after"


async def test_an_addition_drops_the_oldest_gone_jobs(video_api: Api) -> None:
    ids = [(await create(video_api))["id"] for _ in range(3)]
    await video_api.redis.delete(*(video_api.keys.request(request_id) for request_id in ids[:2]))
    newest = (await create(video_api))["id"]
    assert await video_api.redis.zrange(video_api.keys.videos, 0, -1) == [ids[2], newest]


def test_a_video_of_a_state_is_openais_shape() -> None:
    spec = RequestSpec(
        id="a" * 32, model="demo", prompt="p", seed=1, created_at=100.5, width=32, height=64, num_frames=9, fps=8
    )
    video = video_of(RequestState(spec=spec, status=RequestStatus.SCHEDULED), 60)
    assert video.model_dump() == {
        "id": "a" * 32,
        "object": "video",
        "status": "queued",
        "progress": 0,
        "created_at": 100,
        "completed_at": None,
        "expires_at": None,
        "error": None,
        "model": "demo",
        "prompt": "p",
        "seconds": "1.125",
        "size": "32x64",
    }


# --- API keys ------------------------------------------------------------------------------------------------------

KEYS = {name: ApiKey(name=name, sha256=token_hash(f"ff_{name}")) for name in ("alice", "bob")}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer ff_{name}"}


@pytest.fixture
async def keyed_api(tmp_path: Path) -> AsyncIterator[Api]:
    path = tmp_path / "keys.toml"
    path.write_text("".join(key_table(key) for key in KEYS.values()))
    async for harness in api_harness(unit_settings(tmp_path, api_keys_file=path)):
        await announce(harness, "w1", LTX, "LTXPipeline")
        yield harness


async def test_with_api_keys_each_key_sees_its_own_videos(keyed_api: Api) -> None:
    alices = [(await create(keyed_api, headers=auth("alice")))["id"] for _ in range(2)]
    bobs = (await create(keyed_api, headers=auth("bob")))["id"]
    listed = (await keyed_api.http.get(VIDEOS, headers=auth("alice"))).json()
    assert [video["id"] for video in listed["data"]] == alices[::-1]
    assert [video["id"] for video in (await keyed_api.http.get(VIDEOS, headers=auth("bob"))).json()["data"]] == [bobs]
    for method, path in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
        response = await keyed_api.http.request(method, f"{VIDEOS}/{bobs}{path}", headers=auth("alice"))
        assert openai_error(response, 404)["code"] == "video_not_found"
    for method, path in (
        ("POST", ""),
        ("GET", ""),
        ("GET", f"/{bobs}"),
        ("GET", f"/{bobs}/content"),
        ("DELETE", f"/{bobs}"),
    ):
        response = await keyed_api.http.request(method, f"{VIDEOS}{path}", json={"prompt": "a fox"})
        assert openai_error(response, 401)["code"] == "missing_api_key", (method, path)
    assert (await keyed_api.http.get(f"{VIDEOS}/{bobs}", headers=auth("bob"))).json()["status"] == "queued"


async def test_non_finite_numbers_are_400s_not_500s(video_api: Api) -> None:
    for body in ('{"prompt": "a fox", "fps": Infinity, "seconds": "1"}', '{"prompt": "a fox", "seconds": NaN}'):
        response = await video_api.http.post(VIDEOS, content=body, headers={"content-type": "application/json"})
        assert openai_error(response, 400)["param"] in ("fps", "seconds"), body


async def test_a_body_over_the_limit_is_openais_413(tmp_path: Path) -> None:
    async for harness in api_harness(unit_settings(tmp_path, max_body_bytes=1024)):
        response = await harness.http.post(VIDEOS, json={"prompt": "x" * 2048})
        assert openai_error(response, 413)["code"] == "request_too_large"


async def test_a_job_keeps_its_webhook(tmp_path: Path) -> None:
    settings = unit_settings(tmp_path, webhook_allowed_hosts=["127.0.0.1"], webhook_secret="s3cret")
    async for harness in api_harness(settings):
        await announce(harness, "w1", LTX, "LTXPipeline")
        hook = "http://127.0.0.1:9/hook"
        job = await create(harness, webhook=hook, webhook_events=["start", "completed"])
        stored = await harness.redis.hmget(harness.keys.request(job["id"]), ["webhook", "webhook_on"])
        assert stored[0] == hook and stored[1]  # its events reach the webhook outbox as any request's
        error = openai_error(
            await harness.http.post(VIDEOS, json={"prompt": "a fox", "webhook": "http://10.0.0.1/"}), 400
        )
        assert error["param"] == "webhook"


async def test_a_job_the_list_cannot_record_is_aborted_and_refused(
    video_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def list_down(self: RequestStore, request_id: str, created_at: float, owner: str | None) -> None:
        raise StoreUnavailable(ConnectionError("list write lost"))

    monkeypatch.setattr(RequestStore, "add_video", list_down)
    response = await video_api.http.post(VIDEOS, json={"prompt": "a fox", "size": "32x32"})
    error = openai_error(response, 503)
    assert error["code"] == "service_unavailable" and "retry-after" in response.headers
    hashes = [key for key in await video_api.redis.keys(video_api.keys.request("*")) if not key.endswith(":events")]
    assert [await video_api.redis.hget(key, "status") for key in hashes] == ["aborted"]  # submitted, then aborted


# --- several models ------------------------------------------------------------------------------------------------


@pytest.fixture
async def two_models(tmp_path: Path) -> AsyncIterator[Api]:
    async for harness in api_harness(unit_settings(tmp_path, models="img=demo:stable-diffusion,clip=demo:ltx-video")):
        served = (
            ModelCapabilities(model="img", pipeline="StableDiffusionPipeline", tasks=(Task.TEXT_TO_IMAGE,), traits=SD),
            ModelCapabilities(model="clip", pipeline="LTXPipeline", tasks=(Task.TEXT_TO_IMAGE,), traits=LTX),
        )
        await harness.redis.zadd(harness.keys.workers, {"w1": 1})
        await harness.redis.hset(harness.keys.capabilities, "w1", WorkerCapabilities.of(served).model_dump_json())
        yield harness


async def test_a_job_names_its_video_model(two_models: Api) -> None:
    job = await create(two_models, model="clip", seconds="1", fps=8)
    spec = await spec_of(two_models, job["id"])
    assert (job["model"], spec.model, spec.num_frames) == ("clip", "clip", 9)  # by the clip model's frame rule
    for model in (None, "img"):  # the default model, img, makes images
        error = await refused(two_models, **({"model": model} if model else {}))
        assert (error["param"], error["code"]) == ("model", "invalid_value") and "'img'" in error["message"]
    error = await refused(two_models, 404, model="sora-2")
    assert error["code"] == "model_not_found" and "img, clip" in error["message"]


# --- input_reference: image-to-video ---------------------------------------------------------------------------


@pytest.fixture
async def i2v_api(api: Api) -> Api:
    """A fleet whose LTX-Video worker announces image-to-video (its image task)."""
    await api.redis.zadd(api.keys.workers, {"w1": 1})
    tasks = (Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE)
    capabilities = WorkerCapabilities(model="demo", pipeline="LTXPipeline", tasks=tasks, traits=LTX)
    await api.redis.hset(api.keys.capabilities, "w1", capabilities.model_dump_json())
    return api


async def stored_image(api: Api, request_id: str) -> bytes | None:
    (image,) = await api.binary.hmget(api.keys.request(request_id), ["input_image"])
    return cast(bytes | None, image)


async def test_an_uploaded_input_reference_is_the_first_frame_of_an_image_to_video_job(
    i2v_api: Api, client: openai.AsyncOpenAI
) -> None:
    picture = encoded(32, 32, 200)
    video = await client.videos.create(
        prompt="a fox", size="32x32", input_reference=("in.png", picture, "image/png"), extra_body={"fps": 8}
    )  # type: ignore[arg-type]
    spec = await spec_of(i2v_api, video.id)
    assert (spec.task, spec.width, spec.strength) == (Task.IMAGE_TO_IMAGE, 32, None)
    assert await stored_image(i2v_api, video.id) == picture  # already 32x32: the client's own bytes
    other = await client.videos.create(
        prompt="a fox", size="64x32", input_reference=("in.png", picture, "image/png")
    )  # resized to the asked size, as every input image
    with Image.open(io.BytesIO(await stored_image(i2v_api, other.id) or b"")) as stored:
        assert stored.size == (64, 32)


async def test_a_json_input_reference_is_an_image_url_holding_a_data_url(i2v_api: Api) -> None:
    data_url = "data:image/png;base64," + base64.b64encode(encoded(32, 32, 9)).decode()
    for reference in ({"image_url": data_url}, data_url):
        job = await create(i2v_api, input_reference=reference)
        assert (await spec_of(i2v_api, job["id"])).task is Task.IMAGE_TO_IMAGE


async def test_a_form_sends_the_reference_object_as_its_key_field(i2v_api: Api) -> None:
    data_url = "data:image/png;base64," + base64.b64encode(encoded(32, 32, 9)).decode()
    form = {"prompt": "a fox", "size": "32x32", "input_reference[image_url]": data_url}
    response = await i2v_api.http.post(VIDEOS, data=form)
    assert response.status_code == 200, response.text
    assert (await spec_of(i2v_api, response.json()["id"])).task is Task.IMAGE_TO_IMAGE


@pytest.mark.parametrize(
    ("reference", "code"),
    [
        ({"image_url": "https://example.com/fox.png"}, "unsupported_parameter"),  # nothing is fetched
        ({"file_id": "file-123"}, "unsupported_parameter"),  # no Files API
        ({"url": "x"}, "unknown_parameter"),
        (7, "invalid_type"),
        ("not base64!", "invalid_value"),  # the native check of input images
        ("data:image/png;base64," + base64.b64encode(b"GIF89a").decode(), "invalid_value"),
    ],
)
async def test_a_bad_input_reference_is_a_400_naming_it(i2v_api: Api, reference: Any, code: str) -> None:
    error = await refused(i2v_api, size="32x32", input_reference=reference)
    assert (error["param"], error["code"]) == ("input_reference", code), error


async def test_an_input_reference_is_bounded_as_every_input_image(i2v_api: Api, client: openai.AsyncOpenAI) -> None:
    limit = i2v_api.settings.max_input_image_pixels
    side = int(limit**0.5) + 1
    with pytest.raises(openai.BadRequestError) as too_many:
        await client.videos.create(prompt="a fox", input_reference=("big.png", encoded(side, side), "image/png"))
    assert too_many.value.param == "input_reference" and "max_input_image_pixels" in too_many.value.message


async def test_a_model_without_image_to_video_refuses_input_reference(video_api: Api) -> None:
    data_url = "data:image/png;base64," + base64.b64encode(encoded(32, 32)).decode()
    error = await refused(video_api, size="32x32", input_reference={"image_url": data_url})
    assert error["param"] == "input_reference" and "does not do image-to-image" in error["message"], error


# --- the decode bound ---------------------------------------------------------------------------------------------


async def test_a_clip_past_the_decode_bound_is_refused_at_submit(tmp_path: Path) -> None:
    """max_video_decode_bytes (n x frames x width x height x 12 bytes) is known at submit: the job is refused there,
    naming seconds (num_frames natively), the model's default frame count counted when none is asked."""
    decoded_9_frames = 9 * 32 * 32 * 12
    settings = unit_settings(tmp_path, max_video_decode_bytes=decoded_9_frames)
    async for api in api_harness(settings):
        await announce(api, "w1", LTX, "LTXPipeline")
        await create(api, size="32x32", seconds="1", fps=8)  # 9 frames: exactly the bound
        error = await refused(api, size="32x32", seconds="2", fps=8)  # 17 frames
        assert error["param"] == "seconds" and "max_video_decode_bytes" in error["message"], error
        native = await api.http.post("/v1/requests", json={"prompt": "a fox", "width": 32, "height": 32})
        assert native.status_code == 422  # LTX's default 161 frames
        assert native.json()["detail"][0]["loc"][-1] == "num_frames", native.text


async def test_a_job_past_the_batch_time_limit_reads_failed_and_says_so(video_api: Api) -> None:
    """A forward that outlives the soft limit (0.9 x batch_time_limit_s) fails its requests SoftTimeLimitExceeded
    (tests/unit/test_executor.py::test_time_limit_fails_what_is_unfinished); the job reads failed, not retried."""
    job = await create(video_api)
    await video_api.finish(job["id"], "failed", error=("SoftTimeLimitExceeded", "SoftTimeLimitExceeded()"))
    video = (await video_api.http.get(f"{VIDEOS}/{job['id']}")).json()
    assert (video["status"], video["error"]["code"]) == ("failed", "generation_failed")
    assert video["error"]["message"].startswith("SoftTimeLimitExceeded") and video["expires_at"] is not None
