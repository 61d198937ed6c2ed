"""API keys over HTTP (the app on fakeredis, with a keys file): 401 on every route but /healthz and /metrics in
each API's error shape, isolation between keys (a key cannot see, wait for, fetch, abort or delete another key's
request), a key's rate limit and max queued (429 with Retry-After), and the OpenAI client with ``api_key``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fusefleet.client import ApiError, AsyncClient, NotFound
from shared.api_keys import ApiKey, key_table, token_hash
from shared.settings import Settings
from tests.support.api import Api, api_harness, unit_settings

pytestmark = pytest.mark.anyio

KEYS = {
    "alice": ApiKey(name="alice", sha256=token_hash("ff_alice")),
    "bob": ApiKey(name="bob", sha256=token_hash("ff_bob")),
    "carol": ApiKey(name="carol", sha256=token_hash("ff_carol"), rate_per_s=0.5, burst=2),
    "dave": ApiKey(name="dave", sha256=token_hash("ff_dave"), max_queued=2),
}
PNG = b"\x89PNG\r\n\x1a\nfake"
GENERATIONS = "/v1/images/generations"


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer ff_{name}"}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    path = tmp_path / "keys.toml"
    path.write_text("".join(key_table(key) for key in KEYS.values()))
    return unit_settings(tmp_path, api_keys_file=path)


async def submit(api: Api, name: str, **body: Any) -> str:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", **body}, headers=auth(name))
    assert response.status_code == 202, response.text
    request_id: str = response.json()["id"]
    return request_id


async def queued(api: Api) -> int:
    return int(await api.redis.xlen(api.keys.requests))


# --- 401 -------------------------------------------------------------------------------------------------------

NATIVE_ROUTES = [
    ("POST", "/v1/requests", {"prompt": "a cat"}),
    ("POST", "/v1/requests/batch", {"requests": [{"prompt": "a cat"}]}),
    ("GET", "/v1/requests/{id}", None),
    ("GET", "/v1/requests/{id}?wait_s=5", None),
    ("GET", "/v1/requests/{id}/images/0", None),
    ("GET", "/v1/requests/{id}/video", None),
    ("GET", "/v1/requests/{id}/videos/0", None),
    ("POST", "/v1/requests/{id}/abort", None),
    ("DELETE", "/v1/requests/{id}", None),
    ("GET", "/v1/requests/{id}/events", None),
    ("GET", "/v1/events?ids={id}", None),
]
OPENAI_ROUTES = [
    ("POST", GENERATIONS, {"prompt": "a cat"}),
    ("POST", "/v1/images/edits", None),
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/demo", None),
]
NO_KEY: dict[str, dict[str, str]] = {
    "no header": {},
    "another scheme": {"Authorization": "Basic ZmZfYWxpY2U6"},
    "empty bearer": {"Authorization": "Bearer "},
}
BAD_KEY: dict[str, dict[str, str]] = {
    "unknown token": {"Authorization": "Bearer ff_mallory"},
    "the hash itself": {"Authorization": f"Bearer {token_hash('ff_alice')}"},
}


async def _call(api: Api, method: str, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    return await api.http.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize("headers", [*NO_KEY.values(), *BAD_KEY.values()], ids=[*NO_KEY, *BAD_KEY])
async def test_every_native_route_needs_a_valid_key(api: Api, headers: dict[str, str]) -> None:
    request_id = await submit(api, "alice")
    missing = "Authorization" not in headers or headers in NO_KEY.values()
    for method, path, body in NATIVE_ROUTES:
        response = await _call(api, method, path.format(id=request_id), body, headers)
        assert response.status_code == 401, (method, path, response.text)
        assert response.json() == {
            "detail": "this api needs an API key: send 'Authorization: Bearer <key>'"
            if missing
            else "invalid API key (unknown, or revoked)"
        }
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert await queued(api) == 1  # alice's only
    assert await api.redis.hget(api.keys.request(request_id), "status") == "queued"  # not aborted


@pytest.mark.parametrize("headers", [*NO_KEY.values(), *BAD_KEY.values()], ids=[*NO_KEY, *BAD_KEY])
async def test_every_openai_route_needs_a_valid_key_in_openais_shape(api: Api, headers: dict[str, str]) -> None:
    code = "missing_api_key" if headers in NO_KEY.values() else "invalid_api_key"
    for method, path, body in OPENAI_ROUTES:
        response = await _call(api, method, path, body, headers)
        assert response.status_code == 401, (method, path, response.text)
        error = response.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, None), path
        assert "API key" in error["message"]
    assert await queued(api) == 0


async def test_a_key_goes_before_validation(api: Api) -> None:
    """A caller without a key learns nothing of the server's limits."""
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", "width": 99999})
    assert response.status_code == 401
    response = await api.http.post(GENERATIONS, json={"prompt": "a cat", "size": "1x1"})
    assert response.status_code == 401


async def test_health_metrics_and_the_schema_need_no_key(api: Api) -> None:
    assert (await api.http.get("/healthz")).json() == {"status": "ok"}
    assert (await api.http.get("/metrics")).status_code == 200
    document = (await api.http.get("/openapi.json")).json()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert ("401" in operation["responses"]) == (path != "/healthz"), (method, path)


async def test_without_a_keys_file_nothing_needs_a_key(tmp_path: Path) -> None:
    async for api in api_harness(unit_settings(tmp_path)):
        submitted = await api.http.post("/v1/requests", json={"prompt": "a cat"}, headers=auth("nobody"))
        request_id = submitted.json()["id"]
        assert (await api.http.get(f"/v1/requests/{request_id}")).status_code == 200
        assert await api.redis.hget(api.keys.request(request_id), "key") is None
        assert (await api.http.get("/v1/models")).status_code == 200
        document = (await api.http.get("/openapi.json")).json()
        assert not any("401" in op["responses"] for item in document["paths"].values() for op in item.values())


# --- isolation -------------------------------------------------------------------------------------------------


async def test_a_key_sees_fetches_aborts_and_deletes_only_its_own_requests(api: Api) -> None:
    mine = await submit(api, "alice")
    batch = await api.http.post(
        "/v1/requests/batch", json={"requests": [{"prompt": "a"}, {"prompt": "b"}]}, headers=auth("alice")
    )
    assert batch.status_code == 202
    running = batch.json()["ids"][0]
    for request_id in (mine, *batch.json()["ids"]):
        assert await api.redis.hget(api.keys.request(request_id), "key") == "alice"
    await api.finish(mine, images=[PNG])

    unknown = "0123456789abcdef0123456789abcdef"
    for method, path, request_id in [
        ("GET", "/v1/requests/{}", mine),
        ("GET", "/v1/requests/{}?wait_s=0.05", running),
        ("GET", "/v1/requests/{}/images/0", mine),
        ("GET", "/v1/requests/{}/video", mine),
        ("POST", "/v1/requests/{}/abort", running),
        ("DELETE", "/v1/requests/{}", mine),
        ("GET", "/v1/requests/{}/events", mine),
        ("GET", "/v1/events?ids={}", mine),
    ]:  # bob gets exactly what an unknown id gets: he cannot even tell that alice's request exists
        response = await api.http.request(method, path.format(request_id), headers=auth("bob"))
        assert response.status_code == 404, (method, path, response.text)
        as_unknown = await api.http.request(method, path.format(unknown), headers=auth("bob"))
        assert response.json()["detail"].replace(request_id, unknown) == as_unknown.json()["detail"]
    assert await api.redis.hget(api.keys.request(running), "status") == "queued"  # bob's abort did nothing
    assert await api.redis.exists(api.keys.request(mine))  # nor his delete

    view = await api.http.get(f"/v1/requests/{mine}", headers=auth("alice"))
    assert view.status_code == 200 and view.json()["status"] == "succeeded"
    image = await api.http.get(f"/v1/requests/{mine}/images/0", headers=auth("alice"))
    assert image.status_code == 200 and image.content == PNG
    events = await api.http.get(f"/v1/requests/{mine}/events", headers=auth("alice"))
    assert events.status_code == 200 and "event: succeeded" in events.text
    aborted = await api.http.post(f"/v1/requests/{running}/abort", headers=auth("alice"))
    assert aborted.json() == {"id": running, "status": "aborted"}
    assert (await api.http.delete(f"/v1/requests/{mine}", headers=auth("alice"))).status_code == 204


async def _request_id_routes(api: Api) -> list[tuple[str, str]]:
    """(method, path with ``{}`` for the id) of every route of the served OpenAPI document whose path takes a request
    id (``{index}`` = 0), and the multi-request stream's ``?ids=``."""
    paths = (await api.http.get("/openapi.json", headers=auth("alice"))).json()["paths"]
    routes = [
        (method.upper(), path.replace("{request_id}", "{}").replace("{index}", "0"))
        for path, operations in paths.items()
        if "{request_id}" in path
        for method in operations
    ]
    assert len(routes) >= 7, routes  # get, image, video, videos, delete, abort, events
    return [*routes, ("GET", "/v1/events?ids={}")]


@pytest.mark.parametrize(
    "malformed",
    [
        "{id}:events",  # the key of the request's event stream: WRONGTYPE (a 503) for the request hash's reads
        "{id}:inputs",
        "..{id}",  # dots (a bare ".." is normalized away by the client)
        "{id}" * 20,  # overly long
        "{ID}",  # upper case: not the shape ids are made in
        "{id}0",
        "%00",
    ],
)
async def test_a_malformed_id_is_an_unknown_one_on_every_route_without_asking_redis(api: Api, malformed: str) -> None:
    mine = await submit(api, "alice")
    bad = malformed.format(id=mine, ID=mine.upper())
    routes = await _request_id_routes(api)
    for name in ("alice", "bob"):  # the owner too: nothing tells that the id is near one of a request
        for method, path in routes:
            response = await api.http.request(method, path.format(bad), headers=auth(name))
            assert response.status_code == 404, (method, path, response.text)
            assert "(unknown or expired)" in response.json()["detail"], (method, path)
    api.server.connected = False  # every Redis call now fails (a 503): a malformed id gets its 404 without one
    for method, path in routes:
        response = await api.http.request(method, path.format(bad), headers=auth("bob"))
        assert response.status_code == 404, (method, path, response.text)
        well_formed = await api.http.request(method, path.format(mine), headers=auth("bob"))
        assert well_formed.status_code == 503, (method, path, well_formed.text)  # this one asks Redis
    api.server.connected = True


async def test_requests_from_before_the_keys_belong_to_no_key(api: Api) -> None:
    """A request submitted while the api had no keys file has no ``key``: no key sees it."""
    request_id = await submit(api, "alice")
    await api.redis.hdel(api.keys.request(request_id), "key")
    for name in KEYS:
        assert (await api.http.get(f"/v1/requests/{request_id}", headers=auth(name))).status_code == 404


# --- limits ----------------------------------------------------------------------------------------------------


async def _refusals(api: Api) -> dict[str, float]:
    text = (await api.http.get("/metrics")).text
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "fusefleet_api_requests_refused_total"
    }


async def test_the_rate_limit_is_a_429_with_retry_after_naming_the_limit(api: Api) -> None:
    await submit(api, "carol")
    await submit(api, "carol")  # the burst of 2
    response = await api.http.post("/v1/requests", json={"prompt": "a cat"}, headers=auth("carol"))
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] in ("1", "2")  # 0.5 requests/s: one more within 2 s
    detail = response.json()["detail"]
    assert "rate limit of API key 'carol'" in detail and "0.5 requests/s, burst 2" in detail
    assert await queued(api) == 2
    await submit(api, "alice")  # other keys are not limited by carol's
    openai_answer = await api.http.post(GENERATIONS, json={"prompt": "a cat"}, headers=auth("carol"))
    assert openai_answer.status_code == 429 and openai_answer.headers["retry-after"]
    assert openai_answer.json()["error"]["code"] == "rate_limit_exceeded"
    assert (await _refusals(api))["rate_limited"] == 2


async def test_a_batch_over_the_burst_is_a_422_naming_requests(api: Api) -> None:
    three = {"requests": [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}]}
    response = await api.http.post("/v1/requests/batch", json=three, headers=auth("carol"))
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "requests"] and "its burst" in error["msg"] and "2" in error["msg"]
    response = await api.http.post("/v1/requests/batch", json=three, headers=auth("dave"))
    assert response.status_code == 422 and "max_queued" in response.json()["detail"][0]["msg"]
    assert await queued(api) == 0
    two = {"requests": [{"prompt": "a"}, {"prompt": "b"}]}
    assert (await api.http.post("/v1/requests/batch", json=two, headers=auth("carol"))).status_code == 202


async def test_max_queued_is_a_429_until_a_request_ends(api: Api) -> None:
    first, second = await submit(api, "dave"), await submit(api, "dave")
    response = await api.http.post("/v1/requests", json={"prompt": "a cat"}, headers=auth("dave"))
    assert response.status_code == 429 and response.headers["retry-after"] == "5"
    assert "max_queued (2)" in response.json()["detail"]
    openai_answer = await api.http.post(GENERATIONS, json={"prompt": "a cat"}, headers=auth("dave"))
    assert openai_answer.status_code == 429 and openai_answer.json()["error"]["code"] == "max_queued_exceeded"
    assert await queued(api) == 2
    await submit(api, "alice")  # other keys are not limited by dave's

    await api.finish(first, images=[PNG])
    await submit(api, "dave")  # finished: no longer counted
    assert (await api.http.post("/v1/requests", json={"prompt": "x"}, headers=auth("dave"))).status_code == 429
    assert (await api.http.post(f"/v1/requests/{second}/abort", headers=auth("dave"))).status_code == 200
    await submit(api, "dave")  # aborted: no longer counted
    assert (await _refusals(api))["max_queued"] == 3


# --- the OpenAI client -----------------------------------------------------------------------------------------


def openai_client(api: Api, api_key: str) -> openai.AsyncOpenAI:
    """The official client on the in-process app (it closes its httpx client when it closes)."""
    transport = api.http._transport
    assert isinstance(transport, httpx.ASGITransport)
    http = httpx.AsyncClient(transport=transport)
    return openai.AsyncOpenAI(base_url="http://api/v1", api_key=api_key, max_retries=0, http_client=http)


async def test_the_openai_client_with_its_api_key(api: Api) -> None:
    async def finish_when_queued() -> None:
        with anyio.fail_after(5):
            while not (entries := await api.redis.xrange(api.keys.requests)):
                await anyio.sleep(0.01)
        await api.finish(entries[0][1]["id"], images=[PNG])

    async with openai_client(api, "ff_alice") as client:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(finish_when_queued)
            raw = await client.images.with_raw_response.generate(prompt="a cat", response_format="url")
        request_id = raw.headers["x-request-id"]
        assert await api.redis.hget(api.keys.request(request_id), "key") == "alice"
        [image] = raw.parse().data or []
        assert image.url is not None
        assert (await api.http.get(image.url, headers=auth("alice"))).content == PNG  # the url needs the key too
        assert (await api.http.get(image.url, headers=auth("bob"))).status_code == 404
        assert (await client.models.retrieve("demo")).id == "demo"  # the key reaches the models routes too

    async with openai_client(api, "ff_mallory") as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            await client.images.generate(prompt="a cat")
        assert refused.value.code == "invalid_api_key"


# --- the Python client -----------------------------------------------------------------------------------------


async def test_the_python_client_sends_its_api_key(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    transport = api.http._transport
    assert isinstance(transport, httpx.ASGITransport)
    async with AsyncClient("http://api", transport=transport, api_key="ff_alice") as client:
        request_id = await client.submit(prompt="a cat")
        assert (await client.get(request_id)).status.value == "queued"
    monkeypatch.setenv("FUSEFLEET_API_KEY", "ff_bob")  # the default
    async with AsyncClient("http://api", transport=transport) as client:
        with pytest.raises(NotFound):
            await client.get(request_id)
    monkeypatch.delenv("FUSEFLEET_API_KEY")
    async with AsyncClient("http://api", transport=transport) as client:
        with pytest.raises(ApiError) as refused:
            await client.get(request_id)
        assert refused.value.status_code == 401 and "API key" in str(refused.value)


async def test_redis_down_during_a_keys_limits_is_a_503(api: Api) -> None:
    api.server.connected = False
    for name in ("carol", "dave"):  # the rate limit script; the counted submit
        response = await api.http.post("/v1/requests", json={"prompt": "a cat"}, headers=auth(name))
        assert response.status_code == 503 and response.headers["retry-after"], response.text
    response = await api.http.get("/v1/requests/0123456789abcdef0123456789abcdef", headers=auth("alice"))
    assert response.status_code == 503
    api.server.connected = True
    await submit(api, "dave")
