"""A tiny, randomly initialised Flux pipeline built offline (seeded, identical in every process).

Sizes (``flux.json``) are diffusers' own test-suite components (``tests/pipelines/flux/test_pipeline_flux.py::
get_dummy_components``), with the shared CLIP, T5 and flow VAE of :mod:`demo_models.components` and the default
``FlowMatchEulerDiscreteScheduler()``. The transformer has no guidance embedding (schnell-like: ``guidance_scale``
is ignored); vocabularies are sized to the offline tokenizers of :mod:`demo_models.tokenizers`.
"""

from __future__ import annotations

from typing import Any

from demo_models.components import clip_text_encoder, eval_modules, flow_scheduler, flow_vae, seeded, sizes, t5_encoder
from demo_models.tokenizers import clip_tokenizer, t5_tokenizer


def build() -> Any:
    """A fresh tiny ``FluxPipeline`` (not saved)."""
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    size = sizes(__file__)
    tokenizer = clip_tokenizer()
    tokenizer_2 = t5_tokenizer()
    pipe = FluxPipeline(  # type: ignore[no-untyped-call]
        scheduler=flow_scheduler(),
        vae=flow_vae(**size["vae"]),
        text_encoder=clip_text_encoder(CLIPTextModel, tokenizer),
        tokenizer=tokenizer,
        text_encoder_2=t5_encoder(tokenizer_2),
        tokenizer_2=tokenizer_2,
        transformer=seeded(FluxTransformer2DModel, **size["transformer"]),
    )
    return eval_modules(pipe)
