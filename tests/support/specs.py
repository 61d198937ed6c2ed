"""A request as the tests build it: the demo model, a prompt of its id (or one given), a small square size."""

from __future__ import annotations

from typing import Any

from demo_models import DEMO_MODEL_NAME
from shared.contracts import LoraRef, RequestSpec


def demo_spec(
    rid: str,
    steps: int,
    guidance: float = 5.0,
    *,
    side: int,
    n: int = 1,
    seed: int = 1,
    negative: str | None = None,
    prompt: str | None = None,
    lora: LoraRef | None = None,
    created_at: float = 0.0,
    **fields: Any,
) -> RequestSpec:
    """Request ``rid`` of the demo model: ``prompt`` (by default ``a picture of {rid}``), ``side`` x ``side``
    pixels; ``fields``, any other ``RequestSpec`` field (``task``, ``strength``...)."""
    return RequestSpec(
        id=rid,
        model=DEMO_MODEL_NAME,
        prompt=f"a picture of {rid}" if prompt is None else prompt,
        negative_prompt=negative,
        seed=seed,
        width=side,
        height=side,
        num_inference_steps=steps,
        guidance_scale=guidance,
        n=n,
        lora=lora,
        created_at=created_at,
        **fields,
    )
