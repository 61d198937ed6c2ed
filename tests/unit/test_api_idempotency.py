"""``Idempotency-Key`` at the api (fakeredis, the real Lua): a submission sent again with the same key and body is
answered with the first one's ids and queued once; another body is a 422 naming the header; a refused submission
frees its key; a claim still being submitted is a 409 with Retry-After, and one whose api died is settled by what
was queued (``api.idempotency``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.idempotency import HEADER, PENDING_S, REPLAYED_HEADER, fingerprint, record_digest
from fusefleet.client import AsyncClient
from gpu_worker.families import FAMILIES
from shared.api_keys import ApiKey, key_table, token_hash
from shared.settings import Settings
from shared.wire import GenerateRequest
from tests.support.api import Api, api_harness, unit_settings
from tests.unit.test_api_capabilities import announce
from tests.unit.test_openai_api import GENERATIONS, call_while_finishing, queued_ids

pytestmark = pytest.mark.anyio

BODY = {"prompt": "a cat", "seed": 7}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return unit_settings(tmp_path)


async def post(api: Api, key: str | None, body: dict[str, Any] = BODY, path: str = "/v1/requests") -> httpx.Response:
    return await api.http.post(path, json=body, headers={HEADER: key} if key is not None else {})


async def test_the_same_key_and_body_answer_the_first_id_and_queue_once(api: Api) -> None:
    first = await post(api, "order-1")
    again = await post(api, "order-1")
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    assert again.json()["id"] == first.json()["id"]
    assert REPLAYED_HEADER not in first.headers and again.headers[REPLAYED_HEADER] == "true"
    assert await api.redis.xlen(api.keys.requests) == 1
    other = await post(api, "order-2")  # another key: another request
    unkeyed = await post(api, None)
    assert len({first.json()["id"], other.json()["id"], unkeyed.json()["id"]}) == 3
    assert await api.redis.xlen(api.keys.requests) == 3


async def test_a_batch_is_replayed_whole_in_its_order(api: Api) -> None:
    batch = {"requests": [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}]}
    first = await post(api, "batch-1", batch, "/v1/requests/batch")
    again = await post(api, "batch-1", batch, "/v1/requests/batch")
    assert first.status_code == again.status_code == 202
    assert again.json()["ids"] == first.json()["ids"] and len(first.json()["ids"]) == 3
    assert await api.redis.xlen(api.keys.requests) == 3


async def test_the_same_key_with_another_body_is_a_422_naming_the_header(api: Api) -> None:
    assert (await post(api, "order-1")).status_code == 202
    response = await post(api, "order-1", {**BODY, "prompt": "a dog"})
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["header", HEADER] and "another request body" in error["msg"]
    assert await api.redis.xlen(api.keys.requests) == 1


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there"])
async def test_a_bad_key_is_a_422_naming_the_header(api: Api, key: str) -> None:
    response = await api.http.post(
        "/v1/requests", json=BODY, headers=httpx.Headers({HEADER: key.encode("utf-8")})  # type: ignore[dict-item]
    )
    assert response.status_code == 422, response.text
    assert [error["loc"] for error in response.json()["detail"]] == [["header", HEADER]]
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_a_refused_submission_frees_its_key(tmp_path: Path) -> None:
    async for api in api_harness(unit_settings(tmp_path, max_queue_len=1)):
        assert (await post(api, None)).status_code == 202  # the queue is full now
        refused = await post(api, "order-1")
        assert refused.status_code == 503, refused.text
        assert not await api.redis.keys(f"{api.keys.tag}:idem:*")
        await api.redis.delete(api.keys.requests)  # room again
        retried = await post(api, "order-1")
        assert retried.status_code == 202 and REPLAYED_HEADER not in retried.headers


async def claim_by_a_dead_call(api: Api, key: str, ids: list[str], *, age_s: float) -> None:
    """The record a call left that claimed ``key`` for ``ids`` ``age_s`` ago and never settled it (its api died)."""
    digest = record_digest(None, key)
    at_ms = int((time.time() - age_s) * 1000)
    record = {"fingerprint": fingerprint([GenerateRequest.model_validate(BODY)]), "ids": " ".join(ids)}
    await api.redis.hset(api.keys.idempotency(digest), mapping={**record, "state": "pending", "at": at_ms})


async def test_a_key_being_submitted_is_a_409_with_retry_after(api: Api) -> None:
    await claim_by_a_dead_call(api, "order-1", ["0" * 32], age_s=1)
    response = await post(api, "order-1")
    assert response.status_code == 409, response.text
    assert 1 <= int(response.headers["Retry-After"]) <= PENDING_S
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_a_dead_calls_claim_is_taken_over_when_nothing_was_queued(api: Api) -> None:
    await claim_by_a_dead_call(api, "order-1", ["0" * 32], age_s=PENDING_S + 1)
    response = await post(api, "order-1")
    assert response.status_code == 202 and REPLAYED_HEADER not in response.headers
    again = await post(api, "order-1")  # the record is this call's now, done
    assert again.json()["id"] == response.json()["id"] and again.headers[REPLAYED_HEADER] == "true"
    assert await api.redis.xlen(api.keys.requests) == 1


async def test_a_dead_calls_claim_whose_requests_were_queued_is_replayed(api: Api) -> None:
    queued = (await post(api, None)).json()["id"]  # what the dead call had queued before it died
    await claim_by_a_dead_call(api, "order-1", [queued], age_s=PENDING_S + 1)
    response = await post(api, "order-1")
    assert response.status_code == 202 and response.json()["id"] == queued
    assert response.headers[REPLAYED_HEADER] == "true"
    assert await api.redis.hget(api.keys.idempotency(record_digest(None, "order-1")), "state") == "done"
    assert await api.redis.xlen(api.keys.requests) == 1


async def test_replayed_requests_that_are_gone_are_a_409(api: Api) -> None:
    first = (await post(api, "order-1")).json()["id"]
    assert (await api.http.post(f"/v1/requests/{first}/abort")).status_code == 200  # queued: aborted at once
    assert (await api.http.delete(f"/v1/requests/{first}")).status_code == 204
    response = await post(api, "order-1")
    assert response.status_code == 409 and "use a new key" in response.json()["detail"]


async def test_openai_generations_take_the_key(api: Api) -> None:
    async def send() -> httpx.Response:
        return await api.http.post(GENERATIONS, json={"prompt": "a cat"}, headers={HEADER: "img-1"})

    first = await call_while_finishing(api, send)
    assert first.status_code == 200, first.text
    again = await send()  # answered from the first request, which has ended
    assert again.status_code == 200 and again.headers[REPLAYED_HEADER] == "true"
    assert again.headers["x-request-id"] == first.headers["x-request-id"]
    assert again.json()["data"] == first.json()["data"]
    assert await api.redis.xlen(api.keys.requests) == 1


class LosesFirstAnswer(httpx.AsyncBaseTransport):
    """The api's own transport, except that the first submission's answer is lost once the api handled it (the
    connection reset after the request was sent): what a client retries."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.keys: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST":
            self.keys.append(request.headers.get(HEADER))
            if len(self.keys) == 1:
                await response.aclose()
                raise httpx.ReadError("connection reset by peer", request=request)
        return response


async def test_the_client_retries_a_lost_answer_under_one_key_and_is_queued_once(api: Api) -> None:
    transport = LosesFirstAnswer(httpx.ASGITransport(app=api.app))
    async with AsyncClient("http://api", transport=transport, submit_retries=1, max_retry_wait_s=0) as client:
        request_id = await client.submit("a cat")
    assert len(transport.keys) == 2 and transport.keys[0] and transport.keys[0] == transport.keys[1]
    assert await queued_ids(api) == [request_id]  # the retry was answered with the first try's id


async def test_a_claim_retried_after_its_reply_was_lost_is_still_the_callers(api: Api) -> None:
    """redis-py may send a script again when its reply was lost: the claim it finds is its own (same ids)."""
    store = api.app.state.store
    digest, ids = record_digest(None, "order-1"), ("a" * 32,)
    first = await store.claim_idempotency(digest, "print", ids, 60, 30_000)
    again = await store.claim_idempotency(digest, "print", ids, 60, 30_000)
    other = await store.claim_idempotency(digest, "print", ("b" * 32,), 60, 30_000)
    assert (first.state, again.state, other.state) == ("claimed", "claimed", "pending")


async def test_keys_are_per_api_key_and_never_answer_another_callers_requests(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text("".join(key_table(ApiKey(name=name, sha256=token_hash(f"ff_{name}"))) for name in ("ann", "ben")))
    async for api in api_harness(unit_settings(tmp_path, api_keys_file=path)):

        async def as_caller(
            name: str, body: dict[str, Any] = BODY, http: httpx.AsyncClient = api.http
        ) -> httpx.Response:
            headers = {HEADER: "shared-key", "Authorization": f"Bearer ff_{name}"}
            return await http.post("/v1/requests", json=body, headers=headers)

        ann, ben = await as_caller("ann"), await as_caller("ben")
        assert ann.status_code == ben.status_code == 202
        assert ann.json()["id"] != ben.json()["id"] and REPLAYED_HEADER not in ben.headers
        other = await as_caller("ben", {**BODY, "prompt": "a dog"})  # ben's key is bound to ben's body, not ann's
        assert other.status_code == 422
        assert (await as_caller("ann")).json()["id"] == ann.json()["id"]
        assert await api.redis.xlen(api.keys.requests) == 2


async def test_a_take_retried_after_its_reply_was_lost_still_holds(api: Api) -> None:
    store = api.app.state.store
    digest = record_digest(None, "order-1")
    assert (await store.claim_idempotency(digest, "print", ("old",), 60, 0)).state == "claimed"
    assert (await store.claim_idempotency(digest, "print", ("new",), 60, 0)).state == "stale"
    assert await store.settle_idempotency(digest, ("old",), "take", ("new",), 60)
    assert await store.settle_idempotency(digest, ("old",), "take", ("new",), 60)  # the same take, sent again
    assert not await store.settle_idempotency(digest, ("old",), "take", ("third",), 60)  # another's: refused
    assert await store.settle_idempotency(digest, ("new",), "done")
    assert not await store.settle_idempotency(digest, ("new",), "take", ("third",), 60)  # done: not stale


async def test_a_refusal_for_the_rate_frees_the_key_and_a_replay_spends_no_tokens(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(key_table(ApiKey(name="cat", sha256=token_hash("ff_cat"), rate_per_s=0.001, burst=1)))
    async for api in api_harness(unit_settings(tmp_path, api_keys_file=path)):
        headers = {"Authorization": "Bearer ff_cat"}
        first = await api.http.post("/v1/requests", json=BODY, headers={**headers, HEADER: "k1"})
        again = await api.http.post("/v1/requests", json=BODY, headers={**headers, HEADER: "k1"})
        assert first.status_code == again.status_code == 202 and again.headers[REPLAYED_HEADER] == "true"
        limited = await api.http.post("/v1/requests", json=BODY, headers={**headers, HEADER: "k2"})
        assert limited.status_code == 429
        assert not await api.redis.exists(api.keys.idempotency(record_digest("cat", "k2")))


async def test_a_replay_answers_even_when_the_fleet_would_refuse_the_body_now(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record is looked up before what the fleet's workers decide: a queued submission is answered after
    they changed (here a worker of another family, which refuses the body's width, joined)."""
    monkeypatch.setattr("api.store.CAPABILITIES_TTL_S", 0.0)  # each call reads what the workers announce
    first = await post(api, "order-1", {**BODY, "width": 72})
    assert first.status_code == 202
    await announce(api, "w1", FAMILIES["flux"].traits, "FluxPipeline")  # 72 is no multiple of 16
    assert (await post(api, None, {**BODY, "width": 72})).status_code == 422
    again = await post(api, "order-1", {**BODY, "width": 72})
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"]
    refused = await post(api, "order-2", {**BODY, "width": 72})  # a first call: refused, and its key freed
    assert refused.status_code == 422
    assert not await api.redis.exists(api.keys.idempotency(record_digest(None, "order-2")))
