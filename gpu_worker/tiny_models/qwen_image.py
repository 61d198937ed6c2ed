"""A tiny, randomly initialised Qwen-Image pipeline built offline (seeded: identical in every process).

Sizes are those of diffusers' own Qwen-Image fast tests (``tests/pipelines/qwenimage/test_qwenimage.py``,
``get_dummy_components``):

- ``QwenImageTransformer2DModel``: patch_size 2, in_channels 16 (4 latent channels x 2x2 packing), out_channels 4,
  2 layers, 3 heads x 16, joint_attention_dim 16, axes_dims_rope (8, 4, 4), no guidance embedding.
- ``AutoencoderKLQwenImage``: base_dim 24, z_dim 4, dim_mult [1, 2, 4], 1 res block, temperal_downsample
  [False, True] (vae_scale_factor 2**2 = 4; with the 2x2 packing, sides are multiples of 8), latents mean 0, std 1.
- ``Qwen2_5_VLForConditionalGeneration``: text hidden 16, 2 layers, 2 heads (2 kv heads), intermediate 16, mrope
  sections [1, 1, 2], rope_theta 1e6; vision tower depth 2, hidden 16, 2 heads, out_hidden 16.
- ``FlowMatchEulerDiscreteScheduler()`` with its defaults, as in the tests.

The tokenizer is :func:`gpu_worker.tiny_models.tokenizers.qwen2_tokenizer` (the tests download
``hf-internal-testing/tiny-random-Qwen2VLForConditionalGeneration``): a byte-level BPE whose special tokens have ids
0..6, so the text encoder's vocabulary is sized to it (the tests use Qwen's 152064 rows) and its bos / eos / pad
and vision-marker ids point at those tokens. The pipeline's prompt template tokenizes to the same 34-token prefix
it drops as with the real tokenizer.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.tiny_models.components import SEED
from gpu_worker.tiny_models.tokenizers import qwen2_tokenizer, vocab_size


def _components() -> dict[str, Any]:
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = qwen2_tokenizer()

    torch.manual_seed(SEED)
    transformer = QwenImageTransformer2DModel(  # type: ignore[no-untyped-call]
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=3,
        joint_attention_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    )
    torch.manual_seed(SEED)
    z_dim = 4
    vae = AutoencoderKLQwenImage(  # type: ignore[no-untyped-call]
        base_dim=z_dim * 6,
        z_dim=z_dim,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )
    torch.manual_seed(SEED)
    scheduler = FlowMatchEulerDiscreteScheduler()  # type: ignore[no-untyped-call]

    ids = tokenizer.convert_tokens_to_ids
    vocab = vocab_size(tokenizer)
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0,
            "vocab_size": vocab,
            "bos_token_id": ids("<|endoftext|>"),
            "eos_token_id": ids("<|im_end|>"),
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    torch.manual_seed(SEED)
    text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()  # type: ignore[no-untyped-call]
    return {
        "transformer": transformer,
        "vae": vae,
        "scheduler": scheduler,
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
    }


def build() -> Any:
    """A fresh tiny ``QwenImagePipeline`` (not saved); sides are multiples of 8 (others are rounded down)."""
    from diffusers import QwenImagePipeline

    return QwenImagePipeline(**_components())  # type: ignore[no-untyped-call]
