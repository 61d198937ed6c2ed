"""A tiny, randomly initialised LTX-Video text-to-video pipeline built offline (seeded, identical in every process).

LTX-Video rather than Wan: both build tiny offline and are fused == solo, but LTX's image-to-video variants run on
the very same components (``LTXImageToVideoPipeline(**pipe.components)``), while Wan's need another transformer.
Sizes (``video.json``) are diffusers' own test-suite components (``tests/pipelines/ltx/test_ltx.py::
get_dummy_components``), with the shared T5 of :mod:`demo_models.components` and
``FlowMatchEulerDiscreteScheduler()``, but for one deviation: the VAE's ``patch_size`` 4 and
``spatio_temporal_scaling`` (True, True, True, False) are the released model's (32x spatial, 8x temporal
compression), so the tiny model has the real calling rules (:data:`SIZE_MULTIPLE`, :data:`FRAME_MULTIPLE`; the
pipeline silently floors ``num_frames`` to 8k + 1, and ``frame_rate`` changes the output: docs/models.md).
"""

from __future__ import annotations

from typing import Any

from demo_models.components import eval_modules, flow_scheduler, seeded, sizes, t5_encoder
from demo_models.tokenizers import t5_tokenizer

FAMILY = "ltx-video"
"""The family name of this tiny pipeline."""

SIZE_MULTIPLE = 32
"""Height and width must be multiples of this (the VAE's spatial compression; the pipeline checks 32)."""

FRAME_MULTIPLE = 8
"""``num_frames`` must be ``FRAME_MULTIPLE * k + 1`` (the VAE's temporal compression)."""


def build() -> Any:
    """A fresh tiny ``LTXPipeline`` (not saved), every module in eval mode."""
    from diffusers import AutoencoderKLLTXVideo, LTXPipeline, LTXVideoTransformer3DModel

    size = sizes(__file__)
    tokenizer = t5_tokenizer()
    pipe = LTXPipeline(  # type: ignore[no-untyped-call]
        scheduler=flow_scheduler(),
        vae=seeded(AutoencoderKLLTXVideo, **size["vae"]),
        text_encoder=t5_encoder(tokenizer),
        tokenizer=tokenizer,
        transformer=seeded(LTXVideoTransformer3DModel, **size["transformer"]),
    )
    return eval_modules(pipe)
