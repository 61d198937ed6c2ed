"""Stable Diffusion 3 (``StableDiffusion3Pipeline``, an ``SD3Transformer2DModel`` with a flow-matching scheduler):
the step engine's adapter.

Mirrors ``StableDiffusion3Pipeline.__call__`` (diffusers 0.42) for text-to-image: two CLIP encoders and T5 (zeros
of ``max_sequence_length`` tokens without T5), the empty prompt for a guided row without a negative prompt,
unscaled initial latents, no ``scale_model_input``, per-row timesteps straight into the transformer, plain
classifier-free guidance (the pipeline takes no ``guidance_rescale``; a row's rescale is ignored, as the
request-level runner leaves it out), no extra scheduler-step arguments, the dynamic shift ``mu`` of the image
sequence length when the scheduler uses it, and ``vae.decode(latents / scaling_factor + shift_factor)``.
Skip-layer guidance and IP adapters are not used (the fleet sends neither).

Image-to-image and inpainting rows mirror ``StableDiffusion3Img2ImgPipeline`` and ``StableDiffusion3InpaintPipeline``
(:mod:`gpu_worker.step_engine.flow_image_task`: the start step of ``int(max(steps - steps x strength, 0))``, the
image's latents ``(sample - shift_factor) x scaling_factor``, the noise mixed in by ``scheduler.scale_noise``; an
inpainting row at strength 1 starts from its noise, a 16-channel transformer's rows are blended with their image
latents after each step, a 33-channel one takes mask and masked-image latents as input). An inpainting row is
decoded as its pipeline decodes: ``vae.decode(latents / scaling_factor)``, without the shift (diffusers 0.42;
huggingface/diffusers#13611), so that it equals its request-level run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from gpu_worker.step_engine.adapter import Canvas, Conditioning, FamilyAdapter, Prompt, split
from gpu_worker.step_engine.flow_image_task import FlowImageTasks
from gpu_worker.step_engine.rows import Finished, Row
from shared.contracts import Task


class StableDiffusion3Adapter(FlowImageTasks, FamilyAdapter):
    family: ClassVar[str] = "stable-diffusion-3"
    denoiser_name: ClassVar[str] = "transformer"
    scales_initial_noise: ClassVar[bool] = False
    rescales_guidance: ClassVar[bool] = False
    full_strength_is_noise: ClassVar[bool] = True

    def __init__(self, pipe: Any, canvas: Canvas) -> None:
        super().__init__(pipe, canvas)
        self.max_sequence_length: int = canvas.max_sequence_length or self.call_default("max_sequence_length")

    @property
    def size_multiple(self) -> int:
        return int(self.pipe.vae_scale_factor * self.pipe.patch_size)  # StableDiffusion3Pipeline.check_inputs

    def timestep_kwargs(self) -> dict[str, Any]:
        config = self.pipe.scheduler.config
        if not config.get("use_dynamic_shifting", None):
            return {}
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

        _, height, width = self.latent_shape()
        patch = self.pipe.transformer.config.patch_size
        mu = calculate_shift(
            (height // patch) * (width // patch),
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.16),
        )
        return {"mu": mu}

    def encode(self, rows: Sequence[Row]) -> list[Prompt]:
        guided = [self.guided(row) for row in rows]
        prompts = [row.prompt for row in rows]
        cond, uncond, pooled, uncond_pooled = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=any(guided),
            negative_prompt=[row.negative_prompt or "" for row in rows] if any(guided) else None,
            max_sequence_length=self.max_sequence_length,
        )
        conds = split({"encoder_hidden_states": cond, "pooled_projections": pooled}, len(rows))
        unconds: list[dict[str, torch.Tensor] | None] = [None] * len(rows)
        if any(guided):
            unconds = [*split({"encoder_hidden_states": uncond, "pooled_projections": uncond_pooled}, len(rows))]
        return [Prompt(c, u if g else None) for c, u, g in zip(conds, unconds, guided, strict=True)]

    def denoise(self, sample: torch.Tensor, timesteps: torch.Tensor, conditioning: Conditioning) -> torch.Tensor:
        out: torch.Tensor = self.pipe.transformer(
            hidden_states=sample,
            timestep=timesteps,
            encoder_hidden_states=conditioning["encoder_hidden_states"],
            pooled_projections=conditioning["pooled_projections"],
            joint_attention_kwargs=None,
            return_dict=False,
        )[0]
        return out

    def decode(self, latents: torch.Tensor, output_type: str) -> list[Any]:
        vae = self.pipe.vae
        return self._decode(latents / vae.config.scaling_factor + vae.config.shift_factor, output_type)

    def decode_finished(self, finished: Sequence[Finished], output_type: str) -> list[Any]:
        """One VAE call; an inpainting row's latents unshifted, as ``StableDiffusion3InpaintPipeline`` decodes."""
        vae = self.pipe.vae
        scaled = [done.latents / vae.config.scaling_factor for done in finished]
        shifted = [
            z if done.row.task is Task.INPAINT else z + vae.config.shift_factor
            for z, done in zip(scaled, finished, strict=True)
        ]
        return self._decode(torch.cat(shifted), output_type)

    def _decode(self, latents: torch.Tensor, output_type: str) -> list[Any]:
        """The VAE's images of latents already unscaled (and shifted)."""
        image = self.pipe.vae.decode(latents, return_dict=False)[0]
        return list(self.pipe.image_processor.postprocess(image, output_type=output_type))
