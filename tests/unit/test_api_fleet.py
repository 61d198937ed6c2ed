"""``GET /v1/fleet`` (the fleet as JSON, on fakeredis) and the web page's files (``GET /``, ``/ui/*``): what they
answer, with and without API keys, and a 503 when Redis is away. The page itself runs in a real browser in
tests/integration/test_web_page.py."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from api.routes.ui import ASSET_TYPES, FOREVER, REVALIDATE, ui_files
from shared.api_keys import ApiKey, key_table, token_hash
from shared.contracts import Task, WorkerCapabilities
from tests.support.api import Api, api_harness, unit_settings

pytestmark = pytest.mark.anyio

DEMO = WorkerCapabilities(model="demo", pipeline="StableDiffusionPipeline", tasks=(Task.TEXT_TO_IMAGE,))


async def test_fleet_reports_the_queue_workers_batches_and_batch_sizes(api: Api) -> None:
    keys, redis = api.keys, api.redis
    for _ in range(3):
        assert (await api.http.post("/v1/requests", json={"prompt": "a cat"})).status_code == 202
    now_ms = int(time.time() * 1000)
    await redis.zadd(keys.workers, {"gpu1@h": now_ms, "gpu0@h": now_ms, "old@h": now_ms - 60_000})
    await redis.hset(keys.capabilities, "gpu0@h", DEMO.model_dump_json())
    await redis.zadd(keys.inflight, {"b" * 32: now_ms, "c" * 32: now_ms})  # b... runs on gpu0, c... waits
    await redis.hset(keys.batch("b" * 32), "ids", "r1 r2")
    await redis.hset(keys.batch("c" * 32), "ids", "r3")
    await redis.hset(keys.request("r1"), mapping={"status": "running", "worker": "gpu0@h", "step": 2, "total": 4})
    await redis.hset(keys.request("r2"), mapping={"status": "running", "worker": "gpu0@h", "step": 2, "total": 4})
    await redis.hset(keys.request("r3"), mapping={"status": "scheduled"})
    await redis.hset(keys.metrics, mapping={"batch_size:1": 5, "batch_size:4": 2})  # as schedule.lua counts them

    response = await api.http.get("/v1/fleet")

    assert response.status_code == 200, response.text
    view = response.json()
    assert (view["queue_depth"], view["batches_in_flight"], view["workers_live"]) == (3, 2, 2)
    assert 0 <= view["oldest_waiting_s"] < 5
    assert view["requests_accepted"] == 3
    assert view["batch_sizes"] == {"1": 5, "4": 2}
    running = {"batch_id": "b" * 32, "size": 2, "worker": "gpu0@h", "step": 2, "total": 4}
    assert view["batches"] == [running, {"batch_id": "c" * 32, "size": 1, "worker": None, "step": 0, "total": 0}]
    workers = {worker["name"]: worker for worker in view["workers"]}
    assert [worker["name"] for worker in view["workers"]] == ["gpu0@h", "gpu1@h", "old@h"]
    assert workers["gpu0@h"] | {"last_beat_s": 0} == {
        "name": "gpu0@h",
        "live": True,
        "last_beat_s": 0,
        "model": "demo",
        "pipeline": "StableDiffusionPipeline",
        "models": ["demo"],
        "resident": ["demo"],
        "batch": running,
    }
    assert workers["gpu1@h"]["batch"] is None and workers["gpu1@h"]["model"] is None
    assert workers["old@h"]["live"] is False and workers["old@h"]["last_beat_s"] >= 59


async def test_fleet_is_503_while_redis_is_away(api: Api) -> None:
    api.server.connected = False
    response = await api.http.get("/v1/fleet")
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) > 0 and "unavailable" in response.json()["detail"]
    api.server.connected = True
    assert (await api.http.get("/v1/fleet")).status_code == 200


async def test_the_page_links_its_versioned_assets_which_are_cached_for_good(api: Api) -> None:
    page = await api.http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == REVALIDATE
    assert "script-src 'self'" in page.headers["content-security-policy"]
    html = page.text
    assert '<html lang="en" data-api-keys="off">' in html and "{{" not in html
    version = ui_files().version
    linked = re.findall(r'(?:src|href)="(/ui/[^"]+)"', html)
    assert sorted(linked) == sorted(f"/ui/{name}?v={version}" for name in ASSET_TYPES)
    for url in linked:
        asset = await api.http.get(url)
        name = url.split("?")[0].removeprefix("/ui/")
        assert asset.status_code == 200 and asset.headers["content-type"] == ASSET_TYPES[name]
        assert asset.headers["cache-control"] == FOREVER
        assert asset.content == ui_files().assets[name]
    stale = await api.http.get("/ui/app.js?v=old")
    assert stale.status_code == 200 and stale.headers["cache-control"] == REVALIDATE
    missing = await api.http.get("/ui/secrets.txt")
    assert missing.status_code == 404 and missing.json() == {"detail": "no asset 'secrets.txt'"}
    assert "/" not in (await api.http.get("/openapi.json")).json()["paths"]


async def test_with_api_keys_the_page_is_open_and_says_so_and_the_fleet_needs_a_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(key_table(ApiKey(name="alice", sha256=token_hash("ff_alice"))))
    async for api in api_harness(unit_settings(tmp_path, api_keys_file=path)):
        page = await api.http.get("/")
        assert page.status_code == 200 and 'data-api-keys="on"' in page.text
        assert (await api.http.get("/ui/app.css")).status_code == 200
        refused = await api.http.get("/v1/fleet")
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
        wrong = await api.http.get("/v1/fleet", headers={"Authorization": "Bearer ff_mallory"})
        assert wrong.status_code == 401
        allowed = await api.http.get("/v1/fleet", headers={"Authorization": "Bearer ff_alice"})
        assert allowed.status_code == 200 and allowed.json()["queue_depth"] == 0
