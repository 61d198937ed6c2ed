"""API keys on a real fleet (real Redis, api, scheduler and worker with the tiny demo model): each key sees only
its own requests, natively and through the official ``openai`` client with ``api_key``; a key's rate limit and max
queued are enforced by the Lua scripts on a real Redis (429 with Retry-After)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shared.api_keys import ApiKey, key_table, token_hash
from tests.integration.conftest import TERMINAL, Fleet, running_fleet
from tests.support.redis_server import RedisServer

KEYS = [
    ApiKey(name="alice", sha256=token_hash("ff_alice")),
    ApiKey(name="bob", sha256=token_hash("ff_bob")),
    ApiKey(name="carol", sha256=token_hash("ff_carol"), rate_per_s=0.2),  # one request per 5 s, burst 1
    ApiKey(name="dave", sha256=token_hash("ff_dave"), max_queued=1),
]
SMALL = {"width": 64, "height": 64, "num_inference_steps": 4}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer ff_{name}"}


def ended(fleet: Fleet, request_id: str, name: str, timeout: float = 120) -> dict[str, Any]:
    """The request's view once it is terminal, read with ``name``'s key (long polls of 20 s)."""
    deadline = time.monotonic() + timeout
    while True:
        view = fleet.http.get(f"/v1/requests/{request_id}?wait_s=20", headers=auth(name)).json()
        if view["status"] in TERMINAL or time.monotonic() > deadline:
            return dict(view)


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("api-keys")
    keys_file = folder / "keys.toml"
    keys_file.write_text("".join(key_table(key) for key in KEYS))
    with running_fleet(redis_server, model_cache, lora_dir, folder, FUSEFLEET_API_KEYS_FILE=str(keys_file)) as one:
        yield one  # Fleet.start polls /healthz, which needs no key


def test_keys_keep_requests_apart_natively_and_through_openai(fleet: Fleet) -> None:
    http = fleet.http
    assert http.post("/v1/requests", json={"prompt": "a fox", **SMALL}).status_code == 401
    assert http.get("/v1/models", headers=auth("mallory")).status_code == 401
    assert http.get("/metrics").status_code == 200

    submitted = http.post("/v1/requests", json={"prompt": "a fox", **SMALL}, headers=auth("alice"))
    assert submitted.status_code == 202, submitted.text
    request_id = submitted.json()["id"]
    view = ended(fleet, request_id, "alice")
    assert view["status"] == "succeeded", view
    image = http.get(f"/v1/requests/{request_id}/images/0", headers=auth("alice"))
    assert image.status_code == 200 and image.headers["content-type"] == "image/png"
    for method, path in [
        ("GET", f"/v1/requests/{request_id}"),
        ("GET", f"/v1/requests/{request_id}/images/0"),
        ("POST", f"/v1/requests/{request_id}/abort"),
        ("DELETE", f"/v1/requests/{request_id}"),
    ]:
        assert http.request(method, path, headers=auth("bob")).status_code == 404, (method, path)

    with openai.OpenAI(base_url=fleet.base_url + "/v1", api_key="ff_bob", max_retries=0, timeout=120) as client:
        raw = client.images.with_raw_response.generate(prompt="a lighthouse", size="64x64", extra_body={"seed": 3})
        [generated] = raw.parse().data or []
        assert base64.b64decode(generated.b64_json or "").startswith(b"\x89PNG")
        bobs = raw.headers["x-request-id"]
        assert http.get(f"/v1/requests/{bobs}", headers=auth("bob")).json()["status"] == "succeeded"
        assert http.get(f"/v1/requests/{bobs}", headers=auth("alice")).status_code == 404
    with openai.OpenAI(base_url=fleet.base_url + "/v1", api_key="ff_mallory", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            client.images.generate(prompt="a lighthouse", size="64x64")
        assert refused.value.code == "invalid_api_key"


def test_rate_limit_and_max_queued_on_a_real_redis(fleet: Fleet) -> None:
    http = fleet.http
    accepted = http.post("/v1/requests", json={"prompt": "a", **SMALL}, headers=auth("carol"))
    assert accepted.status_code == 202, accepted.text
    http.post(f"/v1/requests/{accepted.json()['id']}/abort", headers=auth("carol"))  # spares the worker
    limited = http.post("/v1/requests", json={"prompt": "b", **SMALL}, headers=auth("carol"))
    assert limited.status_code == 429 and limited.headers["retry-after"] == "5", limited.text
    with openai.OpenAI(base_url=fleet.base_url + "/v1", api_key="ff_carol", max_retries=0) as client:
        with pytest.raises(openai.RateLimitError) as refused:
            client.images.generate(prompt="c", size="64x64")
        assert refused.value.code == "rate_limit_exceeded"

    slow = {"prompt": "slow", "width": 64, "height": 64, "num_inference_steps": 900}  # below the demo scheduler's 999
    first = http.post("/v1/requests", json=slow, headers=auth("dave"))
    assert first.status_code == 202, first.text
    full = http.post("/v1/requests", json={"prompt": "d", **SMALL}, headers=auth("dave"))
    assert full.status_code == 429 and "max_queued (1)" in full.json()["detail"]
    first_id = first.json()["id"]
    assert http.post(f"/v1/requests/{first_id}/abort", headers=auth("dave")).status_code == 200
    aborted = ended(fleet, first_id, "dave")
    assert aborted["status"] == "aborted", aborted
    again = http.post("/v1/requests", json={"prompt": "d", **SMALL}, headers=auth("dave"))
    assert again.status_code == 202, again.text
    assert http.post(f"/v1/requests/{again.json()['id']}/abort", headers=auth("dave")).status_code == 200
    assert httpx.get(f"{fleet.base_url}/healthz").json() == {"status": "ok"}
