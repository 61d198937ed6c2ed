"""Bad input is a 4xx, never a 5xx: non-finite numbers, malformed or odd bodies, huge numbers, deep nesting;
and the per-batch pixel budget (``max_batch_pixels``) refused at submission."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.validation import CUT, MAX_DEPTH, json_safe
from shared.settings import Settings
from tests.support.api import Api, unit_settings

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # 64 x 64 x 4 images: a 256 x 256 image alone, or three 64 x 128 ones, exceed the budget
    return unit_settings(tmp_path, max_batch_pixels=64 * 64 * 4)


def _strict_json(response: httpx.Response) -> Any:
    """The body parsed as strict JSON (no NaN/Infinity tokens), as any client library would."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"non-standard JSON token {token} in {response.text[:200]}")

    return json.loads(response.content.decode("utf-8"), parse_constant=refuse)


def _detail(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    detail: list[dict[str, Any]] = _strict_json(response)["detail"]
    for error in detail:
        assert {"type", "loc", "msg", "input"} <= error.keys()
    return detail


def _in_batch(body: bytes) -> bytes:
    return b'{"requests": [{"prompt": "ok"}, ' + body + b"]}"


NON_FINITE = [
    pytest.param(b'{"prompt":"x","guidance_scale":NaN}', ["guidance_scale"], "NaN", id="nan-field"),
    pytest.param(b'{"prompt": "x", "guidance_rescale": -Infinity}', ["guidance_rescale"], "-Infinity", id="-inf"),
    pytest.param(b'{"prompt":"x","lora":{"name":"a","scale":Infinity}}', ["lora", "scale"], "Infinity", id="lora"),
    pytest.param(b'{"prompt": "x", "extra": NaN}', ["extra"], "NaN", id="extra-field"),
    pytest.param(b'{"prompt": "x", "extra": [1, -Infinity]}', ["extra"], [1, "-Infinity"], id="list-item"),
    pytest.param(b'{"prompt": "x", "extra": {"a": {"b": NaN}}}', ["extra"], {"a": {"b": "NaN"}}, id="nested"),
    pytest.param(b'{"prompt": "x", "seed": 1e400}', ["seed"], "Infinity", id="seed-1e400"),
    pytest.param(b'{"prompt": NaN}', ["prompt"], None, id="prompt"),
]


@pytest.mark.parametrize(("body", "field", "echo"), NON_FINITE)
async def test_non_finite_number_is_422_with_json_safe_echo(
    api: Api, body: bytes, field: list[str], echo: Any
) -> None:
    detail = _detail(await api.http.post("/v1/requests", content=body, headers=JSON))
    assert [error["loc"] for error in detail] == [["body", *field]]
    if echo is not None:
        assert detail[0]["input"] == echo

    detail = _detail(await api.http.post("/v1/requests/batch", content=_in_batch(body), headers=JSON))
    assert [error["loc"] for error in detail] == [["body", "requests", 1, *field]]
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_echo_keeps_fastapi_error_format(api: Api) -> None:
    response = await api.http.post("/v1/requests", content=b'{"prompt": "x", "guidance_scale": NaN}', headers=JSON)
    assert _detail(response) == [
        {
            "type": "finite_number",
            "loc": ["body", "guidance_scale"],
            "msg": "Input should be a finite number",
            "input": "NaN",
        }
    ]
    response = await api.http.post("/v1/requests", json={"prompt": "x", "guidance_scale": 51})
    assert _detail(response) == [
        {
            "type": "less_than_equal",
            "loc": ["body", "guidance_scale"],
            "msg": "Input should be less than or equal to 50",
            "input": 51,
            "ctx": {"le": 50.0},
        }
    ]


ODD_BODIES = [
    pytest.param(b'{"prompt": ', JSON, id="truncated-json"),
    pytest.param(b'{"prompt": "x",}', JSON, id="trailing-comma"),
    pytest.param(b'{"prompt": "\xff\xfe"}', JSON, id="invalid-utf8"),
    pytest.param(b'{"prompt": "\\ud800"}', JSON, id="lone-surrogate"),
    pytest.param(b'{"prompt": "x", "\\udfff": 1}', JSON, id="lone-surrogate-key"),
    pytest.param(b'{"prompt": "x", "lora": {"name": "\\ud800"}}', JSON, id="lone-surrogate-lora"),
    pytest.param(b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}", JSON, id="5000-digit-int"),
    pytest.param(b'{"prompt": "x", "width": ' + str(10**30).encode() + b"}", JSON, id="width-1e30"),
    pytest.param(b'{"prompt": "x", "n": ' + str(10**30).encode() + b"}", JSON, id="n-1e30"),
    pytest.param(b'{"prompt": "x", "guidance_scale": ' + str(10**400).encode() + b"}", JSON, id="float-10e400"),
    pytest.param(b'{"prompt": "x", "lora": {"name": "a", "scale": -1e999}}', JSON, id="lora-scale-1e999"),
    pytest.param(b'{"prompt": "x", "extra": ' + b"[" * 900 + b"]" * 900 + b"}", JSON, id="nested-900"),
    pytest.param(b'{"prompt": "x", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", JSON, id="nested-100k"),
    pytest.param(b"", JSON, id="empty"),
    pytest.param(b"null", JSON, id="null"),
    pytest.param(b"[]", JSON, id="list"),
    pytest.param(b'"x"', JSON, id="string"),
    pytest.param(b'{"prompt": "x"}', {"content-type": "text/plain"}, id="text-plain"),
    pytest.param(b"prompt=x", {"content-type": "application/x-www-form-urlencoded"}, id="form"),
    pytest.param(b"--b\r\n\r\nx\r\n--b--\r\n", {"content-type": "multipart/form-data; boundary=b"}, id="multipart"),
    pytest.param(b'{"prompt": "x"}', {"content-type": "\x00"}, id="nul-content-type"),
]


@pytest.mark.parametrize(("body", "headers"), ODD_BODIES)
@pytest.mark.parametrize("path", ["/v1/requests", "/v1/requests/batch"])
async def test_odd_body_is_4xx_and_queues_nothing(api: Api, path: str, body: bytes, headers: dict[str, str]) -> None:
    if path.endswith("/batch") and headers is JSON and body.startswith(b"{"):
        body = _in_batch(body)
    response = await api.http.post(path, content=body, headers=headers)
    assert 400 <= response.status_code < 500, response.text[:300]
    _strict_json(response)
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_deep_echo_is_cut(api: Api) -> None:
    body = b'{"prompt": "x", "extra": ' + b"[" * 900 + b"]" * 900 + b"}"
    [error] = _detail(await api.http.post("/v1/requests", content=body, headers=JSON))
    echo, levels = error["input"], 0
    while isinstance(echo, list):
        assert len(echo) == 1
        echo, levels = echo[0], levels + 1
    assert echo == CUT
    assert MAX_DEPTH - 4 < levels < MAX_DEPTH  # the error's own nesting counts too


@pytest.mark.parametrize(
    "params",
    [{"wait_s": "nan"}, {"wait_s": "inf"}, {"wait_s": "-inf"}, {"wait_s": "1e400"}, {"wait_s": "x"}],
)
async def test_odd_query_is_422(api: Api, params: dict[str, str]) -> None:
    _detail(await api.http.get("/v1/requests/" + "0" * 32, params=params))  # a well-formed (unknown) id


async def test_odd_path_is_4xx(api: Api) -> None:
    unknown = "0" * 32  # a well-formed id: a malformed one is a 404 before the index is looked at
    assert (await api.http.get(f"/v1/requests/{unknown}/images/" + "9" * 5000)).status_code == 422
    assert (await api.http.get(f"/v1/requests/{unknown}/images/1e400")).status_code == 422
    assert (await api.http.get("/v1/requests/%ED%A0%80")).status_code == 404
    assert (await api.http.post("/v1/requests/%00/abort")).status_code == 404


class _Opaque:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<opaque \udc80>"


@pytest.mark.parametrize(
    ("value", "safe"),
    [
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
        (float("-inf"), "-Infinity"),
        (1.5, 1.5),
        (10**40, 10**40),
        (b"ok \xff", "ok \ufffd"),
        (bytearray(b"ab"), "ab"),
        ("a\ud800b", "a\\ud800b"),
        (("body", 3, "width"), ["body", 3, "width"]),
        ({"le": float("inf"), 1: None}, {"le": "Infinity", "1": None}),
        (frozenset({float("nan")}), ["NaN"]),
        (ValueError("bad \udcff value"), "bad \\udcff value"),
        (Decimal("NaN"), "NaN"),
        (_Opaque(), "<opaque \\udc80>"),
    ],
)
def test_json_safe(value: Any, safe: Any) -> None:
    assert json_safe(value) == safe
    json.dumps(json_safe(value), allow_nan=False, ensure_ascii=False).encode("utf-8")


def test_json_safe_cuts_deep_nesting() -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = {"k": [deep]}
    json.dumps(json_safe(deep), allow_nan=False)


def _pixel_error(response: httpx.Response) -> dict[str, Any]:
    [error] = _detail(response)
    assert error["type"] == "batch_pixels_exceeded"
    assert "max_batch_pixels" in error["msg"]
    return error


async def test_single_image_over_pixel_budget_names_width(api: Api) -> None:
    error = _pixel_error(await api.http.post("/v1/requests", json={"prompt": "x", "width": 256, "height": 256}))
    assert error["loc"] == ["body", "width"]
    assert error["input"] == 256
    assert "65536" in error["msg"] and "16384" in error["msg"]
    assert error["ctx"] == {"pixels": 65536, "max_batch_pixels": 16384}


async def test_several_images_over_pixel_budget_name_n(api: Api) -> None:
    body = {"prompt": "x", "width": 64, "height": 128, "n": 3}
    error = _pixel_error(await api.http.post("/v1/requests", json=body))
    assert error["loc"] == ["body", "n"]
    assert error["input"] == 3
    assert "24576" in error["msg"]
    assert await api.redis.xlen(api.keys.requests) == 0

    at_budget = {**body, "n": 2}  # 2 x 64 x 128 = 16384: exactly the budget
    assert (await api.http.post("/v1/requests", json=at_budget)).status_code == 202


async def test_batch_item_over_pixel_budget_names_its_index(api: Api) -> None:
    items = [
        {"prompt": "a"},
        {"prompt": "b", "width": 64, "height": 128, "n": 3},
        {"prompt": "c", "width": 256, "height": 128},
    ]
    response = await api.http.post("/v1/requests/batch", json={"requests": items})
    locs = [error["loc"] for error in _detail(response)]
    assert locs == [["body", "requests", 1, "n"], ["body", "requests", 2, "width"]]
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_oversized_side_is_reported_once(api: Api) -> None:
    [error] = _detail(await api.http.post("/v1/requests", json={"prompt": "x", "width": 1024}))
    assert error["type"] == "less_than_equal" and "max_image_side" in error["msg"]
