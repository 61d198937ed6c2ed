"""A tiny, randomly initialised LTX-Video text-to-video pipeline built offline (seeded, identical in every process).

Why LTX-Video (and not Wan): both build tiny offline, take prompt lists with one ``torch.Generator`` per video and
are fused == solo, but LTX's image-to-video variants (``LTXImageToVideoPipeline``, ``LTXConditionPipeline``) run on
the very same components (``LTXImageToVideoPipeline(**pipe.components)``), while Wan's image-to-video needs another
transformer (more input channels, image projection) and, for Wan 2.1, a CLIP image encoder.

Sizes are diffusers' own test-suite components (``tests/pipelines/ltx/test_ltx.py::get_dummy_components``) except
where noted:

* ``LTXVideoTransformer3DModel``: 1 layer, 4 heads x 8 dims, in/out_channels 8, patch_size 1, patch_size_t 1,
  cross_attention_dim 32, caption_channels 32 (~35k parameters);
* ``AutoencoderKLLTXVideo``: 8 latent channels, 4 blocks of 8 channels, 1 layer per block, no timestep
  conditioning, no noise injection (~106k parameters). **Deviation**: ``patch_size`` 4 and
  ``spatio_temporal_scaling`` (True, True, True, False) as the released LTX-Video VAE (the test suite uses 1 and
  (True, True, False, False)), so the compression is the real model's: 32x spatial, 8x temporal. The tiny model
  then has the real calling rules: height and width multiples of 32, ``num_frames`` = 8k + 1;
* ``T5EncoderModel`` of ``hf-internal-testing/tiny-random-t5``'s sizes (d_model 32), built here, not downloaded,
  with the offline T5 tokenizer of :mod:`gpu_worker.tiny_models.tokenizers`;
* ``FlowMatchEulerDiscreteScheduler()`` with its defaults.

Calling rules (``LTXPipeline.__call__``; the fleet must validate, as the pipeline mostly does not):

* ``height``/``width`` not multiples of 32 raise ``ValueError``;
* ``num_frames`` is silently floored to 8k + 1 (``(num_frames - 1) // 8 * 8 + 1`` frames come back, no warning);
  1 frame is valid. Read the ratios from ``pipe.vae_spatial_compression_ratio`` and
  ``pipe.vae_temporal_compression_ratio`` rather than these constants when serving a real checkpoint;
* ``frame_rate`` (default 25) changes the output (it scales the rotary position embedding), so it belongs in the
  batch key, like size, frame count, steps, ``guidance_scale`` and ``guidance_rescale``; ``negative_prompt`` can be
  a list, one per video;
* ``max_sequence_length`` defaults to 128 tokens; the tests use 16.

Frames are noise-like; the shapes, batching, seeding and callbacks are real.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.tiny_models.components import SEED, eval_modules, t5_encoder
from gpu_worker.tiny_models.tokenizers import t5_tokenizer

FAMILY = "ltx-video"
"""The family name of this tiny pipeline."""

SIZE_MULTIPLE = 32
"""Height and width must be multiples of this (the VAE's spatial compression; the pipeline checks 32)."""

FRAME_MULTIPLE = 8
"""``num_frames`` must be ``FRAME_MULTIPLE * k + 1`` (the VAE's temporal compression)."""


def build() -> Any:
    """A fresh tiny ``LTXPipeline`` (not saved), every module in eval mode."""
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )

    torch.manual_seed(SEED)
    transformer = LTXVideoTransformer3DModel(  # type: ignore[no-untyped-call]
        in_channels=8,
        out_channels=8,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=4,
        attention_head_dim=8,
        cross_attention_dim=32,
        num_layers=1,
        caption_channels=32,
    )
    torch.manual_seed(SEED)
    vae = AutoencoderKLLTXVideo(  # type: ignore[no-untyped-call]
        in_channels=3,
        out_channels=3,
        latent_channels=8,
        block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True, False),
        decoder_spatio_temporal_scaling=(True, True, True, False),
        decoder_inject_noise=(False, False, False, False, False),
        upsample_residual=(False, False, False, False),
        upsample_factor=(1, 1, 1, 1),
        timestep_conditioning=False,
        patch_size=4,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    torch.manual_seed(SEED)
    scheduler = FlowMatchEulerDiscreteScheduler()  # type: ignore[no-untyped-call]
    tokenizer = t5_tokenizer()
    text_encoder = t5_encoder(tokenizer)  # seeds itself
    pipe = LTXPipeline(  # type: ignore[no-untyped-call]
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )
    return eval_modules(pipe)
