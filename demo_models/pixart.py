"""A tiny, randomly initialised PixArt-Sigma pipeline built offline (seeded, identical in every process).

Sizes (``pixart.json``) are diffusers' own test-suite components (``tests/pipelines/pixart_sigma/test_pixart.py::
get_dummy_components``), with the shared T5 of :mod:`demo_models.components`, ``AutoencoderKL()`` and
``DDIMScheduler()`` with their defaults. The transformer's sample_size (8) is none of PixArt's binned resolutions,
so calls must pass ``use_resolution_binning=False`` (the default True raises ``ValueError("Invalid sample size")``).
"""

from __future__ import annotations

from typing import Any

from demo_models.components import eval_modules, seeded, sizes, t5_encoder
from demo_models.tokenizers import t5_tokenizer


def build() -> Any:
    """A fresh tiny ``PixArtSigmaPipeline`` (not saved)."""
    from diffusers import AutoencoderKL, DDIMScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    tokenizer = t5_tokenizer()
    pipe = PixArtSigmaPipeline(  # type: ignore[no-untyped-call]
        tokenizer=tokenizer,
        text_encoder=t5_encoder(tokenizer),
        vae=seeded(AutoencoderKL),
        transformer=seeded(PixArtTransformer2DModel, **sizes(__file__)["transformer"]),
        scheduler=DDIMScheduler(),  # type: ignore[no-untyped-call]
    )
    return eval_modules(pipe)
