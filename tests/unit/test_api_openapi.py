"""The served OpenAPI document is honest: it states this server's limits, LoRA adapters and error answers, and
what it calls an integer is accepted as one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api.app import create_app
from shared.contracts import MAX_SEED, RequestSpec
from shared.settings import Settings
from tests.support.api import Api, unit_settings

pytestmark = pytest.mark.anyio


def _request_schema(document: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = document["components"]["schemas"]["GenerateRequest"]
    return schema


async def test_schema_states_this_servers_limits(api: Api) -> None:
    document = (await api.http.get("/openapi.json")).json()
    request = _request_schema(document)
    props = request["properties"]
    assert props["prompt"]["maxLength"] == 100
    assert props["negative_prompt"]["anyOf"][0] == {"type": "string", "maxLength": 100}
    assert props["width"]["maximum"] == props["height"]["maximum"] == 512
    assert props["num_inference_steps"]["maximum"] == 50
    assert props["n"]["maximum"] == 4
    assert props["seed"]["anyOf"][0]["maximum"] == MAX_SEED  # exactly, not the float 2**63
    assert f"max_batch_pixels ({api.settings.max_batch_pixels})" in request["description"]
    # the plain models keep only the fixed bounds
    assert "maximum" not in document["components"]["schemas"]["Params"]["properties"]["width"]


def test_lora_adapters_are_listed_when_served(settings: Settings) -> None:
    assert settings.lora_dir is not None
    app = create_app(settings)
    lora = _request_schema(app.openapi())["properties"]["lora"]
    assert lora["anyOf"][0]["properties"]["name"]["enum"] == ["style"]
    assert lora["anyOf"][1] == {"type": "null"}

    (settings.lora_dir / "watercolor").mkdir()
    (settings.lora_dir / ".cache").mkdir()  # not a valid adapter name
    (settings.lora_dir / "notes.txt").write_text("not an adapter")
    lora = _request_schema(app.openapi())["properties"]["lora"]
    assert lora["anyOf"][0]["properties"]["name"]["enum"] == ["style", "watercolor"]


@pytest.mark.parametrize("lora_dir", [None, "missing"])
def test_without_adapters_lora_must_be_null(tmp_path: Path, lora_dir: str | None) -> None:
    settings = unit_settings(tmp_path, lora_dir=tmp_path / lora_dir if lora_dir else None)
    lora = _request_schema(create_app(settings).openapi())["properties"]["lora"]
    assert lora["type"] == "null"


def test_every_error_answer_is_documented(settings: Settings) -> None:
    paths = create_app(settings).openapi()["paths"]
    documented = {
        (method.upper(), path): set(operation["responses"])
        for path, item in paths.items()
        for method, operation in item.items()
    }
    assert documented == {
        ("POST", "/v1/requests"): {"202", "400", "413", "422", "429", "503"},
        ("POST", "/v1/requests/batch"): {"202", "400", "413", "422", "429", "503"},
        ("GET", "/v1/requests/{request_id}"): {"200", "404", "422", "503"},
        ("GET", "/v1/requests/{request_id}/images/{index}"): {"200", "307", "404", "410", "422", "503"},
        ("DELETE", "/v1/requests/{request_id}"): {"204", "404", "409", "422", "503"},
        ("GET", "/v1/requests/{request_id}/videos/{index}"): {"200", "307", "404", "410", "422", "503"},
        ("GET", "/v1/requests/{request_id}/video"): {"200", "307", "404", "410", "422", "503"},
        ("POST", "/v1/requests/{request_id}/abort"): {"200", "404", "409", "422", "503"},
        ("GET", "/v1/requests/{request_id}/events"): {"200", "204", "404", "422", "429", "503"},
        ("GET", "/v1/events"): {"200", "204", "404", "422", "429", "503"},
        ("GET", "/v1/fleet"): {"200", "503"},
        ("GET", "/healthz"): {"200", "503"},
    }
    for (method, path), codes in documented.items():
        responses = paths[path][method.lower()]["responses"]
        assert "Retry-After" in responses["503"]["headers"], path
        for code in codes - {"200", "202", "204", "307", "422"}:
            assert responses[code]["content"]["application/json"]["schema"], (method, path, code)


@pytest.mark.parametrize(
    ("field", "number"), [("width", 128.0), ("height", 128.0), ("num_inference_steps", 8.0), ("seed", 7.0), ("n", 2.0)]
)
async def test_integral_json_number_is_an_integer(api: Api, field: str, number: float) -> None:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", field: number})
    assert response.status_code == 202, response.text
    raw = await api.redis.hgetall(api.keys.request(response.json()["id"]))
    value = getattr(RequestSpec.model_validate_json(raw["spec"]), field)
    assert value == int(number) and type(value) is int


@pytest.mark.parametrize("value", [8.5, True, "8", 1e300, None])
async def test_non_integers_stay_refused(api: Api, value: Any) -> None:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", "width": value})
    assert response.status_code == 422, response.text
    assert [error["loc"] for error in response.json()["detail"]] == [["body", "width"]]


PYDANTIC_FALLBACK_KEYS = {"ge", "gt", "le", "lt", "multiple_of", "min_length", "max_length"}
"""Names pydantic writes, unchanged, for a bound it could not turn into JSON Schema (one added after a validator):
JSON Schema ignores them, so a client generating from the document would send what the api refuses."""


def _fallback_bounds(node: Any, path: str = "") -> list[str]:
    if isinstance(node, list):
        return [found for index, item in enumerate(node) for found in _fallback_bounds(item, f"{path}[{index}]")]
    if not isinstance(node, dict):
        return []
    in_properties = path.rsplit(".", 1)[-1] == "properties"  # there a key is a field's name
    here = [f"{path}.{key}" for key in node if key in PYDANTIC_FALLBACK_KEYS and not in_properties]
    return here + [found for key, value in node.items() for found in _fallback_bounds(value, f"{path}.{key}")]


def test_every_bound_is_in_json_schema_terms(settings: Settings) -> None:
    document = create_app(settings).openapi()
    assert _fallback_bounds(document) == []
    props = _request_schema(document)["properties"]
    assert props["max_sequence_length"]["anyOf"][0]["minimum"] == 1
    assert props["priority"]["anyOf"][0] == {"type": "integer", "minimum": -2, "maximum": 2}
    assert props["output_compression"]["anyOf"][0] == {"type": "integer", "minimum": 0, "maximum": 100}
    assert props["model"]["anyOf"][0]["enum"] == list(settings.catalog)  # another name is a 422
