"""Sana (``SanaPipeline``, a ``SanaTransformer2DModel`` over Gemma prompt embeddings, a DC-AE VAE): the step
engine's adapter.

Mirrors ``SanaPipeline.__call__`` (diffusers 0.42) for text-to-image, with the family's fixed call arguments
(``use_resolution_binning=False``). It extends the PixArt adapter (prompt embeddings with their attention masks
per row, the empty prompt for a guided row without a negative prompt, plain classifier-free guidance without
rescale, learned-sigma channels dropped, ``eta`` and the row's generator to the scheduler step, ``vae.decode(latents
/ scaling_factor)``); what differs:

* each prompt is prefixed by the pipeline's default ``complex_human_instruction`` (negatives are not), as the
  request-level call does (it passes none), and ``clean_caption`` is the pipeline's default (off);
* initial latents are float32 whatever the embeddings' dtype (unscaled: the pipeline multiplies by no
  ``init_noise_sigma``), the transformer gets them and the embeddings in its dtype, its prediction comes back as
  float32;
* per-row timesteps are scaled by the transformer's ``timestep_scale``.

The pipeline applies no ``scale_model_input``; its schedulers (flow-matching Euler, the demo's, and flow DPM-Solver)
take none or an identity, as the engine applies them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from gpu_worker.step_engine.adapter import Canvas, Conditioning
from gpu_worker.step_engine.pixart import PixArtAdapter
from gpu_worker.step_engine.rows import Row


class SanaAdapter(PixArtAdapter):
    family: ClassVar[str] = "sana"
    scales_initial_noise: ClassVar[bool] = False

    def __init__(self, pipe: Any, canvas: Canvas) -> None:
        super().__init__(pipe, canvas)
        self.complex_human_instruction: list[str] | None = self.call_default("complex_human_instruction")
        self.clean_caption: bool = self.call_default("clean_caption")

    def initial_latents(self, rows: Sequence[Row], schedulers: Sequence[Any], dtype: torch.dtype) -> list[torch.Tensor]:
        return super().initial_latents(rows, schedulers, torch.float32)  # SanaPipeline.prepare_latents: float32

    def encode_options(self) -> dict[str, Any]:
        return {"clean_caption": self.clean_caption, "complex_human_instruction": self.complex_human_instruction}

    def denoise(self, sample: torch.Tensor, timesteps: torch.Tensor, conditioning: Conditioning) -> torch.Tensor:
        transformer = self.pipe.transformer
        dtype = transformer.dtype
        out: torch.Tensor = transformer(
            sample.to(dtype=dtype),
            encoder_hidden_states=conditioning["encoder_hidden_states"].to(dtype=dtype),
            encoder_attention_mask=conditioning["encoder_attention_mask"],
            timestep=timesteps * transformer.config.timestep_scale,
            return_dict=False,
            attention_kwargs=None,
        )[0]
        out = out.float()
        return out.chunk(2, dim=1)[0] if self.learned_sigma else out
