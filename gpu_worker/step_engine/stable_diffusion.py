"""Stable Diffusion 1.x/2.x (``StableDiffusionPipeline``, a ``UNet2DConditionModel``): the step engine's adapter.

Mirrors ``StableDiffusionPipeline.__call__`` (diffusers 0.42) for text-to-image: CLIP prompt embeddings (the
empty prompt when a guided row has no negative prompt), initial latents scaled by ``init_noise_sigma``,
``scheduler.scale_model_input``, epsilon / v-prediction / sample (the scheduler's ``prediction_type``: the scheduler
step handles it), guidance with optional ``guidance_rescale``, ``eta`` (0) and the row's generator passed to the
scheduler step where it takes them, and ``vae.decode(latents / scaling_factor)``. No safety checker runs (the
fleet disables it). UNets with a guidance embedding (``time_cond_proj_dim``, LCM-distilled) are refused: their
guidance is not classifier-free, and they stay request-level. Image-to-image and inpainting rows (their
pipelines' ``StableDiffusionImg2ImgPipeline`` and ``StableDiffusionInpaintPipeline`` per row, 4- and 9-channel
UNets) share sets with text-to-image rows (``gpu_worker.step_engine.image_task``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from gpu_worker.step_engine.adapter import Canvas, Conditioning, FamilyAdapter, Prompt, split
from gpu_worker.step_engine.image_task import ImageTasks
from gpu_worker.step_engine.rows import Row


class StableDiffusionAdapter(ImageTasks, FamilyAdapter):
    family: ClassVar[str] = "stable-diffusion"
    denoiser_name: ClassVar[str] = "unet"
    scales_initial_noise: ClassVar[bool] = True
    rescales_guidance: ClassVar[bool] = True
    passes_eta_and_generator: ClassVar[bool] = True

    def __init__(self, pipe: Any, canvas: Canvas) -> None:
        super().__init__(pipe, canvas)
        if pipe.unet.config.time_cond_proj_dim is not None:
            raise ValueError("step mode: UNets with a guidance embedding (time_cond_proj_dim) run request-level")

    @property
    def size_multiple(self) -> int:
        return 8  # StableDiffusionPipeline.check_inputs

    def encode(self, rows: Sequence[Row]) -> list[Prompt]:
        guided = [self.guided(row) for row in rows]
        cond, uncond = self.pipe.encode_prompt(
            [row.prompt for row in rows],
            self.device,
            1,
            any(guided),
            [row.negative_prompt or "" for row in rows] if any(guided) else None,
        )
        conds = split({"encoder_hidden_states": cond}, len(rows))
        unconds = split({"encoder_hidden_states": uncond}, len(rows)) if any(guided) else [None] * len(rows)
        return [Prompt(c, u if g else None) for c, u, g in zip(conds, unconds, guided, strict=True)]

    def denoise(self, sample: torch.Tensor, timesteps: torch.Tensor, conditioning: Conditioning) -> torch.Tensor:
        out: torch.Tensor = self.pipe.unet(
            sample,
            timesteps,
            encoder_hidden_states=conditioning["encoder_hidden_states"],
            timestep_cond=None,
            cross_attention_kwargs=None,
            added_cond_kwargs=self.added_conditions(conditioning),
            return_dict=False,
        )[0]
        return out

    def added_conditions(self, conditioning: Conditioning) -> dict[str, torch.Tensor] | None:
        """The UNet's ``added_cond_kwargs`` for these rows (none for SD 1.x/2.x)."""
        return None

    def decode(self, latents: torch.Tensor, output_type: str) -> list[Any]:
        vae = self.pipe.vae
        image = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
        images = self.pipe.image_processor.postprocess(
            image, output_type=output_type, do_denormalize=[True] * image.shape[0]
        )
        return list(images)
