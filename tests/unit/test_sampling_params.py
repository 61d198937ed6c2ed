"""The sampling parameters are declared once (``shared.contracts.SamplingParams``): the HTTP request, the stored spec
and the echoed ``Params`` all carry them, and what the batch keys hold follows from their ``BatchKey`` markers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from shared.compat import COMPAT_FIELDS, STEP_FIELDS
from shared.contracts import BatchKey, LoraRef, RequestSpec, RequestState, RequestStatus, RunParams, SamplingParams
from shared.wire import GenerateRequest, Params, RequestView


def _json_type(prop: dict[str, Any]) -> str | None:
    kind: str | None = prop.get("type", prop.get("anyOf", [{}])[0].get("type"))
    return kind


INTEGERS = [
    name
    for name, prop in GenerateRequest.model_json_schema()["properties"].items()
    if name in SamplingParams.model_fields and _json_type(prop) == "integer"
]
FULL: dict[str, Any] = {
    "prompt": "a red fox",
    "negative_prompt": "blurry",
    "width": 128,
    "height": 64,
    "num_frames": 9,
    "num_inference_steps": 7,
    "guidance_scale": 3.5,
    "guidance_rescale": 0.25,
    "true_cfg_scale": 4.0,
    "max_sequence_length": 77,
    "fps": 8,
    "seed": 5,
    "n": 2,
    "lora": {"name": "style", "scale": 0.5},
    "output_format": "webp",
    "output_compression": 60,
    "priority": 1,
    "timeout_s": 30.0,
}


def test_the_example_sets_every_sampling_parameter() -> None:
    assert set(FULL) == set(SamplingParams.model_fields)
    assert {"width", "height", "seed", "n", "num_frames", "fps", "priority", "output_compression"} <= set(INTEGERS)


@pytest.mark.parametrize("field", INTEGERS)
def test_an_integral_json_number_is_an_integer_and_a_fraction_is_refused(field: str) -> None:
    number = float(FULL[field])
    assert getattr(GenerateRequest.model_validate_json(json.dumps({**FULL, field: number})), field) == FULL[field]
    with pytest.raises(ValidationError) as refused:
        GenerateRequest.model_validate_json(json.dumps({**FULL, field: number + 0.5}))
    assert refused.value.errors()[0]["loc"] == (field,)


def test_the_spec_and_its_echo_carry_every_parameter_as_sent() -> None:
    request = GenerateRequest.model_validate(FULL)
    spec = request.to_spec(request_id="r1", model="demo", seed=5, created_at=1.0)
    for name, value in FULL.items():
        stored = getattr(spec, name)
        assert (stored.model_dump() if isinstance(stored, LoraRef) else stored) == value, name
    params = RequestView.from_state(RequestState(spec=spec, status=RequestStatus.QUEUED)).params
    assert params.model_dump() == spec.model_dump(exclude={"id", "created_at"})
    assert (
        set(Params.model_fields) == set(RunParams.model_fields) == set(RequestSpec.model_fields) - {"id", "created_at"}
    )


def test_every_echoed_parameter_is_required_in_the_answer_schema() -> None:
    schema = Params.model_json_schema(mode="serialization")
    assert set(schema["required"]) == set(Params.model_fields)
    assert "additionalProperties" not in schema  # a client reads an answer with a parameter it does not know


def test_the_keys_are_the_marked_fields() -> None:
    marked = {
        name: marker
        for name, info in RequestSpec.model_fields.items()
        for marker in info.metadata
        if isinstance(marker, BatchKey)
    }
    assert {f.field for f in COMPAT_FIELDS} == {name for name, marker in marked.items() if marker.forward}
    assert {f.field for f in STEP_FIELDS} == {name for name, marker in marked.items() if marker.step}
    assert [f.name for f in COMPAT_FIELDS if f.field == "negative_prompt"] == ["has_negative_prompt"]
    assert not [f.name for f in STEP_FIELDS if f.field == "lora"], "a step row carries its LoRA itself"
