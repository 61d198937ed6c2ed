"""The compatibility key: every batch-wide field splits buckets, every per-row field does not. The LoRA adapter is
per row (each row of a fused forward gets its own, ``gpu_worker.lora``); the step key keeps it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from shared.compat import CompatKey, compat_key, step_key
from shared.contracts import LoraRef, RequestSpec, Task

BASE: dict[str, Any] = {
    "id": "req-1",
    "model": "demo",
    "prompt": "a red fox",
    "negative_prompt": None,
    "seed": 7,
    "width": 512,
    "height": 512,
    "num_inference_steps": 20,
    "guidance_scale": 7.5,
    "guidance_rescale": 0.0,
    "num_frames": None,
    "n": 1,
    "lora": None,
    "task": "text-to-image",
    "strength": None,
    "created_at": 1000.0,
}

# Every RequestSpec field must be classified here. A field in the key must be one value for a whole pipeline
# call; a per-row field may differ between the rows of one batch. negative_prompt is both: its presence is in
# the key (a batch has negatives for all rows or none), its text is per row.
KEYED_FIELDS = frozenset(
    {
        "model",
        "width",
        "height",
        "num_frames",
        "num_inference_steps",
        "guidance_scale",
        "guidance_rescale",
        "true_cfg_scale",
        "max_sequence_length",
        "fps",
        "n",
        "negative_prompt",
        "task",
        "strength",
    }
)
# lora (adapter and scale) is per row: a fused forward applies each row's own adapter (gpu_worker.lora.LoraActivator).
# output_format and output_compression are per row: each request's images are encoded after the forward.
# priority and timeout_s are the scheduler's (which level a request waits in, its deadline), never the forward's.
PER_ROW_FIELDS = frozenset(
    {
        "id",
        "prompt",
        "negative_prompt",
        "seed",
        "created_at",
        "output_format",
        "output_compression",
        "priority",
        "timeout_s",
        "lora",
    }
)
LORA_FIELDS = frozenset({"name", "scale"})


def spec(**overrides: Any) -> RequestSpec:
    return RequestSpec(**{**BASE, **overrides})


# (base overrides, changed overrides): the two specs must land in different buckets.
DIFFERENT: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "model": ({}, {"model": "other-model"}),
    "width": ({}, {"width": 768}),
    "height": ({}, {"height": 768}),
    "num_frames": ({"num_frames": 16}, {"num_frames": 24}),
    "num_frames_none": ({}, {"num_frames": 16}),
    "num_inference_steps": ({}, {"num_inference_steps": 30}),
    "guidance_scale": ({}, {"guidance_scale": 5.0}),
    "guidance_rescale": ({}, {"guidance_rescale": 0.7}),
    "n": ({}, {"n": 2}),
    "true_cfg_scale": ({"true_cfg_scale": 4.0}, {"true_cfg_scale": 1.0}),
    "true_cfg_vs_none": ({}, {"true_cfg_scale": 4.0}),
    "max_sequence_length": ({}, {"max_sequence_length": 128}),
    "fps": ({"num_frames": 9, "fps": 24}, {"fps": 8}),
    "negative_prompt_presence": ({}, {"negative_prompt": "blurry"}),
    "empty_negative_prompt_presence": ({}, {"negative_prompt": ""}),
    "task": ({}, {"task": "image-to-image", "strength": 0.8}),
    "inpaint_vs_image_to_image": (
        {"task": "image-to-image", "strength": 0.8},
        {"task": "inpaint", "strength": 0.8},
    ),
    "strength": ({"task": "image-to-image", "strength": 0.8}, {"strength": 0.5}),
}

# (base overrides, changed overrides): the two specs must land in the same bucket.
SAME: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "prompt": ({}, {"prompt": "a blue whale"}),
    "negative_prompt_text": ({"negative_prompt": "blurry"}, {"negative_prompt": "low quality, watermark"}),
    "seed": ({}, {"seed": 123456789}),
    "id": ({}, {"id": "req-2"}),
    "created_at": ({}, {"created_at": 2000.5}),
    "output_format": ({}, {"output_format": "jpeg", "output_compression": 80}),
    "priority_and_timeout": ({}, {"priority": 2, "timeout_s": 5.0}),
    "lora_name": ({"lora": LoraRef(name="style-a", scale=1.0)}, {"lora": LoraRef(name="style-b", scale=1.0)}),
    "lora_scale": ({"lora": LoraRef(name="style-a", scale=1.0)}, {"lora": LoraRef(name="style-a", scale=0.5)}),
    "lora_vs_none": ({}, {"lora": LoraRef(name="style-a", scale=1.0)}),
    "all_per_row": (
        {"negative_prompt": "blurry"},
        {"id": "req-3", "prompt": "x", "negative_prompt": "y", "seed": 0, "created_at": 1.0},
    ),
}


@pytest.mark.parametrize(("base", "changed"), list(DIFFERENT.values()), ids=list(DIFFERENT))
def test_batch_wide_field_changes_key(base: dict[str, Any], changed: dict[str, Any]) -> None:
    a, b = spec(**base), spec(**{**base, **changed})
    assert compat_key(a) != compat_key(b)
    assert hash(compat_key(a)) == hash(compat_key(spec(**base)))


@pytest.mark.parametrize(("base", "changed"), list(SAME.values()), ids=list(SAME))
def test_per_row_field_keeps_key(base: dict[str, Any], changed: dict[str, Any]) -> None:
    a, b = spec(**base), spec(**{**base, **changed})
    assert compat_key(a) == compat_key(b)
    assert hash(compat_key(a)) == hash(compat_key(b))


def test_every_request_field_is_classified() -> None:
    """A field added to RequestSpec must be put in the key (a BatchKey marker, shared/contracts.py) or declared
    per-row here."""
    fields = set(RequestSpec.model_fields)
    unclassified = fields - KEYED_FIELDS - PER_ROW_FIELDS
    assert not unclassified, f"classify these RequestSpec fields as keyed or per-row: {sorted(unclassified)}"
    stale = (KEYED_FIELDS | PER_ROW_FIELDS) - fields
    assert not stale, f"classified fields that RequestSpec no longer has: {sorted(stale)}"


def test_no_lora_field_splits_a_step_key() -> None:
    """A step-engine row carries its own adapter: neither the adapter nor its scale splits running sets."""
    assert set(LoraRef.model_fields) == LORA_FIELDS
    base = spec(lora=LoraRef(name="style-a", scale=1.0))
    for other in (None, LoraRef(name="style-b", scale=1.0), LoraRef(name="style-a", scale=0.5)):
        assert step_key(spec(lora=other)) == step_key(base), other
    assert step_key(base) != step_key(spec(width=256)), "the test can fail: another field splits the key"


def test_every_key_field_is_exercised() -> None:
    """Each CompatKey field is changed by at least one DIFFERENT case, and no case changes nothing."""
    base_key = compat_key(spec())
    touched: set[str] = set()
    for base, changed in DIFFERENT.values():
        a, b = compat_key(spec(**base)), compat_key(spec(**{**base, **changed}))
        diff = {f.name for f in dataclasses.fields(CompatKey) if getattr(a, f.name) != getattr(b, f.name)}
        assert diff
        touched |= diff
    assert touched == {f.name for f in dataclasses.fields(CompatKey)}
    assert isinstance(base_key, CompatKey)


def test_step_key_digests_are_stable() -> None:
    """A step key's digest names its running set in Redis: the derived key hashes to what the hand-written one did
    (its fields in the same order), so processes of two versions still agree on a set's name."""
    assert step_key(spec()).digest == "76bf0a5873fc2f98"  # without the LoRA fields and true_cfg_scale (per row)
    every_field = spec(
        lora=LoraRef(name="style-a", scale=0.5),
        task="image-to-image",
        strength=0.8,
        num_frames=9,
        fps=8,
        max_sequence_length=77,
        true_cfg_scale=4.0,
    )
    assert step_key(every_field).digest == "9dcc8a18d297fa92"


IMAGE_ROWS = (Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE)  # what a model's step rows carry (ModelTraits.step_tasks)


def test_tasks_the_rows_carry_leave_the_step_key() -> None:
    """Text-to-image and image-to-image requests at two strengths share one step key where the model's step rows
    carry both tasks; a task they do not carry (inpainting) keeps task and strength in its key, and with nothing
    announced every task keeps them (the safe default)."""
    t2i = spec()
    i2i = [spec(task="image-to-image", strength=strength) for strength in (0.4, 0.8)]
    inpainting = spec(task="inpaint", strength=0.8)
    carried = {step_key(s, IMAGE_ROWS) for s in (t2i, *i2i)}
    assert len(carried) == 1
    (key,) = carried
    assert key.task is None and key.strength is None
    assert step_key(inpainting, IMAGE_ROWS) not in carried
    assert step_key(inpainting, IMAGE_ROWS) == step_key(inpainting)
    assert len({step_key(s) for s in (t2i, *i2i)}) == 3
    assert step_key(spec(width=1024), IMAGE_ROWS) != key  # the canvas still splits a set


def test_a_carried_step_keys_digest_is_stable() -> None:
    """Every process keys a carried request alike: the scheduler's digest names the set the worker opened."""
    assert step_key(spec(task="image-to-image", strength=0.8), IMAGE_ROWS).digest == step_key(spec(), IMAGE_ROWS).digest
    assert step_key(spec(), IMAGE_ROWS).digest != step_key(spec()).digest
