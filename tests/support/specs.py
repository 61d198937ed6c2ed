"""A request as the step-mode tests build it: the demo model, a prompt of its id (or one given), a small square size."""

from __future__ import annotations

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
) -> RequestSpec:
    """Request ``rid`` of the demo model: ``prompt`` (by default ``a picture of {rid}``), ``side`` x ``side``
    pixels."""
    return RequestSpec(
        id=rid,
        model="demo",
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
    )
