"""A tiny, randomly initialised Stable Diffusion 3 pipeline built offline (seeded, identical in every process).

Sizes (``sd3.json``) are diffusers' own test-suite components (``tests/pipelines/stable_diffusion_3/
test_pipeline_stable_diffusion_3_inpaint.py::get_dummy_components``: the text-to-image test's sizes with 16 latent
channels, as the real SD3 VAE has; with 4, ``StableDiffusion3InpaintPipeline`` refuses the transformer, so one set
of weights serves text-to-image, image-to-image and inpainting), with the shared CLIP, T5 and flow VAE of
:mod:`demo_models.components`. Deviations: vocabularies are sized to the offline tokenizers, and CLIP's eos is that
tokenizer's (1), so pooling picks the real end-of-text token.

A saved T5-less pipeline records ``text_encoder_3``/``tokenizer_3`` as ``[null, null]`` in model_index.json, and
``from_pretrained`` then needs ``text_encoder_3=None, tokenizer_3=None`` passed explicitly.
"""

from __future__ import annotations

from typing import Any

from demo_models.components import clip_text_encoder, eval_modules, flow_scheduler, flow_vae, seeded, sizes, t5_encoder
from demo_models.tokenizers import clip_tokenizer, t5_tokenizer


def build(with_t5: bool = False) -> Any:
    """A fresh tiny ``StableDiffusion3Pipeline`` (not saved); without T5, ``text_encoder_3``/``tokenizer_3`` are None
    and the pipeline feeds zeros in place of the T5 embeddings, as for SD3 run without its T5."""
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    size = sizes(__file__)
    tokenizer = clip_tokenizer()
    tokenizer_2 = clip_tokenizer()
    tokenizer_3 = t5_tokenizer() if with_t5 else None
    pipe = StableDiffusion3Pipeline(  # type: ignore[no-untyped-call]
        transformer=seeded(SD3Transformer2DModel, **size["transformer"]),
        scheduler=flow_scheduler(),
        vae=flow_vae(**size["vae"]),
        text_encoder=clip_text_encoder(CLIPTextModelWithProjection, tokenizer),
        tokenizer=tokenizer,
        text_encoder_2=clip_text_encoder(CLIPTextModelWithProjection, tokenizer_2),
        tokenizer_2=tokenizer_2,
        text_encoder_3=t5_encoder(tokenizer_3) if with_t5 else None,
        tokenizer_3=tokenizer_3,
    )
    return eval_modules(pipe)
