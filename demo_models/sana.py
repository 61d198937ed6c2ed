"""A tiny, randomly initialised Sana pipeline built offline (seeded: identical in every process).

Sizes (``sana.json``) are those of diffusers' own Sana fast tests (``tests/pipelines/sana/test_sana.py``,
``get_dummy_components``): a transformer of sample_size 32 (which selects the 1024 px aspect-ratio bins when
``use_resolution_binning`` is left on: call with ``use_resolution_binning=False``), an ``AutoencoderDC`` whose
latents are 1/2 of the image side (the pipeline still requires sides divisible by 32), a Gemma2 text encoder and
``FlowMatchEulerDiscreteScheduler(shift=7.0)``. The tokenizer is :func:`demo_models.tokenizers.gemma_tokenizer`
(the tests download ``hf-internal-testing/dummy-gemma`` with a vocabulary of 8, so only the empty prompt works
there); the text encoder's vocabulary is sized to it, so any prompt works here.
"""

from __future__ import annotations

from typing import Any

from demo_models.components import eval_modules, flow_scheduler, seeded, sizes
from demo_models.tokenizers import gemma_tokenizer, vocab_size


def build() -> Any:
    """A fresh tiny ``SanaPipeline`` (not saved); sides must be multiples of 32."""
    from diffusers import AutoencoderDC, SanaPipeline, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    size = sizes(__file__)
    tokenizer = gemma_tokenizer()
    ids = {name: getattr(tokenizer, name) for name in ("pad_token_id", "bos_token_id", "eos_token_id")}
    text_config = Gemma2Config(**size["text_encoder"], vocab_size=vocab_size(tokenizer), **ids)
    pipe = SanaPipeline(  # type: ignore[no-untyped-call]
        tokenizer=tokenizer,
        text_encoder=seeded(Gemma2Model, text_config),
        vae=seeded(AutoencoderDC, **size["vae"]),
        transformer=seeded(SanaTransformer2DModel, **size["transformer"]),
        scheduler=flow_scheduler(**size["scheduler"]),
    )
    return eval_modules(pipe)
