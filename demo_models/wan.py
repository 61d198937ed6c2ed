"""A tiny, randomly initialised Wan 2.x text-to-video pipeline built offline (seeded, identical in every process).

Sizes (``wan.json``) are diffusers' own test-suite components (``tests/pipelines/wan/test_wan.py::
get_dummy_components``: ``AutoencoderKLWan`` of base dim 3, ``WanTransformer3DModel`` of 2 layers, 2 heads of 12,
``FlowMatchEulerDiscreteScheduler(shift=7.0)``), with the shared T5 tokenizer and a UMT5 encoder of the shared T5's
sizes (:mod:`demo_models.components`; diffusers' tests use a T5, the released model a UMT5), but for one deviation:
the transformer's ``rope_max_seq_len`` is the released model's 1024 (the tests' 32 caps a side at 32 patches), so
the tiny model takes every size the real one does. Its VAE compresses as the released Wan 2.1's (8x spatial, 4x
temporal) and its patches are 1x2x2, so the tiny model has the real calling rules (:data:`SIZE_MULTIPLE`,
:data:`FRAME_MULTIPLE`; the pipeline only warns when it rounds ``num_frames`` to ``n // 4 * 4 + 1``, so 8 frames
become 9: docs/models.md).
"""

from __future__ import annotations

from typing import Any

from demo_models.components import eval_modules, flow_scheduler, seeded, sizes, umt5_encoder
from demo_models.tokenizers import t5_tokenizer

FAMILY = "wan"
"""The family name of this tiny pipeline."""

SIZE_MULTIPLE = 16
"""Height and width must be multiples of this (the VAE's 8x spatial compression times the 2x2 patches)."""

FRAME_MULTIPLE = 4
"""``num_frames`` must be ``FRAME_MULTIPLE * k + 1`` (the VAE's temporal compression)."""


def build() -> Any:
    """A fresh tiny ``WanPipeline`` (not saved), every module in eval mode."""
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    size = sizes(__file__)
    tokenizer = t5_tokenizer()
    transformer = {**size["transformer"], "patch_size": tuple(size["transformer"]["patch_size"])}
    pipe = WanPipeline(  # type: ignore[no-untyped-call]
        tokenizer=tokenizer,
        text_encoder=umt5_encoder(tokenizer),
        vae=seeded(AutoencoderKLWan, **size["vae"]),
        scheduler=flow_scheduler(**size["scheduler"]),
        transformer=seeded(WanTransformer3DModel, **transformer),
    )
    return eval_modules(pipe)
