"""A tiny, randomly initialised Stable Diffusion 3 pipeline built offline (seeded, identical in every process).

Sizes are diffusers' own test-suite components (``tests/pipelines/stable_diffusion_3/
test_pipeline_stable_diffusion_3_inpaint.py::get_dummy_components``: the text-to-image test's sizes with 16 latent
channels, as the real SD3 VAE has; with 4, ``StableDiffusion3InpaintPipeline`` refuses the transformer, so one set
of weights serves text-to-image, image-to-image and inpainting):

* ``SD3Transformer2DModel``: sample_size 32, patch_size 1, in/out channels 16, 1 layer, 4 heads x 8 dims,
  caption_projection_dim 32, joint_attention_dim 32, pooled_projection_dim 64 (pos_embed_max_size 96, the default);
* two ``CLIPTextModelWithProjection`` encoders: hidden 32, intermediate 37, 5 layers, 4 heads, projection 32
  (their pooled outputs concatenate to the transformer's 64-dim pooled projection);
* optional ``T5EncoderModel`` of ``hf-internal-testing/tiny-random-t5``'s sizes (d_model 32, d_ff 37, d_kv 8,
  4 heads, 5 layers, 8 relative-attention buckets), built here rather than downloaded;
* ``AutoencoderKL``: one block of 4 channels, 16 latent channels, no quant convs, shift 0.0609 / scale 1.5035
  (so ``vae_scale_factor`` is 1: a 32x32 image is a 32x32 latent);
* ``FlowMatchEulerDiscreteScheduler()`` with its defaults.

Deviations from the test suite: vocabularies are sized to the offline tokenizers of
:mod:`gpu_worker.tiny_models.tokenizers` (the test uses 1000 / the hub tokenizer), and CLIP's ``eos_token_id`` is
that tokenizer's eos (1), so pooling picks the real end-of-text token. As in the test suite, the two CLIPs' 64
concatenated dims are cut to joint_attention_dim (32) when the pipeline pads them to the T5 width.

A saved T5-less pipeline records ``text_encoder_3``/``tokenizer_3`` as ``[null, null]`` in model_index.json, and
``from_pretrained`` then needs ``text_encoder_3=None, tokenizer_3=None`` passed explicitly.
``clip_text_config``, ``t5_encoder`` and ``eval_modules`` are shared with the Flux and PixArt builders.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.tiny_models.components import SEED, clip_text_config, eval_modules, flow_vae, t5_encoder
from gpu_worker.tiny_models.tokenizers import clip_tokenizer, t5_tokenizer


def build(with_t5: bool = False) -> Any:
    """A fresh tiny ``StableDiffusion3Pipeline`` (not saved); without T5, ``text_encoder_3``/``tokenizer_3`` are None
    and the pipeline feeds zeros in place of the T5 embeddings, as for SD3 run without its T5."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextModelWithProjection

    torch.manual_seed(SEED)
    transformer = SD3Transformer2DModel(  # type: ignore[no-untyped-call]
        sample_size=32,
        patch_size=1,
        in_channels=16,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        out_channels=16,
    )
    tokenizer = clip_tokenizer()
    tokenizer_2 = clip_tokenizer()
    torch.manual_seed(SEED)
    text_encoder = CLIPTextModelWithProjection(clip_text_config(tokenizer))
    torch.manual_seed(SEED)
    text_encoder_2 = CLIPTextModelWithProjection(clip_text_config(tokenizer_2))
    tokenizer_3 = t5_tokenizer() if with_t5 else None
    text_encoder_3 = t5_encoder(tokenizer_3) if with_t5 else None
    vae = flow_vae(latent_channels=16)
    scheduler = FlowMatchEulerDiscreteScheduler()  # type: ignore[no-untyped-call]
    pipe = StableDiffusion3Pipeline(  # type: ignore[no-untyped-call]
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
    )
    return eval_modules(pipe)
