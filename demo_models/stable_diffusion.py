"""The default demo model: a tiny Stable Diffusion 1.x pipeline of diffusers' own test-suite sizes
(``stable_diffusion.json``: ~1M UNet parameters, ~4 MB on disk), so a worker serves real pipeline calls on a laptop
CPU without downloading anything. Images are noise-like, but fused, seeded and LoRA behaviour is real.
"""

from __future__ import annotations

from typing import Any

from demo_models.components import clip_text_config, seeded, sizes
from demo_models.tokenizers import CLIP_VOCAB_SIZE, clip_tokenizer


def sd_scheduler() -> Any:
    """Stable Diffusion 1.x's DDIM schedule (scaled-linear betas 0.00085..0.012, steps offset 1)."""
    from diffusers import DDIMScheduler

    return DDIMScheduler(**sizes(__file__)["scheduler"])  # type: ignore[no-untyped-call]


def build() -> Any:
    """A fresh tiny ``StableDiffusionPipeline`` with seeded random weights (not saved)."""
    from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    size = sizes(__file__)
    return StableDiffusionPipeline(  # type: ignore[no-untyped-call]
        vae=seeded(AutoencoderKL, **size["vae"]),
        text_encoder=seeded(CLIPTextModel, clip_text_config(CLIP_VOCAB_SIZE)),
        tokenizer=clip_tokenizer(),
        unet=seeded(UNet2DConditionModel, **size["unet"]),
        scheduler=sd_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
