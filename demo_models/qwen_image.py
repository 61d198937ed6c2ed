"""A tiny, randomly initialised Qwen-Image pipeline built offline (seeded: identical in every process).

Sizes (``qwen_image.json``) are those of diffusers' own Qwen-Image fast tests (``tests/pipelines/qwenimage/
test_qwenimage.py``, ``get_dummy_components``): a transformer of 16 input channels (4 latent channels x 2x2
packing), a VAE of ``vae_scale_factor`` 4 (with the packing, sides are multiples of 8), a Qwen2.5-VL text encoder,
``FlowMatchEulerDiscreteScheduler()``. The tokenizer is :func:`demo_models.tokenizers.qwen2_tokenizer` (the tests
download ``hf-internal-testing/tiny-random-Qwen2VLForConditionalGeneration``), so the text encoder's vocabulary
and its bos / eos / pad and vision-marker ids are that tokenizer's; the pipeline's prompt template tokenizes to the
same 34-token prefix it drops as with the real tokenizer.
"""

from __future__ import annotations

from typing import Any

from demo_models.components import eval_modules, flow_scheduler, seeded, sizes
from demo_models.tokenizers import qwen2_tokenizer, vocab_size


def _text_encoder(tokenizer: Any, size: dict[str, Any]) -> Any:
    """A seeded ``Qwen2_5_VLForConditionalGeneration`` of ``size``'s text and vision configs, ids of ``tokenizer``."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids
    text_ids = {"bos_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>")}
    config = Qwen2_5_VLConfig(
        text_config={
            **size["text_config"],
            "vocab_size": vocab_size(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            **text_ids,
        },
        vision_config=size["vision_config"],
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    return seeded(Qwen2_5_VLForConditionalGeneration, config)


def build() -> Any:
    """A fresh tiny ``QwenImagePipeline`` (not saved); sides are multiples of 8 (others are rounded down)."""
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel

    size = sizes(__file__)
    tokenizer = qwen2_tokenizer()
    pipe = QwenImagePipeline(  # type: ignore[no-untyped-call]
        transformer=seeded(QwenImageTransformer2DModel, **size["transformer"]),
        vae=seeded(AutoencoderKLQwenImage, **size["vae"]),
        scheduler=flow_scheduler(),
        text_encoder=_text_encoder(tokenizer, size),
        tokenizer=tokenizer,
    )
    return eval_modules(pipe)
