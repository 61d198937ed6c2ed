"""Requests name their model (native ``model``, OpenAI ``model``), the capability checks are per model, and
``GET /v1/models`` (and ``fusefleet status``) lists what the live workers serve: the api on fakeredis, workers'
announcements written as heartbeat.lua writes them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import fakeredis
import pytest

from fusefleet.status import FleetStatus, render
from gpu_worker.families import FAMILIES
from shared.contracts import ModelCapabilities, RequestSpec, Task, WorkerCapabilities
from shared.fleet_state import FleetReader
from shared.keys import RedisKeys
from tests.support.api import Api, api_harness, unit_settings
from tests.unit.test_openai_api import GENERATIONS, call_while, openai_error

pytestmark = pytest.mark.anyio

SD = ModelCapabilities(
    model="sd", pipeline="StableDiffusionPipeline", tasks=(Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE),
    traits=FAMILIES["stable-diffusion"].traits,
)  # fmt: skip
FX = ModelCapabilities(model="fx", pipeline="FluxPipeline", tasks=(Task.TEXT_TO_IMAGE,), traits=FAMILIES["flux"].traits)


@pytest.fixture
async def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    monkeypatch.setattr("api.store.CAPABILITIES_TTL_S", 0.0)  # each call reads what the workers announce
    settings = unit_settings(tmp_path, models="sd=demo:stable-diffusion,fx=demo:flux,idle=demo:pixart")
    async for harness in api_harness(settings):
        yield harness


async def announce(api: Api, worker: str, *models: ModelCapabilities) -> None:
    await api.redis.zadd(api.keys.workers, {worker: 1})
    await api.redis.hset(api.keys.capabilities, worker, WorkerCapabilities.of(models).model_dump_json())


async def spec_of(api: Api, request_id: str) -> RequestSpec:
    return RequestSpec.model_validate_json(await api.redis.hget(api.keys.request(request_id), "spec"))


async def test_a_request_runs_on_the_model_it_names_or_the_default(api: Api) -> None:
    await announce(api, "w1", SD)
    await announce(api, "w2", FX)
    named = await api.http.post("/v1/requests", json={"prompt": "a fox", "model": "fx", "width": 64, "height": 64})
    unnamed = await api.http.post("/v1/requests", json={"prompt": "a fox"})
    assert (named.status_code, unnamed.status_code) == (202, 202)
    assert (await spec_of(api, named.json()["id"])).model == "fx"
    assert (await spec_of(api, unnamed.json()["id"])).model == "sd"  # the first of models
    view = (await api.http.get(f"/v1/requests/{named.json()['id']}")).json()
    assert view["params"]["model"] == "fx"


async def test_an_unknown_model_is_a_422_naming_model(api: Api) -> None:
    response = await api.http.post(
        "/v1/requests/batch", json={"requests": [{"prompt": "a"}, {"prompt": "b", "model": "x"}]}
    )
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert (error["type"], error["loc"]) == ("model_unknown", ["body", "requests", 1, "model"])
    assert error["msg"] == "unknown model 'x'; this fleet serves sd, fx, idle (GET /v1/models)"
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_each_request_is_checked_against_its_own_models_workers(api: Api) -> None:
    await announce(api, "w1", SD)
    await announce(api, "w2", FX)
    odd = {"prompt": "a fox", "width": 72, "height": 72, "negative_prompt": "blur"}  # 72: not a multiple of 16
    assert (await api.http.post("/v1/requests", json={**odd, "model": "sd"})).status_code == 202
    refused = await api.http.post("/v1/requests", json={**odd, "model": "fx"})
    assert refused.status_code == 422
    assert {tuple(e["loc"]) for e in refused.json()["detail"]} == {
        ("body", "width"),
        ("body", "height"),
        ("body", "negative_prompt"),
    }
    assert "(fx, flux)" in refused.json()["detail"][0]["msg"]
    # a model of the fleet no live worker serves yet is accepted (it waits for one), with nothing to check against
    assert (await api.http.post("/v1/requests", json={**odd, "model": "idle"})).status_code == 202


async def test_a_worker_of_several_models_counts_for_each(api: Api) -> None:
    await announce(api, "w1", FX, SD)
    odd = {"prompt": "a fox", "width": 72, "height": 72}
    assert (await api.http.post("/v1/requests", json={**odd, "model": "sd"})).status_code == 202
    assert (await api.http.post("/v1/requests", json={**odd, "model": "fx"})).status_code == 422


async def test_models_lists_each_model_a_live_worker_serves(api: Api) -> None:
    await announce(api, "w1", SD)
    await announce(api, "w2", FX, SD)
    body = (await api.http.get("/v1/models")).json()
    listed = [(m["id"], m["family"], m["tasks"], m["workers"], m["resident"]) for m in body["data"]]
    assert listed == [
        ("sd", "stable-diffusion", ["image-to-image", "text-to-image"], 2, True),
        ("fx", "flux", ["text-to-image"], 1, True),
    ]  # the fleet's order; idle is served by none
    idle = (await api.http.get("/v1/models/idle")).json()
    assert (idle["id"], idle["workers"], idle["resident"]) == ("idle", 0, False)
    missing = (await api.http.get("/v1/models/x")).json()["error"]
    assert (missing["code"], missing["param"]) == ("model_not_found", "model")
    assert missing["message"] == "The model 'x' does not exist; this server serves sd, fx, idle (GET /v1/models)"


async def test_the_openai_surface_takes_the_model_and_refuses_others_with_404(api: Api) -> None:
    await announce(api, "w2", FX)
    models: list[str] = []

    async def run(request_id: str) -> None:  # a fake worker: what the request is for, then it succeeds
        models.append((await spec_of(api, request_id)).model)
        await api.finish(request_id)

    send = lambda: api.http.post(GENERATIONS, json={"prompt": "a fox", "model": "fx", "size": "64x64"})  # noqa: E731
    response, _ = await call_while(api, send, run)
    assert response.status_code == 200, response.text
    assert models == ["fx"]
    unknown = await api.http.post(GENERATIONS, json={"prompt": "a fox", "model": "dall-e-3"})
    error = openai_error(unknown, 404)
    assert (error["code"], error["param"]) == ("model_not_found", "model")


async def test_status_shows_every_model_a_worker_serves() -> None:
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    keys = RedisKeys("t")
    await redis.zadd(keys.workers, {"gpu0@host": int(time.time() * 1000)})
    await redis.hset(keys.capabilities, "gpu0@host", WorkerCapabilities.of((SD, FX)).model_dump_json())
    snapshot = await FleetReader(redis, keys, worker_ttl_s=5, timeout_s=2).read()
    assert snapshot is not None
    assert render(FleetStatus(snapshot)).endswith(
        " s ago, sd StableDiffusionPipeline [stable-diffusion, fused; text-to-image, image-to-image] (resident); "
        "fx FluxPipeline [flux, fused; text-to-image] (resident)"
    )


async def test_a_model_is_resident_when_a_live_worker_holds_it_loaded(api: Api) -> None:
    await announce(api, "w1", SD.model_copy(update={"resident": False, "load_s": 2.5}), FX)  # holds fx only
    listed = {m["id"]: (m["workers"], m["resident"]) for m in (await api.http.get("/v1/models")).json()["data"]}
    assert listed == {"sd": (1, False), "fx": (1, True)}
    await announce(api, "w2", SD)
    assert (await api.http.get("/v1/models/sd")).json()["resident"] is True
