"""What the tiny pipelines share: their seed, diffusers' tiny CLIP and T5 text encoders and flow-matching VAE, and
eval mode.

Every component is built right after ``torch.manual_seed(SEED)``, so every process builds identical weights.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.tiny_models.tokenizers import vocab_size

SEED = 0


def eval_modules(pipe: Any) -> Any:
    """Put every torch module of ``pipe`` in eval mode (freshly built models start in training mode, where T5's
    dropout would make outputs random) and return ``pipe``; ``from_pretrained`` does the same on load."""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    return pipe


def clip_text_config(tokenizer: Any) -> Any:
    """diffusers' tiny CLIP text-encoder config (hidden 32, 5 layers, 4 heads, projection 32) for ``tokenizer``."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        hidden_size=32,
        intermediate_size=37,
        layer_norm_eps=1e-05,
        num_attention_heads=4,
        num_hidden_layers=5,
        vocab_size=vocab_size(tokenizer),
        hidden_act="gelu",
        projection_dim=32,
        max_position_embeddings=77,
    )


def t5_encoder(tokenizer: Any) -> Any:
    """A T5 encoder of ``hf-internal-testing/tiny-random-t5``'s sizes (d_model 32), seeded."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(SEED)
    config = T5Config(
        vocab_size=vocab_size(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=5,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
    )
    return T5EncoderModel(config)


def flow_vae(latent_channels: int) -> Any:
    """diffusers' tiny ``AutoencoderKL`` of its SD3 and Flux tests (one block of 4 channels, no quant convs, SD3's
    shift and scaling factors), seeded."""
    from diffusers import AutoencoderKL

    torch.manual_seed(SEED)
    return AutoencoderKL(  # type: ignore[no-untyped-call]
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )
