"""A tiny, randomly initialised PixArt-Sigma pipeline built offline (seeded, identical in every process).

Sizes are diffusers' own test-suite components (``tests/pipelines/pixart_sigma/test_pixart.py::
get_dummy_components``):

* ``PixArtTransformer2DModel``: sample_size 8, patch_size 2, 2 layers, 3 heads x 8 dims, caption_channels 32,
  cross_attention_dim 24, in_channels 4, out_channels 8 (learned sigma), ``ada_norm_single``;
* ``T5EncoderModel`` of ``hf-internal-testing/tiny-random-t5``'s sizes (d_model 32), built here, not downloaded;
* ``AutoencoderKL()`` with its defaults: one block of 64 channels, 4 latent channels (``vae_scale_factor`` 1);
* ``DDIMScheduler()`` with its defaults.

The transformer's sample_size (8) is none of PixArt's binned resolutions, so calls must pass
``use_resolution_binning=False`` (the default True raises ``ValueError("Invalid sample size")``).
The vocabulary is sized to the offline T5 tokenizer of :mod:`gpu_worker.tiny_models.tokenizers`.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.tiny_models.components import SEED, eval_modules, t5_encoder
from gpu_worker.tiny_models.tokenizers import t5_tokenizer


def build() -> Any:
    """A fresh tiny ``PixArtSigmaPipeline`` (not saved)."""
    from diffusers import AutoencoderKL, DDIMScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    torch.manual_seed(SEED)
    transformer = PixArtTransformer2DModel(  # type: ignore[no-untyped-call]
        sample_size=8,
        num_layers=2,
        patch_size=2,
        attention_head_dim=8,
        num_attention_heads=3,
        caption_channels=32,
        in_channels=4,
        cross_attention_dim=24,
        out_channels=8,
        attention_bias=True,
        activation_fn="gelu-approximate",
        num_embeds_ada_norm=1000,
        norm_type="ada_norm_single",
        norm_elementwise_affine=False,
        norm_eps=1e-6,
    )
    torch.manual_seed(SEED)
    vae = AutoencoderKL()  # type: ignore[no-untyped-call]
    scheduler = DDIMScheduler()  # type: ignore[no-untyped-call]
    tokenizer = t5_tokenizer()
    text_encoder = t5_encoder(tokenizer)
    pipe = PixArtSigmaPipeline(  # type: ignore[no-untyped-call]
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=scheduler,
    )
    return eval_modules(pipe)
