"""The api refuses what the fleet's model cannot do, from the traits its live workers announce (422 naming the
field), and accepts what any live worker can run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api.limits import limit_errors
from gpu_worker.families import FAMILIES
from shared.contracts import ModelTraits, Task, WorkerCapabilities
from shared.settings import Settings
from shared.wire import GenerateRequest
from tests.support.api import Api

pytestmark = pytest.mark.anyio


async def announce(api: Api, worker: str, traits: ModelTraits, pipeline: str = "Pipeline") -> None:
    """A live worker's heartbeat, as heartbeat.lua writes it."""
    await api.redis.zadd(api.keys.workers, {worker: 1})
    capabilities = WorkerCapabilities(model="demo", pipeline=pipeline, tasks=(Task.TEXT_TO_IMAGE,), traits=traits)
    await api.redis.hset(api.keys.capabilities, worker, capabilities.model_dump_json())


async def refused(api: Api, **fields: Any) -> list[tuple[str, str]]:
    """(field, message) of each 422 error of a submission, or [] when accepted; nothing is queued when refused."""
    before = await api.redis.xlen(api.keys.requests)
    response = await api.http.post("/v1/requests", json={"prompt": "a fox", **fields})
    if response.status_code == 202:
        return []
    assert response.status_code == 422, response.text
    assert await api.redis.xlen(api.keys.requests) == before
    return [(str(error["loc"][-1]), str(error["msg"])) for error in response.json()["detail"]]


FLUX = FAMILIES["flux"].traits
SD = FAMILIES["stable-diffusion"].traits
VIDEO = ModelTraits(family="ltx-video", size_multiple=32, video=True, frames_multiple=8, default_frames=9)


async def test_flux_refuses_what_it_would_ignore_and_names_each_field(api: Api) -> None:
    await announce(api, "w1", FLUX, "FluxPipeline")
    errors = await refused(api, width=72, negative_prompt="blurry", guidance_rescale=0.5, max_sequence_length=600)
    assert [field for field, _ in errors] == ["width", "negative_prompt", "guidance_rescale", "max_sequence_length"]
    messages = dict(errors)
    assert messages["width"] == "width must be a multiple of 16 for this fleet's model (demo, flux)"
    assert "unless true_cfg_scale > 1" in messages["negative_prompt"]
    assert "at most 512" in messages["max_sequence_length"]
    assert await refused(api, width=80, height=48, max_sequence_length=128) == []
    assert await refused(api, negative_prompt="blurry", true_cfg_scale=4.0) == []  # true CFG uses negatives


async def test_stable_diffusion_refuses_flux_only_and_video_parameters(api: Api) -> None:
    await announce(api, "w1", SD, "StableDiffusionPipeline")
    errors = dict(await refused(api, true_cfg_scale=4.0, max_sequence_length=64, num_frames=9, fps=8))
    assert set(errors) == {"true_cfg_scale", "max_sequence_length", "num_frames", "fps"}
    assert errors["num_frames"] == "this fleet's model (demo, stable-diffusion) makes images, not videos"
    assert await refused(api, width=72, negative_prompt="blurry", guidance_rescale=0.7) == []


async def test_a_model_without_lora_support_refuses_an_adapter(api: Api) -> None:
    await announce(api, "w1", FAMILIES["pixart"].traits.model_copy(update={"lora": False}), "PixArtSigmaPipeline")
    assert dict(await refused(api, width=64, lora={"name": "style", "scale": 0.5})) == {
        "lora": "this fleet's model (demo, pixart) does not take LoRA adapters"
    }


async def test_a_video_model_checks_its_frame_rule(api: Api) -> None:
    await announce(api, "w1", VIDEO, "LTXPipeline")
    assert dict(await refused(api, width=64, height=64, num_frames=10)) == {
        "num_frames": "num_frames must be 8k + 1 (e.g. 9, 17) for this fleet's model (demo, ltx-video)"
    }
    assert await refused(api, width=64, height=64, num_frames=17, fps=24) == []


async def test_a_request_any_live_worker_can_run_is_accepted(api: Api) -> None:
    await announce(api, "w1", FLUX, "FluxPipeline")
    await announce(api, "w2", SD, "StableDiffusionPipeline")
    assert await refused(api, width=72, negative_prompt="blurry") == []  # w2 runs it


async def test_nothing_is_refused_before_a_worker_announces_itself(api: Api) -> None:
    assert await refused(api, width=72, true_cfg_scale=3.0, num_frames=9) == []


async def test_batch_errors_name_the_request_they_belong_to(api: Api) -> None:
    await announce(api, "w1", FLUX, "FluxPipeline")
    body = {"requests": [{"prompt": "ok"}, {"prompt": "bad", "height": 40}]}
    response = await api.http.post("/v1/requests/batch", json=body)
    assert response.status_code == 422
    assert [error["loc"] for error in response.json()["detail"]] == [["body", "requests", 1, "height"]]


async def test_frames_have_a_server_limit_and_count_against_the_pixel_budget(api: Api) -> None:
    too_many = api.settings.max_num_frames + 1
    assert [field for field, _ in await refused(api, num_frames=too_many)] == ["num_frames"]
    small_budget = Settings(max_batch_pixels=64 * 64 * 8, max_num_frames=257)
    video = GenerateRequest(prompt="a fox", width=64, height=64, num_frames=9)
    (error,) = limit_errors(video, small_budget)
    assert error["loc"] == ("body", "width") and error["ctx"]["pixels"] == 64 * 64 * 9
    assert error["msg"].startswith("n x width x height x num_frames = 1 x 64 x 64 x 9 = 36864 pixels")
    assert limit_errors(video.model_copy(update={"num_frames": 8}), small_budget) == []


async def test_booleans_are_not_numbers(api: Api) -> None:
    errors = await refused(api, guidance_scale=False, true_cfg_scale=True, lora={"name": "style", "scale": True})
    assert {field for field, _ in errors} == {"guidance_scale", "true_cfg_scale", "scale"}


async def test_a_burst_of_submissions_as_the_cache_lapses_reads_the_announcements_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    await announce(api, "w1", SD, "StableDiffusionPipeline")
    store = api.app.state.store
    reads = 0
    pipeline = store._redis.pipeline

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return pipeline(*args, **kwargs)

    monkeypatch.setattr(store._redis, "pipeline", counted)
    burst = await asyncio.gather(*(store.fleet_capabilities() for _ in range(16)))
    assert reads == 1
    assert [[c.pipeline for c in capabilities] for capabilities in burst] == [["StableDiffusionPipeline"]] * 16
    monkeypatch.setattr("api.store.CAPABILITIES_TTL_S", 0.0)  # lapsed: the next call reads again, once
    await asyncio.gather(store.fleet_capabilities(), store.fleet_capabilities())
    assert reads == 2


async def test_more_steps_than_the_models_scheduler_takes_are_refused(api: Api) -> None:
    await announce(api, "w1", SD.model_copy(update={"max_inference_steps": 30}), "StableDiffusionPipeline")
    assert dict(await refused(api, num_inference_steps=31)) == {
        "num_inference_steps": "num_inference_steps must be at most 30 for this fleet's model (demo, "
        "stable-diffusion): its scheduler runs no more steps"
    }
    assert await refused(api, num_inference_steps=30) == []
