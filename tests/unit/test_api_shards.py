"""The api of a sharded fleet (``api.shard_router``) on fakeredis: a submission goes to its model's shard with an id
carrying the shard's mark, every by-id route reads that shard, an id of no shard is a 404 without a Redis call, and
the fleet-wide reads (models, capabilities, ``/v1/fleet``, ``/metrics``) are the union and sum over shards. Workers
are played as in the other api tests, each inside its shard's keys."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import EventSource
from prometheus_client.parser import text_string_to_metric_families

from api.shard_router import ShardedFleet, ShardedStore
from api.store import RequestStore
from gpu_worker.families import FAMILIES
from shared.api_keys import ApiKey, key_table, token_hash
from shared.contracts import ModelCapabilities, Task, WorkerCapabilities
from shared.fleet_state import FleetSnapshot, RunningBatch, WorkerState, merge_snapshots
from shared.keys import RedisKeys
from shared.metrics import FleetCounters
from shared.shards import ID_BYTES, MARK_DIGITS, Shards, shard_mark
from tests.support.api import Api, api_harness, finish_like_worker, unit_settings

pytestmark = pytest.mark.anyio
PNG = b"\x89PNG\r\n\x1a\nfake"
MODELS = "sd=demo:stable-diffusion,fx=demo:flux,pa=demo:pixart"
SD = ModelCapabilities(
    model="sd", pipeline="StableDiffusionPipeline", tasks=(Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE),
    traits=FAMILIES["stable-diffusion"].traits,
)  # fmt: skip
FX = ModelCapabilities(model="fx", pipeline="FluxPipeline", tasks=(Task.TEXT_TO_IMAGE,), traits=FAMILIES["flux"].traits)
HOME_KEYS, FAST_KEYS = RedisKeys("t"), RedisKeys("t:fast")  # sd and pa stay home; fx is in shard "fast"


@pytest.fixture
async def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    monkeypatch.setattr("api.store.CAPABILITIES_TTL_S", 0.0)  # each call reads what the workers announce
    async for harness in api_harness(unit_settings(tmp_path, models=MODELS, model_shards="fx=fast")):
        yield harness


async def announce(api: Api, keys: RedisKeys, worker: str, *models: ModelCapabilities) -> None:
    await api.redis.zadd(keys.workers, {worker: 1e13})  # beating far in the future: live
    await api.redis.hset(keys.capabilities, worker, WorkerCapabilities.of(models).model_dump_json())


async def submit(api: Api, model: str, **body: Any) -> str:
    response = await api.http.post("/v1/requests", json={"prompt": "a fox", "model": model, **body})
    assert response.status_code == 202, response.text
    request_id: str = response.json()["id"]
    return request_id


async def finish(api: Api, keys: RedisKeys, request_id: str, outcome: str = "succeeded") -> None:
    """What a worker of ``keys``' shard does to end a request."""
    await finish_like_worker(api.redis, api.results, keys, request_id, outcome, [PNG] if outcome == "succeeded" else [])


def foreign_id(shards: Shards) -> str:
    """A well-shaped id whose mark is no shard's of ``shards``."""
    marks = {shard_mark(shard) for shard in shards.names}
    return next(mark for mark in (f"{n:04x}" for n in range(65536)) if mark not in marks) + "0" * 28


async def test_a_fleet_without_shards_holds_its_one_shards_store_itself(tmp_path: Path) -> None:
    async for plain in api_harness(unit_settings(tmp_path, models=MODELS)):
        assert type(plain.app.state.store) is RequestStore
        request_id = await submit(plain, "fx")
        assert await plain.redis.exists(HOME_KEYS.request(request_id))


async def test_a_submission_goes_to_its_models_shard_with_its_mark(api: Api) -> None:
    assert isinstance(api.app.state.store, ShardedStore)
    fast, home = await submit(api, "fx"), await submit(api, "sd")
    assert fast[:MARK_DIGITS] == shard_mark("fast") and home[:MARK_DIGITS] == shard_mark("")
    assert await api.redis.exists(FAST_KEYS.request(fast)) and not await api.redis.exists(HOME_KEYS.request(fast))
    assert await api.redis.exists(HOME_KEYS.request(home)) and not await api.redis.exists(FAST_KEYS.request(home))
    assert (await api.redis.xlen(FAST_KEYS.requests), await api.redis.xlen(HOME_KEYS.requests)) == (1, 1)
    view = (await api.http.get(f"/v1/requests/{fast}")).json()
    assert (view["status"], view["params"]["model"]) == ("queued", "fx")


async def test_reads_results_aborts_and_deletes_go_to_the_ids_shard(api: Api) -> None:
    fast, home = await submit(api, "fx"), await submit(api, "sd")
    await finish(api, FAST_KEYS, fast)
    assert (await api.http.get(f"/v1/requests/{fast}")).json()["status"] == "succeeded"
    image = await api.http.get(f"/v1/requests/{fast}/images/0")
    assert (image.status_code, image.content) == (200, PNG)
    aborted = await api.http.post(f"/v1/requests/{home}/abort")
    assert (aborted.status_code, aborted.json()["status"]) == (200, "aborted")
    assert await api.redis.hget(HOME_KEYS.request(home), "status") == "aborted"
    again = await api.http.post(f"/v1/requests/{fast}/abort")
    assert again.status_code == 409, "it succeeded, in its shard"
    assert (await api.http.delete(f"/v1/requests/{fast}")).status_code == 204
    assert not await api.redis.exists(FAST_KEYS.request(fast))
    assert (await api.http.get(f"/v1/requests/{fast}")).status_code == 404


async def test_an_id_of_no_shard_is_a_404_on_every_route_without_asking_redis(api: Api) -> None:
    stranger = foreign_id(Shards(api.settings))
    routes = [
        ("GET", f"/v1/requests/{stranger}"),
        ("GET", f"/v1/requests/{stranger}?wait_s=1"),
        ("GET", f"/v1/requests/{stranger}/images/0"),
        ("GET", f"/v1/requests/{stranger}/events"),
        ("GET", f"/v1/events?ids={stranger}"),
        ("POST", f"/v1/requests/{stranger}/abort"),
        ("DELETE", f"/v1/requests/{stranger}"),
        ("GET", f"/v1/videos/{stranger}"),
    ]
    mine = await submit(api, "fx")
    api.server.connected = False  # every Redis call now fails (a 503): the stranger gets its 404 without one
    try:
        for method, path in routes:
            response = await api.http.request(method, path)
            assert response.status_code == 404, (method, path, response.text)
        assert (await api.http.get(f"/v1/requests/{mine}")).status_code == 503, "a known shard's id asks Redis"
    finally:
        api.server.connected = True


async def test_a_long_poll_wakes_on_its_shards_completion_channel(api: Api) -> None:
    fast = await submit(api, "fx")
    poll = asyncio.create_task(api.http.get(f"/v1/requests/{fast}", params={"wait_s": 10}))
    await asyncio.sleep(0.2)
    started = asyncio.get_running_loop().time()
    await finish(api, FAST_KEYS, fast)
    response = await poll
    assert response.json()["status"] == "succeeded"
    assert asyncio.get_running_loop().time() - started < 5


async def _events(api: Api, path: str) -> list[tuple[str, Any]]:
    async with api.http.stream("GET", path) as response:
        assert response.status_code == 200
        return [(sse.event, json.loads(sse.data)) async for sse in EventSource(response).aiter_sse()]


async def test_event_streams_read_each_requests_shard_and_one_stream_follows_two_shards(api: Api) -> None:
    fast, home = await submit(api, "fx"), await submit(api, "sd")
    await finish(api, FAST_KEYS, fast)
    assert [name for name, _ in await _events(api, f"/v1/requests/{fast}/events")] == ["queued", "succeeded"]
    both = asyncio.create_task(_events(api, f"/v1/events?ids={fast},{home}"))
    await asyncio.sleep(0.3)
    assert not both.done(), "the sd request is still queued: the stream waits on it"
    await finish(api, HOME_KEYS, home, "failed")
    events = await asyncio.wait_for(both, 10)
    assert [(name, data["id"]) for name, data in events if name in ("succeeded", "failed")] == [
        ("succeeded", fast),
        ("failed", home),
    ]


async def test_a_batch_across_shards_queues_each_part_in_its_shard(api: Api) -> None:
    rows = [{"prompt": "a", "model": "sd"}, {"prompt": "b", "model": "fx"}, {"prompt": "c", "model": "pa"}]
    response = await api.http.post("/v1/requests/batch", json={"requests": rows})
    assert response.status_code == 202, response.text
    ids = response.json()["ids"]
    assert [request_id[:MARK_DIGITS] for request_id in ids] == [shard_mark(""), shard_mark("fast"), shard_mark("")]
    assert (await api.redis.xlen(HOME_KEYS.requests), await api.redis.xlen(FAST_KEYS.requests)) == (2, 1)


async def test_a_batch_refused_by_one_shard_aborts_what_the_others_queued(api: Api) -> None:
    for _ in range(api.settings.max_queue_len):  # the fast shard's queue is full; home's is empty
        await submit(api, "fx")
    rows = [{"prompt": "a", "model": "sd"}, {"prompt": "b", "model": "fx"}]
    response = await api.http.post("/v1/requests/batch", json={"requests": rows})
    assert response.status_code == 503, response.text
    home_ids = [key.split(":")[-1] async for key in api.redis.scan_iter(HOME_KEYS.request("*"))]
    home_ids = [request_id for request_id in home_ids if len(request_id) == 32]
    assert len(home_ids) == 1, home_ids
    assert await api.redis.hget(HOME_KEYS.request(home_ids[0]), "status") == "aborted", "its row runs not alone"


async def test_a_batch_across_shards_retried_under_its_idempotency_key_is_queued_once(api: Api) -> None:
    """The retry a client makes after a 503 between the shards' parts (the first shard's part aborted) queues the
    whole batch; once queued, a retry is answered with the same ids and queues nothing (the key's record is in the
    fleet's own keys)."""
    for _ in range(api.settings.max_queue_len):  # the fast shard's queue is full
        await submit(api, "fx")
    rows = [{"prompt": "a", "model": "sd"}, {"prompt": "b", "model": "fx"}]
    headers = {"Idempotency-Key": "batch-7"}
    refused = await api.http.post("/v1/requests/batch", json={"requests": rows}, headers=headers)
    assert refused.status_code == 503, refused.text
    await api.redis.delete(FAST_KEYS.requests)  # room again
    first = await api.http.post("/v1/requests/batch", json={"requests": rows}, headers=headers)
    again = await api.http.post("/v1/requests/batch", json={"requests": rows}, headers=headers)
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    assert again.json()["ids"] == first.json()["ids"] and again.headers["Idempotent-Replayed"] == "true"
    # one row in each shard's queue: the refused call's home row was aborted, which takes it off the queue
    assert (await api.redis.xlen(HOME_KEYS.requests), await api.redis.xlen(FAST_KEYS.requests)) == (1, 1)
    assert [key async for key in api.redis.scan_iter(f"{HOME_KEYS.tag}:idem:*")]
    assert not [key async for key in api.redis.scan_iter(f"{FAST_KEYS.tag}:idem:*")]


async def test_models_and_capabilities_are_the_union_of_the_shards(api: Api) -> None:
    await announce(api, HOME_KEYS, "w-home", SD)
    await announce(api, FAST_KEYS, "w-fast", FX)
    models = (await api.http.get("/v1/models")).json()["data"]
    assert [(model["id"], model["workers"]) for model in models] == [("sd", 1), ("fx", 1)]
    refused = await api.http.post("/v1/requests", json={"prompt": "a", "model": "fx", "negative_prompt": "blur"})
    assert refused.status_code == 422, "fx's workers, in its shard, say it ignores negative_prompt"
    assert (await api.http.post("/v1/requests", json={"prompt": "a", "model": "sd", "negative_prompt": "b"})).is_success


async def test_the_fleet_view_and_metrics_sum_the_shards(api: Api) -> None:
    await announce(api, HOME_KEYS, "w-home", SD)
    await announce(api, FAST_KEYS, "w-fast", FX)
    await submit(api, "fx")
    await submit(api, "fx")
    done = await submit(api, "sd")
    await finish(api, HOME_KEYS, done)
    fleet = (await api.http.get("/v1/fleet")).json()
    assert fleet["queue_depth"] == 3 and fleet["requests_accepted"] == 3
    assert fleet["requests_finished"]["succeeded"] == 1
    assert sorted(worker["name"] for worker in fleet["workers"]) == ["w-fast", "w-home"]
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families((await api.http.get("/metrics")).text)
        for sample in family.samples
    }
    assert samples["fusefleet_up"] == 1 and samples["fusefleet_queue_depth"] == 3
    assert samples["fusefleet_workers_live"] == 2 and samples["fusefleet_api_requests_submitted_total"] == 3
    api.server.connected = False
    try:
        assert (await api.http.get("/v1/fleet")).status_code == 503
    finally:
        api.server.connected = True


def test_snapshots_merge_by_summing_counts_and_joining_workers() -> None:
    one = FleetSnapshot(
        2, 1.5, 1, (WorkerState("a", 0.1, True, None),), ("b1",),
        FleetCounters(accepted=3, batch_sizes={1: 2}, forwards={1: (2, 0.5)}, images=2), 4, 10,
    )  # fmt: skip
    two = FleetSnapshot(
        1, 3.0, 2, (WorkerState("b", 0.2, True, None),), ("b2", "b3"),
        FleetCounters(accepted=1, batch_sizes={1: 1, 4: 1}, forwards={1: (1, 0.25), 4: (1, 1.0)}, images=5), 1, 0,
    )  # fmt: skip
    merged = merge_snapshots([one, two])
    assert (merged.queue_depth, merged.oldest_waiting_s, merged.batches_in_flight) == (3, 3.0, 3)
    assert [worker.name for worker in merged.workers] == ["a", "b"] and merged.busy_batches == ("b1", "b2", "b3")
    assert (merged.recent_images, merged.input_bytes) == (5, 10)
    counters = merged.counters
    assert (counters.accepted, counters.images, counters.batch_sizes) == (4, 7, {1: 3, 4: 1})
    assert counters.forwards == {1: (3, 0.75), 4: (1, 1.0)}
    assert counters.finished == FleetCounters().finished, "zeros stay zeros"


async def test_video_jobs_of_two_shards_page_as_one_list(tmp_path: Path) -> None:
    settings = unit_settings(tmp_path, models=MODELS, model_shards="fx=fast")
    async for api in api_harness(settings):
        store: ShardedStore = api.app.state.store
        ids = []
        for i, model in enumerate(["sd", "fx", "fx", "sd", "fx"]):
            request_id = await submit(api, model)
            state = await store.get(request_id)
            assert state is not None
            await store.add_video(request_id, 1000.0 + i, None)  # created a second apart, in this order
            ids.append((1000.0 + i, request_id))
        for created, request_id in ids:  # the creation the lists' scores say
            key = (HOME_KEYS if request_id[:MARK_DIGITS] == shard_mark("") else FAST_KEYS).request(request_id)
            spec = json.loads(str(await api.redis.hget(key, "spec")))
            spec["created_at"] = created
            await api.redis.hset(key, "spec", json.dumps(spec))
        order = [request_id for _, request_id in ids]
        for newest_first, expected in ((False, order), (True, order[::-1])):
            seen: list[str] = []
            after = None
            while True:
                page = await store.video_page(None, after, 2, newest_first)
                assert page is not None
                states, more = page
                seen += [state.spec.id for state in states]
                if not more:
                    break
                after = seen[-1]
            assert seen == expected, newest_first
        assert await store.video_page(None, foreign_id(store.shards), 2, True) is None


async def test_a_client_of_the_http_api_sees_one_fleet(api: Api) -> None:
    """A request of each shard, interleaved, through the same routes any client uses."""
    ids = [await submit(api, model) for model in ("fx", "sd", "fx", "pa")]
    for request_id in ids:
        keys = FAST_KEYS if request_id[:MARK_DIGITS] == shard_mark("fast") else HOME_KEYS
        await finish(api, keys, request_id)
    views = [(await api.http.get(f"/v1/requests/{request_id}")).json() for request_id in ids]
    assert [view["status"] for view in views] == ["succeeded"] * 4
    assert [view["params"]["model"] for view in views] == ["fx", "sd", "fx", "pa"]


async def post_as(api: Api, name: str, model: str) -> httpx.Response:
    body = {"prompt": "a fox", "model": model}
    return await api.http.post("/v1/requests", json=body, headers={"Authorization": f"Bearer ff_{name}"})


async def test_a_keys_rate_bucket_is_the_fleets_and_its_max_queued_holds_per_shard(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    keys = [
        ApiKey(name="carol", sha256=token_hash("ff_carol"), rate_per_s=0.001, burst=3),
        ApiKey(name="dave", sha256=token_hash("ff_dave"), max_queued=1),
    ]
    path.write_text("".join(key_table(key) for key in keys))
    settings = unit_settings(tmp_path, models=MODELS, model_shards="fx=fast", api_keys_file=path)
    async for api in api_harness(settings):
        answers = [(await post_as(api, "carol", model)).status_code for model in ("sd", "fx", "sd", "fx")]
        assert answers == [202, 202, 202, 429], "one bucket of 3 for both shards"
        assert await api.redis.exists(HOME_KEYS.api_key_bucket("carol"))
        assert not await api.redis.exists(FAST_KEYS.api_key_bucket("carol"))
        answers = [(await post_as(api, "dave", model)).status_code for model in ("sd", "fx", "sd", "fx")]
        assert answers == [202, 202, 429, 429], "one unfinished request per shard"
        daves = (await post_as(api, "dave", "pa")).status_code
        assert daves == 429, "pa is home, where dave has one"
        fast = [key.split(":")[-1] async for key in api.redis.scan_iter(FAST_KEYS.request("*"))]
        owners = {i: await api.redis.hget(FAST_KEYS.request(i), "key") for i in fast if len(i) == 2 * ID_BYTES}
        daves_fast = next(request_id for request_id, owner in owners.items() if owner == "dave")
        other = await api.http.get(f"/v1/requests/{daves_fast}", headers={"Authorization": "Bearer ff_carol"})
        assert other.status_code == 404, "another key's request, in any shard, is an unknown one"


# --- a model of several shards ---------------------------------------------------------------------------------------

FX_A, FX_B = RedisKeys("t:fx-a"), RedisKeys("t:fx-b")  # fx is in two shards; sd and pa stay home


@pytest.fixture
async def spread_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    monkeypatch.setattr("api.store.CAPABILITIES_TTL_S", 0.0)
    async for harness in api_harness(
        unit_settings(tmp_path, models=MODELS, model_shards="fx=fx-a|fx-b", max_queue_len=64)
    ):
        yield harness


def keys_of(request_id: str) -> RedisKeys:
    return {shard_mark("fx-a"): FX_A, shard_mark("fx-b"): FX_B, shard_mark(""): HOME_KEYS}[request_id[:MARK_DIGITS]]


async def test_a_models_submissions_land_in_each_of_its_shards_and_reads_follow_the_id(spread_api: Api) -> None:
    api = spread_api
    ids = [await submit(api, "fx") for _ in range(40)]  # all in one shard: twice in 2**40
    assert {keys_of(request_id) for request_id in ids} == {FX_A, FX_B}
    for request_id in ids:
        others = {FX_A, FX_B, HOME_KEYS} - {keys_of(request_id)}
        assert await api.redis.exists(keys_of(request_id).request(request_id))
        assert not any([await api.redis.exists(keys.request(request_id)) for keys in others])
    depths = [await api.redis.xlen(keys.requests) for keys in (FX_A, FX_B, HOME_KEYS)]
    assert depths[0] + depths[1] == 40 and depths[2] == 0
    first_a = next(request_id for request_id in ids if keys_of(request_id) == FX_A)
    first_b = next(request_id for request_id in ids if keys_of(request_id) == FX_B)
    await finish(api, FX_B, first_b)
    await finish(api, FX_A, first_a, "failed")
    assert (await api.http.get(f"/v1/requests/{first_b}")).json()["status"] == "succeeded"
    assert (await api.http.get(f"/v1/requests/{first_a}")).json()["status"] == "failed"
    image = await api.http.get(f"/v1/requests/{first_b}/images/0")
    assert (image.status_code, image.content) == (200, PNG)
    assert (await api.http.post(f"/v1/requests/{ids[-1]}/abort")).json()["status"] == "aborted"
    assert await api.redis.hget(keys_of(ids[-1]).request(ids[-1]), "status") == "aborted", "in its own shard"


async def test_a_batch_of_one_model_of_several_shards_queues_a_part_in_each(spread_api: Api) -> None:
    rows = [{"prompt": f"p{i}", "model": "fx"} for i in range(24)] + [{"prompt": "home", "model": "sd"}]
    response = await spread_api.http.post("/v1/requests/batch", json={"requests": rows})
    assert response.status_code == 202, response.text
    ids = response.json()["ids"]
    assert {keys_of(request_id) for request_id in ids[:-1]} == {FX_A, FX_B} and keys_of(ids[-1]) == HOME_KEYS
    depths = [await spread_api.redis.xlen(keys.requests) for keys in (FX_A, FX_B, HOME_KEYS)]
    assert (depths[0] + depths[1], depths[2]) == (24, 1)
    views = [(await spread_api.http.get(f"/v1/requests/{request_id}")).json() for request_id in ids]
    assert [view["params"]["prompt"] for view in views] == [row["prompt"] for row in rows], "in the rows' order"


async def test_a_model_of_several_shards_is_listed_once_with_the_workers_of_all(spread_api: Api) -> None:
    await announce(spread_api, HOME_KEYS, "w-home", SD)
    await announce(spread_api, FX_A, "w-a", FX)
    await announce(spread_api, FX_B, "w-b1", FX)
    await announce(spread_api, FX_B, "w-b2", FX)
    models = (await spread_api.http.get("/v1/models")).json()["data"]
    assert [(model["id"], model["workers"]) for model in models] == [("sd", 1), ("fx", 3)]
    assert (await spread_api.http.get("/v1/models/fx")).json()["workers"] == 3


class RecordingReader:
    """One shard's fleet reader: a snapshot holding ``busy`` batches of ``size`` requests, each asked id recorded."""

    def __init__(self, busy: tuple[str, ...], size: int = 2) -> None:
        self.busy, self.size, self.asked = busy, size, list[tuple[str, ...]]()

    async def read(self) -> FleetSnapshot:
        return FleetSnapshot(0, 0.0, len(self.busy), busy_batches=self.busy)

    async def running(self, batch_ids: tuple[str, ...]) -> list[RunningBatch]:
        self.asked.append(batch_ids)
        return [
            RunningBatch(b, self.size if b in self.busy else 0, "w" if b in self.busy else None, 1, 4)
            for b in batch_ids
        ]


async def test_a_sharded_fleet_asks_each_busy_batch_of_its_own_shard_alone() -> None:
    home, fast = RecordingReader(("h1", "h2")), RecordingReader(("f1",), size=3)
    fleet = ShardedFleet([home, fast])
    snapshot = await fleet.read()
    assert snapshot is not None and set(snapshot.busy_batches) == {"h1", "h2", "f1"}
    running = await fleet.running(("f1", "h1", "h2"))
    assert [(b.batch_id, b.size, b.worker) for b in running] == [("f1", 3, "w"), ("h1", 2, "w"), ("h2", 2, "w")]
    assert home.asked == [("h1", "h2")] and fast.asked == [("f1",)]
    # a batch the last read did not find (it started since) is asked of every shard; its holder answers
    home.busy = ("h1", "h3")
    running = await fleet.running(("h3",))
    assert [(b.batch_id, b.size) for b in running] == [("h3", 2)]
    assert home.asked[-1] == ("h3",) and fast.asked[-1] == ("h3",)


async def test_concurrent_reads_of_requests_in_several_shards_share_one_pipeline(api: Api) -> None:
    await announce(api, HOME_KEYS, "w1", SD)
    await announce(api, FAST_KEYS, "w2", FX)
    ids = [await submit(api, "sd"), await submit(api, "fx"), await submit(api, "sd"), await submit(api, "fx")]
    stores = api.app.state.store.stores
    reads = stores["fast"]._reads
    assert all(store._reads is reads for store in stores.values())  # one for every shard
    before = reads.flushes
    replies = await asyncio.gather(*(api.http.get(f"/v1/requests/{rid}") for rid in ids))
    assert [reply.json()["id"] for reply in replies] == ids
    assert reads.flushes - before < len(ids)


async def test_concurrent_submissions_to_several_shards_share_one_pipeline_and_each_shard_refuses_its_own(
    api: Api,
) -> None:
    await announce(api, HOME_KEYS, "w1", SD)
    await announce(api, FAST_KEYS, "w2", FX)
    submissions = api.app.state.store.stores["fast"]._submissions
    assert all(store._submissions is submissions for store in api.app.state.store.stores.values())

    async def post(model: str) -> Any:
        return await api.http.post("/v1/requests", json={"prompt": "a fox", "model": model})

    before = submissions.flushes
    replies = await asyncio.gather(*(post(model) for model in ("sd", "fx") * 4))
    assert [reply.status_code for reply in replies] == [202] * 8
    assert submissions.flushes - before < len(replies)
    assert (await api.redis.xlen(HOME_KEYS.requests), await api.redis.xlen(FAST_KEYS.requests)) == (4, 4)
    # each shard's queue holds 5 (max_queue_len): the fast one has room for one more, home for one too
    replies = await asyncio.gather(*(post(model) for model in ("fx", "fx", "fx", "sd")))
    assert sorted(reply.status_code for reply in replies[:3]) == [202, 503, 503] and replies[3].status_code == 202
    assert (await api.redis.xlen(HOME_KEYS.requests), await api.redis.xlen(FAST_KEYS.requests)) == (5, 5)
