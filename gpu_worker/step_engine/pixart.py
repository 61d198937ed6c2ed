"""PixArt-Sigma and PixArt-Alpha (``PixArtSigmaPipeline``, ``PixArtAlphaPipeline``, a ``PixArtTransformer2DModel``
over T5): the step engine's adapter.

Mirrors the pipelines' ``__call__`` (diffusers 0.42) for text-to-image, with the family's fixed call arguments
(``gpu_worker.families``: ``clean_caption=False``, ``use_resolution_binning=False``, so prompts and sizes are taken
as sent): T5 embeddings **and their attention masks** per row (padded to ``max_sequence_length``, the pipeline's
default unless the step key sets one), the empty prompt for a guided row without a negative prompt (the pipelines'
default ``negative_prompt=""``), initial latents scaled by ``init_noise_sigma``, ``scheduler.scale_model_input``,
per-row timesteps, plain classifier-free guidance (no ``guidance_rescale``: the pipelines take none), the learned
sigma channels dropped after guidance (``out_channels == 2 x in_channels``), ``eta`` (0) and the row's generator
to the scheduler step where it takes them, and ``vae.decode(latents / scaling_factor)``.

Transformers that take resolution and aspect-ratio conditions (``use_additional_conditions``: PixArt-Alpha at
1024 px) are refused: they run request-level.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from gpu_worker.step_engine.adapter import Canvas, Conditioning, FamilyAdapter, Prompt, split
from gpu_worker.step_engine.rows import Row


class PixArtAdapter(FamilyAdapter):
    family: ClassVar[str] = "pixart"
    denoiser_name: ClassVar[str] = "transformer"
    scales_initial_noise: ClassVar[bool] = True
    rescales_guidance: ClassVar[bool] = False
    passes_eta_and_generator: ClassVar[bool] = True

    def __init__(self, pipe: Any, canvas: Canvas) -> None:
        super().__init__(pipe, canvas)
        if getattr(pipe.transformer, "use_additional_conditions", False):
            raise ValueError("step mode: PixArt transformers with resolution conditions (Alpha 1024) run request-level")
        self.max_sequence_length: int = canvas.max_sequence_length or self.call_default("max_sequence_length")
        config = pipe.transformer.config
        self.learned_sigma = config.out_channels // 2 == config.in_channels

    @property
    def size_multiple(self) -> int:
        return int(self.pipe.vae_scale_factor * self.pipe.transformer.config.patch_size)

    def encode_options(self) -> dict[str, Any]:
        """The pipeline's own ``encode_prompt`` arguments beyond the prompts (a subclass's pipeline may add some)."""
        return {"clean_caption": False}

    def encode(self, rows: Sequence[Row]) -> list[Prompt]:
        guided = [self.guided(row) for row in rows]
        cond, mask, uncond, uncond_mask = self.pipe.encode_prompt(
            [row.prompt for row in rows],
            do_classifier_free_guidance=any(guided),
            negative_prompt=[row.negative_prompt or "" for row in rows],
            num_images_per_prompt=1,
            device=self.device,
            max_sequence_length=self.max_sequence_length,
            **self.encode_options(),
        )
        conds = split({"encoder_hidden_states": cond, "encoder_attention_mask": mask}, len(rows))
        unconds: list[dict[str, torch.Tensor] | None] = [None] * len(rows)
        if any(guided):
            unconds = [*split({"encoder_hidden_states": uncond, "encoder_attention_mask": uncond_mask}, len(rows))]
        return [Prompt(c, u if g else None) for c, u, g in zip(conds, unconds, guided, strict=True)]

    def denoise(self, sample: torch.Tensor, timesteps: torch.Tensor, conditioning: Conditioning) -> torch.Tensor:
        out: torch.Tensor = self.pipe.transformer(
            sample,
            encoder_hidden_states=conditioning["encoder_hidden_states"],
            encoder_attention_mask=conditioning["encoder_attention_mask"],
            timestep=timesteps,
            added_cond_kwargs={"resolution": None, "aspect_ratio": None},
            return_dict=False,
        )[0]
        # the learned variance channels: the pipelines drop them after guidance, which is elementwise (the same)
        return out.chunk(2, dim=1)[0] if self.learned_sigma else out

    def decode(self, latents: torch.Tensor, output_type: str) -> list[Any]:
        vae = self.pipe.vae
        image = vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor, return_dict=False)[0]
        return list(self.pipe.image_processor.postprocess(image, output_type=output_type))
