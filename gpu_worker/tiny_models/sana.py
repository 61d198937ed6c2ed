"""A tiny, randomly initialised Sana pipeline built offline (seeded: identical in every process).

Sizes are those of diffusers' own Sana fast tests (``tests/pipelines/sana/test_sana.py``, ``get_dummy_components``):

- ``SanaTransformer2DModel``: patch_size 1, 4 latent channels, 1 layer, 2 heads x 4, cross-attention 2 heads x 4,
  cross_attention_dim 8, caption_channels 8, sample_size 32 (which selects the 1024 px aspect-ratio bins when
  ``use_resolution_binning`` is left on: call with ``use_resolution_binning=False``).
- ``AutoencoderDC``: 2 stages of 8 channels (ResBlock, EfficientViTBlock), latent_channels 4: latents are 1/2 of
  the image side (vae_scale_factor 2); the pipeline still requires sides divisible by 32.
- ``Gemma2Model``: hidden 8, head_dim 16, 2 heads, 1 layer, intermediate 64, eager attention.
- ``FlowMatchEulerDiscreteScheduler(shift=7.0)``, as in the tests.

The tokenizer is :func:`gpu_worker.tiny_models.tokenizers.gemma_tokenizer` (the tests download
``hf-internal-testing/dummy-gemma`` and use a vocabulary of 8, so only the empty prompt works there); the text
encoder's vocabulary is sized to it, so any prompt works here.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.tiny_models.components import SEED
from gpu_worker.tiny_models.tokenizers import gemma_tokenizer, vocab_size


def build() -> Any:
    """A fresh tiny ``SanaPipeline`` (not saved); sides must be multiples of 32."""
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    tokenizer = gemma_tokenizer()

    torch.manual_seed(SEED)
    transformer = SanaTransformer2DModel(  # type: ignore[no-untyped-call]
        patch_size=1,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        num_attention_heads=2,
        attention_head_dim=4,
        num_cross_attention_heads=2,
        cross_attention_head_dim=4,
        cross_attention_dim=8,
        caption_channels=8,
        sample_size=32,
    )
    torch.manual_seed(SEED)
    vae = AutoencoderDC(  # type: ignore[no-untyped-call]
        in_channels=3,
        latent_channels=4,
        attention_head_dim=2,
        encoder_block_types=("ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 8),
        decoder_block_out_channels=(8, 8),
        encoder_qkv_multiscales=((), (5,)),
        decoder_qkv_multiscales=((), (5,)),
        encoder_layers_per_block=(1, 1),
        decoder_layers_per_block=(1, 1),
        downsample_block_type="conv",
        upsample_block_type="interpolate",
        decoder_norm_types="rms_norm",
        decoder_act_fns="silu",
        scaling_factor=0.41407,
    )
    torch.manual_seed(SEED)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=7.0)  # type: ignore[no-untyped-call]
    torch.manual_seed(SEED)
    text_encoder = Gemma2Model(
        Gemma2Config(
            head_dim=16,
            hidden_size=8,
            initializer_range=0.02,
            intermediate_size=64,
            max_position_embeddings=8192,
            num_attention_heads=2,
            num_hidden_layers=1,
            num_key_value_heads=2,
            vocab_size=vocab_size(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            attn_implementation="eager",  # type: ignore[call-arg]
        )
    ).eval()  # type: ignore[no-untyped-call]
    return SanaPipeline(  # type: ignore[no-untyped-call]
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
    )
