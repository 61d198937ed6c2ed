"""Event-stream caps on a real api process (real Redis, ``fusefleet api`` with API keys; no scheduler, so requests
stay queued and their streams stay open): one key at its ``max_event_streams_per_key`` gets 429 with Retry-After
while another key still gets a stream, concurrent opens never pass either cap, and a stream the client drops gives
its place back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from shared.api_keys import ApiKey, key_table, token_hash
from tests.support.fleet import base_env, new_prefix
from tests.support.processes import Service, api_up, wait_for
from tests.support.redis_server import RedisServer, free_port

NAMES = ("alice", "bob", "carol")
PER_KEY = 3
TOTAL = 6


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer ff_{name}"}


@pytest.fixture
def base_url(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("event-slots")
    keys_file = folder / "keys.toml"
    keys_file.write_text("".join(key_table(ApiKey(name=name, sha256=token_hash(f"ff_{name}"))) for name in NAMES))
    env = {
        **base_env(redis_server.url, new_prefix("slots")),
        "FUSEFLEET_API_KEYS_FILE": str(keys_file),
        "FUSEFLEET_MAX_EVENT_STREAMS": str(TOTAL),
        "FUSEFLEET_MAX_EVENT_STREAMS_PER_KEY": str(PER_KEY),
        "FUSEFLEET_EVENT_PING_S": "0.5",
    }
    port = free_port()
    api = Service.fusefleet("api", ["api", "--port", str(port)], env, folder).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: api_up(url, timeout=5), 60, f"the api (log: {api.log_path})")
        yield url
    finally:
        api.stop()


def _submit(base_url: str, name: str) -> str:
    response = httpx.post(f"{base_url}/v1/requests", json={"prompt": "a cat"}, headers=auth(name), timeout=10)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def _open(http: httpx.AsyncClient, name: str, request_id: str) -> httpx.Response:
    """A stream of ``request_id`` opened with ``name``'s key: its response, the body left unread (open)."""
    request = http.build_request("GET", f"/v1/requests/{request_id}/events", headers=auth(name))
    return await http.send(request, stream=True)


async def _open_many(base_url: str, wanted: dict[str, int]) -> tuple[httpx.AsyncClient, list[httpx.Response]]:
    """``wanted[name]`` streams per key, all opened at once (one connection each)."""
    ids = {name: _submit(base_url, name) for name in wanted}
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=0)
    http = httpx.AsyncClient(base_url=base_url, timeout=20, limits=limits)
    opens = [_open(http, name, ids[name]) for name, count in wanted.items() for _ in range(count)]
    return http, list(await asyncio.gather(*opens))


async def _close(http: httpx.AsyncClient, responses: list[httpx.Response]) -> None:
    for response in responses:
        await response.aclose()
    await http.aclose()


def _accepted(responses: list[httpx.Response], name: str | None = None) -> list[httpx.Response]:
    return [
        response
        for response in responses
        if response.status_code == 200
        and (name is None or response.request.headers["authorization"] == auth(name)["Authorization"])
    ]


@pytest.mark.anyio
async def test_a_key_at_its_cap_gets_429_while_another_key_still_gets_a_stream(base_url: str) -> None:
    http, alices = await _open_many(base_url, {"alice": 8})  # 8 at once: the count is atomic, 3 get in
    try:
        assert len(_accepted(alices)) == PER_KEY, [response.status_code for response in alices]
        for refused in [response for response in alices if response.status_code != 200]:
            assert refused.status_code == 429
            await refused.aread()
            assert int(refused.headers["Retry-After"]) > 0
            assert "max_event_streams_per_key" in refused.json()["detail"]
            assert "'alice'" in refused.json()["detail"]
        bobs = await _open(http, "bob", _submit(base_url, "bob"))
        assert bobs.status_code == 200  # another key still gets one
        await bobs.aclose()
        # a stream the client drops gives its place back: alice gets one again
        await alices[[response.status_code for response in alices].index(200)].aclose()
        deadline = time.monotonic() + 10
        again = await _open(http, "alice", _submit(base_url, "alice"))
        while again.status_code == 429 and time.monotonic() < deadline:
            await again.aclose()
            await asyncio.sleep(0.1)
            again = await _open(http, "alice", _submit(base_url, "alice"))
        assert again.status_code == 200
        alices.append(again)
    finally:
        await _close(http, alices)


@pytest.mark.anyio
async def test_concurrent_opens_never_pass_the_process_cap(base_url: str) -> None:
    http, responses = await _open_many(base_url, dict.fromkeys(NAMES, 4))  # 12 at once, 3 keys x 3 > 6
    try:
        codes = sorted(response.status_code for response in responses)
        assert codes.count(200) == TOTAL, codes
        assert all(len(_accepted(responses, name)) <= PER_KEY for name in NAMES)
        for refused in [response for response in responses if response.status_code != 200]:
            await refused.aread()
            assert refused.status_code in (429, 503) and int(refused.headers["Retry-After"]) > 0
        assert any("max_event_streams)" in response.text for response in responses if response.status_code == 503)
    finally:
        await _close(http, responses)
