"""``priority`` and ``timeout_s`` at the api (fakeredis): stored in the spec, echoed, defaulted from the settings,
bad values a 422 (native) or 400 (OpenAI) naming the field; a Timeout is a 504 on the OpenAI surface."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from shared.contracts import TIMEOUT_ERROR, RequestSpec
from shared.settings import Settings
from tests.support.api import Api, api_harness, unit_settings
from tests.unit.test_openai_api import GENERATIONS, call_while_finishing, openai_error, spec_of, wait_queued

pytestmark = pytest.mark.anyio


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return unit_settings(tmp_path, max_timeout_s=60.0)


async def submitted_spec(api: Api, **body: Any) -> RequestSpec:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", **body})
    assert response.status_code == 202, response.text
    return await spec_of(api, response.json()["id"])


async def test_priority_and_timeout_are_stored_and_echoed(api: Api) -> None:
    spec = await submitted_spec(api, priority=2, timeout_s=7.5)
    assert (spec.priority, spec.timeout_s) == (2, 7.5)
    assert spec.deadline == spec.created_at + 7.5
    params = (await api.http.get(f"/v1/requests/{spec.id}")).json()["params"]
    assert (params["priority"], params["timeout_s"]) == (2, 7.5)
    assert (await submitted_spec(api, priority=-2.0, timeout_s=60)).priority == -2  # integral numbers, the limit


async def test_unset_priority_is_the_fleets_default_and_unset_timeout_no_deadline(tmp_path: Path) -> None:
    async for api in api_harness(unit_settings(tmp_path, default_priority=1)):
        spec = await submitted_spec(api)
        assert (spec.priority, spec.timeout_s, spec.deadline) == (1, None, None)
        assert (await submitted_spec(api, priority=0)).priority == 0  # an explicit 0 is not "unset"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"priority": 3}, "priority"),
        ({"priority": -3}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"priority": True}, "priority"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": -1}, "timeout_s"),
        ({"timeout_s": "5"}, "timeout_s"),
        ({"timeout_s": 60.5}, "timeout_s"),  # > max_timeout_s (settings)
    ],
)
async def test_a_bad_value_is_a_422_naming_the_field(api: Api, body: dict[str, Any], field: str) -> None:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", **body})
    assert response.status_code == 422, response.text
    assert [error["loc"] for error in response.json()["detail"]] == [["body", field]]
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_the_timeout_limit_names_the_setting(api: Api) -> None:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", "timeout_s": 61})
    error = response.json()["detail"][0]
    assert error["type"] == "less_than_equal" and "max_timeout_s" in error["msg"] and "60" in error["msg"]
    items = [{"prompt": "ok"}, {"prompt": "late", "timeout_s": 3600}]
    response = await api.http.post("/v1/requests/batch", json={"requests": items})
    assert [error["loc"] for error in response.json()["detail"]] == [["body", "requests", 1, "timeout_s"]]


async def test_openai_takes_both_as_extra_body_fields(api: Api) -> None:
    async def send() -> httpx.Response:
        return await api.http.post(GENERATIONS, json={"prompt": "a cat", "priority": -1, "timeout_s": 30})

    response = await call_while_finishing(api, send)
    assert response.status_code == 200, response.text
    spec = await spec_of(api, response.headers["x-request-id"])
    assert (spec.priority, spec.timeout_s) == (-1, 30.0)
    error = openai_error(await api.http.post(GENERATIONS, json={"prompt": "a cat", "priority": 9}), 400)
    assert error["param"] == "priority"


async def test_openai_answers_a_timeout_with_504(api: Api) -> None:
    """Failed before it started, or aborted while running (flagged with the error, then ended by its run)."""

    async def send() -> httpx.Response:
        return await api.http.post(GENERATIONS, json={"prompt": "a cat", "timeout_s": 5})

    not_started = await call_while_finishing(api, send, "failed", (TIMEOUT_ERROR, "not started within its timeout_s"))
    result: list[httpx.Response] = []

    async def call() -> None:
        result.append(await send())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(call)
        request_id = (await wait_queued(api, 2))[-1]
        mark = {"abort": 1, "error_type": TIMEOUT_ERROR, "error_message": "still running at its deadline"}
        await api.redis.hset(api.keys.request(request_id), mapping=mark)
        assert await api.finish(request_id) == "aborted"
    for response in (not_started, result[0]):
        error = openai_error(response, 504)
        assert (error["type"], error["code"]) == ("server_error", "timeout")
        assert "timeout_s (5.0 s)" in error["message"]
