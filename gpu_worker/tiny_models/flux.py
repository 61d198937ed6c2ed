"""A tiny, randomly initialised Flux pipeline built offline (seeded, identical in every process).

Sizes are diffusers' own test-suite components (``tests/pipelines/flux/test_pipeline_flux.py::get_dummy_components``):

* ``FluxTransformer2DModel``: patch_size 1, in_channels 4 (= 1 latent channel packed 2x2), 1 double + 1 single
  block, 2 heads x 16 dims, joint_attention_dim 32, pooled_projection_dim 32, axes_dims_rope (4, 4, 8), no guidance
  embedding (``guidance_embeds=False``: schnell-like, ``guidance_scale`` is ignored);
* ``CLIPTextModel``: hidden 32, intermediate 37, 5 layers, 4 heads (its pooled output feeds the transformer);
* ``T5EncoderModel`` of ``hf-internal-testing/tiny-random-t5``'s sizes (d_model 32), built here, not downloaded;
* ``AutoencoderKL``: one block of 4 channels, 1 latent channel, no quant convs, shift 0.0609 / scale 1.5035
  (``vae_scale_factor`` 1);
* ``FlowMatchEulerDiscreteScheduler()`` with its defaults.

Vocabularies are sized to the offline tokenizers of :mod:`gpu_worker.tiny_models.tokenizers`.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.tiny_models.components import SEED, clip_text_config, eval_modules, flow_vae, t5_encoder
from gpu_worker.tiny_models.tokenizers import clip_tokenizer, t5_tokenizer


def build() -> Any:
    """A fresh tiny ``FluxPipeline`` (not saved)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    torch.manual_seed(SEED)
    transformer = FluxTransformer2DModel(  # type: ignore[no-untyped-call]
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    )
    tokenizer = clip_tokenizer()
    torch.manual_seed(SEED)
    text_encoder = CLIPTextModel(clip_text_config(tokenizer))
    tokenizer_2 = t5_tokenizer()
    text_encoder_2 = t5_encoder(tokenizer_2)
    vae = flow_vae(latent_channels=1)
    scheduler = FlowMatchEulerDiscreteScheduler()  # type: ignore[no-untyped-call]
    pipe = FluxPipeline(  # type: ignore[no-untyped-call]
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )
    return eval_modules(pipe)
