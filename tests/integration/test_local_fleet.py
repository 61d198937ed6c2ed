"""``fusefleet.local`` (the embedded Python API): a real local fleet of two tiny models configured by keyword
settings; each list item of ``generate`` is its own request (for the model it names), the results come back in
order."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

import fusefleet

PROMPTS = ["a red fox", "a blue whale", "a green frog"]
MODELS = ["sd", "px", "sd"]


@pytest.mark.timeout(120)
def test_local_fleet_generates_each_item_as_its_own_request_in_order(model_cache: Path) -> None:
    with fusefleet.local(
        models={"sd": "demo:stable-diffusion", "px": "demo:pixart"},
        max_num_seqs=2,
        request_batch_max_wait_ms=2000.0,
        model_cache_dir=model_cache,
        torch_threads=1,
    ) as fleet:
        results = fleet.generate(
            [{"prompt": p, "seed": seed, "model": m} for seed, (p, m) in enumerate(zip(PROMPTS, MODELS, strict=True))],
            timeout=60,
            width=64,
            height=64,
            num_inference_steps=2,
        )
    assert [result.ok for result in results] == [True] * len(PROMPTS), [r.error for r in results]
    assert [result.request.prompt for result in results if result.request] == PROMPTS
    assert [result.view.params.model for result in results if result.view] == MODELS  # each ran on its model
    assert [result.view.seed for result in results if result.view] == [0, 1, 2]
    assert len({result.id for result in results}) == len(PROMPTS)  # one request each
    assert all(result.view and (result.view.batch_size or 0) <= 2 for result in results)  # its max_num_seqs
    for result in results:
        assert Image.open(io.BytesIO(result.images[0])).size == (64, 64)
