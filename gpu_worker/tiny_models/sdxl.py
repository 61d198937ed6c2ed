"""A tiny, randomly initialised Stable Diffusion XL pipeline built offline (seeded: identical in every process).

Sizes are those of diffusers' own SDXL fast tests (``tests/pipelines/stable_diffusion_xl/test_stable_diffusion_xl.py``,
``get_dummy_components``):

- ``UNet2DConditionModel``: block_out_channels (2, 4), layers_per_block 2, ``addition_embed_type="text_time"``,
  addition_time_embed_dim 8, projection_class_embeddings_input_dim 80 (6 time ids x 8 + 32 pooled),
  cross_attention_dim 64 (the two encoders' 32 + 32), transformer_layers_per_block (1, 2), norm_num_groups 1.
- ``AutoencoderKL``: block_out_channels [32, 64] (latents are 1/2 of the image side: vae_scale_factor 2).
- ``CLIPTextModel`` and ``CLIPTextModelWithProjection``: hidden 32, 5 layers, 4 heads, projection_dim 32.
- ``EulerDiscreteScheduler`` (scaled_linear, leading spacing, steps_offset 1), as in the tests.

The tokenizers are :func:`gpu_worker.tiny_models.tokenizers.clip_tokenizer` (the demo model's offline CLIP BPE,
bos 0, eos = pad 1; the tests download ``hf-internal-testing/tiny-random-clip`` instead), so the text encoders take
eos 1 and a vocabulary sized to it.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.tiny_models.components import SEED, clip_text_config
from gpu_worker.tiny_models.tokenizers import clip_tokenizer


def build() -> Any:
    """A fresh tiny ``StableDiffusionXLPipeline`` (not saved); default size 64x64, any multiple of 8 works."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    tokenizer = clip_tokenizer()
    tokenizer_2 = clip_tokenizer()

    torch.manual_seed(SEED)
    unet = UNet2DConditionModel(  # type: ignore[no-untyped-call]
        block_out_channels=(2, 4),
        layers_per_block=2,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=80,
        cross_attention_dim=64,
        norm_num_groups=1,
    )
    torch.manual_seed(SEED)
    scheduler = EulerDiscreteScheduler(  # type: ignore[no-untyped-call]
        beta_start=0.00085,
        beta_end=0.012,
        steps_offset=1,
        beta_schedule="scaled_linear",
        timestep_spacing="leading",
    )
    torch.manual_seed(SEED)
    vae = AutoencoderKL(  # type: ignore[no-untyped-call]
        block_out_channels=[32, 64],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
        sample_size=128,
    )
    text_encoder_config = clip_text_config(tokenizer)
    torch.manual_seed(SEED)
    text_encoder = CLIPTextModel(text_encoder_config).eval()  # type: ignore[no-untyped-call]
    torch.manual_seed(SEED)
    text_encoder_2 = CLIPTextModelWithProjection(text_encoder_config).eval()  # type: ignore[no-untyped-call]
    return StableDiffusionXLPipeline(  # type: ignore[no-untyped-call]
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=scheduler,
        image_encoder=None,
        feature_extractor=None,
    )
