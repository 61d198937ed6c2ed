"""A tiny, randomly initialised Wan 2.2 image-to-video pipeline built offline (seeded, identical in every process).

Sizes (``wan_i2v.json``) are diffusers' own test-suite components (``tests/pipelines/wan/
test_wan_22_image_to_video.py::Wan22ImageToVideoPipelineFastTests.get_dummy_components``: the VAE of
:mod:`demo_models.wan`, two ``WanTransformer3DModel`` of 2 layers, 2 heads of 12 taking 36 channels (16 of noise,
16 of the encoded input video, 4 of its first-frame mask) for the high- and low-noise stages, ``boundary_ratio``
0.875, ``UniPCMultistepScheduler`` with flow sigmas, shift 3; no CLIP image encoder, as the released Wan 2.2 I2V
A14B), with the UMT5 encoder of :mod:`demo_models.wan` and its one deviation: ``rope_max_seq_len`` 1024, so the
tiny model takes every size the real one does. The calling rules are text-to-video Wan's
(:data:`demo_models.wan.SIZE_MULTIPLE`, :data:`demo_models.wan.FRAME_MULTIPLE`); the second transformer is seeded
apart from the first, so the two stages differ as a real model's do.
"""

from __future__ import annotations

from typing import Any

from demo_models.components import SEED, eval_modules, seeded, sizes, umt5_encoder
from demo_models.tokenizers import t5_tokenizer

FAMILY = "wan-i2v"
"""The family name of this tiny pipeline."""


def build() -> Any:
    """A fresh tiny ``WanImageToVideoPipeline`` (not saved), every module in eval mode."""
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanTransformer3DModel

    size = sizes(__file__)
    tokenizer = t5_tokenizer()
    transformer = {**size["transformer"], "patch_size": tuple(size["transformer"]["patch_size"])}
    high_noise = seeded(WanTransformer3DModel, **transformer)
    torch.manual_seed(SEED + 1)
    low_noise = WanTransformer3DModel(**transformer)  # type: ignore[no-untyped-call]
    pipe = WanImageToVideoPipeline(  # type: ignore[no-untyped-call]
        tokenizer=tokenizer,
        text_encoder=umt5_encoder(tokenizer),
        vae=seeded(AutoencoderKLWan, **size["vae"]),
        scheduler=UniPCMultistepScheduler(**size["scheduler"]),  # type: ignore[no-untyped-call]
        transformer=high_noise,
        transformer_2=low_noise,
        boundary_ratio=size["boundary_ratio"],
    )
    return eval_modules(pipe)
