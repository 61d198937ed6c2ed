"""Input images in Redis: stored compactly, counted against ``max_queued_input_bytes``, freed by every ending.

On fakeredis with the real Lua scripts: the api stores an input of the request's size as the client sent it (the
worker decodes it to the same pixels); a submission past the budget is a 429 with Retry-After (413 when it alone
exceeds the budget) naming the field, and queues nothing; each script that ends a request gives its bytes back,
exactly once, on every path (aborted, failed, succeeded, timed out, lost, unreadable).
"""

from __future__ import annotations

import base64
import io
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import fakeredis
import pytest
from PIL import Image

from api.input_budget import BUDGET_FULL, TOO_LARGE, budget_full, stored_bytes, too_large
from api.input_images import StoredInputs, normalise
from api.openai.errors import as_openai_error
from gpu_worker.executor import decode_inputs
from gpu_worker.store import Claimed, WorkerStore
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared.contracts import BatchMessage, ErrorInfo, RequestSpec, RequestStatus, Task
from shared.keys import ABORT, abort_keys
from tests.support.api import Api, api_harness, unit_settings
from tests.unit.test_api_metrics import _scrape

pytestmark = pytest.mark.anyio

SIDE = 64
LUA = Path(__file__).resolve().parents[2] / "shared" / "lua"


def photo(seed: int, side: int = SIDE) -> Image.Image:
    """Noise over a gradient: what PNG inflates and JPEG does not."""
    gradient = Image.linear_gradient("L").resize((side, side)).convert("RGB")
    noise = Image.frombytes("RGB", (side, side), random.Random(seed).randbytes(side * side * 3))
    return Image.blend(gradient, noise, 0.3)


def encoded(image: Image.Image, format: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return buffer.getvalue()


JPEG = encoded(photo(1), "JPEG")
BUDGET = 2 * len(JPEG) + len(JPEG) // 2  # two of these inputs fit, a third does not


# --- compact storage ----------------------------------------------------------------------------------------------
def test_an_input_of_the_request_size_is_stored_as_sent_and_the_worker_gets_the_same_pixels(tmp_path: Path) -> None:
    settings = unit_settings(tmp_path)
    stored = normalise(JPEG, SIDE, SIDE, mask=False, settings=settings)
    assert stored == JPEG  # not a PNG several times its size
    mask = normalise(encoded(Image.new("RGB", (SIDE, SIDE), "white"), "PNG"), SIDE, SIDE, mask=True, settings=settings)
    spec = RequestSpec(
        id="r",
        model="demo",
        prompt="p",
        seed=1,
        width=SIDE,
        height=SIDE,
        num_inference_steps=4,
        guidance_scale=5.0,
        task=Task.INPAINT,
        strength=0.5,
        created_at=0.0,
    )
    inputs = decode_inputs(spec, stored, mask)
    expected = Image.open(io.BytesIO(JPEG)).convert("RGB")
    assert inputs.image.tobytes() == expected.tobytes()  # what the api checked is what the worker runs with
    assert inputs.mask is not None and (inputs.mask.mode, inputs.mask.getextrema()) == ("L", (255, 255))


def test_an_input_of_another_size_is_stored_resized_as_png(tmp_path: Path) -> None:
    stored = normalise(encoded(photo(2, 128), "JPEG"), SIDE, SIDE, mask=False, settings=unit_settings(tmp_path))
    with Image.open(io.BytesIO(stored)) as image:
        assert (image.format, image.size) == ("PNG", (SIDE, SIDE))


# --- the pure decisions -------------------------------------------------------------------------------------------
def test_the_refusals_name_the_first_request_with_an_input() -> None:
    inputs = [None, StoredInputs(image=b"x" * 600, mask=b"y" * 500)]
    locs = [("body", "requests", 0), ("body", "requests", 1)]
    assert stored_bytes(inputs) == 1100
    assert too_large(inputs, locs, 1100) is None
    oversized = too_large(inputs, locs, 1099)
    assert oversized is not None and oversized.status_code == 413 and oversized.code == TOO_LARGE
    assert oversized.loc == ("body", "requests", 1, "image")
    full = budget_full(inputs, locs, 2000)
    assert (full.status_code, full.code, full.headers) == (429, BUDGET_FULL, {"Retry-After": "5"})
    openai = as_openai_error(full)
    assert openai is not None and (openai.status_code, openai.param, openai.code) == (
        429,
        "requests.1.image",
        BUDGET_FULL,
    )


# --- through the api, with the real scripts -----------------------------------------------------------------------
@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    settings = unit_settings(tmp_path, max_queued_input_bytes=BUDGET, max_queue_len=50, max_batch_attempts=2)
    async for harness in api_harness(settings):
        yield harness


def body(**extra: object) -> dict[str, object]:
    return {"prompt": "a cat", "width": SIDE, "height": SIDE, "image": base64.b64encode(JPEG).decode(), **extra}


async def submit(api: Api) -> str:
    response = await api.http.post("/v1/requests", json=body())
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def held(api: Api) -> int:
    return int(await api.redis.get(api.keys.input_bytes) or 0)


async def test_past_the_budget_is_429_with_retry_after_and_queues_nothing(api: Api) -> None:
    await submit(api)
    await submit(api)
    assert await held(api) == 2 * len(JPEG)
    response = await api.http.post("/v1/requests", json=body())
    assert response.status_code == 429, response.text
    assert response.headers["Retry-After"] == "5"
    detail = response.json()["detail"]
    assert detail.startswith("body.image: ") and f"max_queued_input_bytes {BUDGET}" in detail, detail
    assert await api.redis.xlen(api.keys.requests) == 2 and await held(api) == 2 * len(JPEG)
    assert (await api.http.post("/v1/requests", json={"prompt": "text only"})).status_code == 202  # no inputs


async def test_the_held_bytes_and_the_refusals_are_in_the_metrics(api: Api) -> None:
    await submit(api)
    aborted = await submit(api)
    assert (await api.http.post("/v1/requests", json=body())).status_code == 429
    await api.http.post(f"/v1/requests/{aborted}/abort")
    samples = await _scrape(api)
    assert samples["fusefleet_queued_input_bytes"] == len(JPEG)
    assert samples["fusefleet_api_requests_refused_total{reason=input_budget}"] == 1


async def test_inputs_alone_over_the_budget_are_413_naming_the_field(api: Api) -> None:
    requests = [{"prompt": "text only"}, body(), body(), body()]  # 3 inputs: more than the whole budget
    response = await api.http.post("/v1/requests/batch", json={"requests": requests})
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert detail.startswith("body.requests.1.image: ") and f"max_queued_input_bytes is {BUDGET}" in detail, detail
    assert await api.redis.xlen(api.keys.requests) == 0 and await held(api) == 0


Ending = Callable[[Api, fakeredis.FakeRedis, str], None]


def _schedule(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    store = SchedulerStore(client, api.settings)
    lease = Lease(client, store.keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    assert store.schedule(lease.key, lease.token, f"B-{rid}", [rid]) == [rid]


def _claim(api: Api, client: fakeredis.FakeRedis, rid: str, token: str = "tok") -> Claimed:
    claimed = WorkerStore(client, api.settings).claim(
        BatchMessage(batch_id=f"B-{rid}", request_ids=(rid,), created_at=0.0), token, "w"
    )
    assert isinstance(claimed, Claimed)
    return claimed


def _run(api: Api, client: fakeredis.FakeRedis, rid: str) -> WorkerStore:
    _schedule(api, client, rid)
    assert _claim(api, client, rid).running == [rid]
    return WorkerStore(client, api.settings)


def abort_script(api: Api, client: fakeredis.FakeRedis, rid: str) -> str:
    """``abort.lua`` as ``POST /v1/requests/{id}/abort`` runs it; the status after it."""
    args = [time.time(), 60, api.keys.finished, rid]
    return str(client.register_script(ABORT)(keys=abort_keys(api.keys, rid), args=args))


def aborted_queued(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    assert abort_script(api, client, rid) == "aborted"


def aborted_scheduled(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    _schedule(api, client, rid)
    assert abort_script(api, client, rid) == "aborted"


def timed_out_queued(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    assert SchedulerStore(client, api.settings).expire([rid]) == ["failed"]


def timed_out_scheduled(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    _schedule(api, client, rid)
    assert SchedulerStore(client, api.settings).expire([rid]) == ["failed"]


def unreadable(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    SchedulerStore(client, api.settings).fail_unreadable(rid, "cannot read it")


def succeeded(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    assert _run(api, client, rid).finish_many({rid: []}, {}, "tok") == {rid: RequestStatus.SUCCEEDED}


def failed(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    error = ErrorInfo(type="ValueError", message="bad")
    assert _run(api, client, rid).finish_many({}, {rid: error}, "tok") == {rid: RequestStatus.FAILED}


def aborted_running(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    worker = _run(api, client, rid)
    assert abort_script(api, client, rid) == "running"  # flagged: the worker ends it
    assert worker.finish_many({rid: []}, {}, "tok") == {rid: RequestStatus.ABORTED}


def timed_out_running(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    worker = _run(api, client, rid)
    assert SchedulerStore(client, api.settings).expire([rid]) == ["aborting"]
    assert worker.finish_aborted({rid: []}, "tok") == {rid: RequestStatus.ABORTED}


def aborted_at_a_later_claim(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    _run(api, client, rid)
    assert abort_script(api, client, rid) == "running"
    client.delete(api.keys.batch_lock(f"B-{rid}"))  # its worker died: claim.lua ends the flagged request
    assert _claim(api, client, rid, "tok2").statuses[rid] is RequestStatus.ABORTED


def lost_every_time(api: Api, client: fakeredis.FakeRedis, rid: str) -> None:
    _schedule(api, client, rid)
    for attempt in range(10):  # its worker dies every time: claim.lua fails it WorkerLost
        claimed = _claim(api, client, rid, f"tok{attempt}")
        if claimed.statuses[rid] is RequestStatus.FAILED:
            break
        client.delete(api.keys.batch_lock(f"B-{rid}"))
    assert client.hget(api.keys.request(rid), "error_type") == "WorkerLost"


ENDINGS: list[Ending] = [
    aborted_queued,
    aborted_scheduled,
    timed_out_queued,
    timed_out_scheduled,
    unreadable,
    succeeded,
    failed,
    aborted_running,
    timed_out_running,
    aborted_at_a_later_claim,
    lost_every_time,
]


@pytest.mark.parametrize("ending", ENDINGS, ids=[ending.__name__ for ending in ENDINGS])
async def test_every_ending_gives_the_bytes_back_once(api: Api, ending: Ending) -> None:
    client = fakeredis.FakeRedis(server=api.server, decode_responses=True)
    kept, ended = await submit(api), await submit(api)
    assert await held(api) == 2 * len(JPEG)
    ending(api, client, ended)
    assert client.hget(api.keys.request(ended), "status") in {"succeeded", "failed", "aborted"}
    assert not client.hexists(api.keys.request(ended), "input_image")
    assert await held(api) == len(JPEG)  # exactly its bytes
    assert abort_script(api, client, ended) in {"succeeded", "failed", "aborted"}  # ending again frees nothing
    assert SchedulerStore(client, api.settings).expire([ended]) != ["aborting"]
    assert await held(api) == len(JPEG)
    assert client.hstrlen(api.keys.request(kept), "input_image") == len(JPEG)
    await submit(api)  # the room it left is free for the next one


@pytest.mark.parametrize("ending", ENDINGS, ids=[ending.__name__ for ending in ENDINGS])
async def test_a_request_queued_before_the_count_takes_nothing_off_when_it_ends(api: Api, ending: Ending) -> None:
    """Upgrading with image requests queued: their bytes were never added (an older submit.lua stored the images
    and no ``input_bytes``), so ending them leaves the count as it is, never below what the others hold."""
    client = fakeredis.FakeRedis(server=api.server, decode_responses=True)
    kept, old = await submit(api), await submit(api)
    client.hdel(api.keys.request(old), "input_bytes")  # as the older submit.lua left it...
    client.decrby(api.keys.input_bytes, len(JPEG))  # ...and its bytes never counted
    assert await held(api) == len(JPEG)
    ending(api, client, old)
    assert not client.hexists(api.keys.request(old), "input_image")  # its images go all the same
    assert await held(api) == len(JPEG)  # the kept request's, not len(JPEG) less (0 today, negative with none)
    assert abort_script(api, client, kept) == "aborted"
    assert await held(api) == 0


def test_only_submit_and_the_drop_library_touch_the_input_fields() -> None:
    """Structural: the count stays exact only while every script that removes inputs goes through drop_inputs."""
    for field in ("'input_image'", "'input_bytes'"):
        touching = {path.name for path in LUA.glob("*.lua") if field in path.read_text()}
        assert touching == {"submit.lua", "lib_drop_inputs.lua"}, field
