"""A tiny, randomly initialised Stable Diffusion XL pipeline built offline (seeded: identical in every process).

Sizes (``sdxl.json``) are those of diffusers' own SDXL fast tests (``tests/pipelines/stable_diffusion_xl/
test_stable_diffusion_xl.py``, ``get_dummy_components``): a UNet with ``text_time`` added embeddings (6 time ids x 8
+ 32 pooled = 80), cross-attention 64 (the two CLIP encoders' 32 + 32), a VAE of latents 1/2 of the image side.
The two tokenizers are :func:`demo_models.tokenizers.clip_tokenizer` (the tests download
``hf-internal-testing/tiny-random-clip``), so the text encoders take eos 1 and a vocabulary sized to it.
"""

from __future__ import annotations

from typing import Any

from demo_models.components import clip_text_encoder, eval_modules, seeded, sizes
from demo_models.tokenizers import clip_tokenizer


def build() -> Any:
    """A fresh tiny ``StableDiffusionXLPipeline`` (not saved); default size 64x64, any multiple of 8 works."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    size = sizes(__file__)
    tokenizer = clip_tokenizer()
    tokenizer_2 = clip_tokenizer()
    pipe = StableDiffusionXLPipeline(  # type: ignore[no-untyped-call]
        vae=seeded(AutoencoderKL, **size["vae"]),
        text_encoder=clip_text_encoder(CLIPTextModel, tokenizer),
        text_encoder_2=clip_text_encoder(CLIPTextModelWithProjection, tokenizer_2),
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=seeded(UNet2DConditionModel, **size["unet"]),
        scheduler=EulerDiscreteScheduler(**size["scheduler"]),  # type: ignore[no-untyped-call]
        image_encoder=None,
        feature_extractor=None,
    )
    return eval_modules(pipe)
