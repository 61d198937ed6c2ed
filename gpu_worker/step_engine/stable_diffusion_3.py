"""Stable Diffusion 3 (``StableDiffusion3Pipeline``, an ``SD3Transformer2DModel`` with a flow-matching scheduler):
the step engine's adapter.

Mirrors ``StableDiffusion3Pipeline.__call__`` (diffusers 0.42) for text-to-image: two CLIP encoders and T5 (zeros
of ``max_sequence_length`` tokens without T5), the empty prompt for a guided row without a negative prompt,
unscaled initial latents, no ``scale_model_input``, per-row timesteps straight into the transformer, plain
classifier-free guidance (the pipeline takes no ``guidance_rescale``; a row's rescale is ignored, as the
request-level runner leaves it out), no extra scheduler-step arguments, the dynamic shift ``mu`` of the image
sequence length when the scheduler uses it, and ``vae.decode(latents / scaling_factor + shift_factor)``.
Skip-layer guidance and IP adapters are not used (the fleet sends neither).

Image-to-image rows mirror ``StableDiffusion3Img2ImgPipeline``: the first step is
``int(max(steps - steps x strength, 0))`` (a float product, unlike SD's ``int(steps x strength)``), the image's
latents are ``(sample - shift_factor) x scaling_factor`` (drawn with the row's generator), then the row's noise from
the same generator, mixed in at the first timestep by ``scheduler.scale_noise``. Inpainting stays request-level
for this family in step mode (not in ``tasks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpu_worker.step_engine.adapter import Canvas, Conditioning, FamilyAdapter, Prompt, split
from gpu_worker.step_engine.image_task import flow_begin, flow_image_latents
from gpu_worker.step_engine.rows import Row
from shared.contracts import Task

if TYPE_CHECKING:
    from gpu_worker.step_engine.image_task import Inpainting


class StableDiffusion3Adapter(FamilyAdapter):
    family: ClassVar[str] = "stable-diffusion-3"
    denoiser_name: ClassVar[str] = "transformer"
    scales_initial_noise: ClassVar[bool] = False
    rescales_guidance: ClassVar[bool] = False
    tasks: ClassVar[frozenset[Task]] = frozenset({Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE})

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

    def begin(self, row: Row, scheduler: Any) -> int:
        """The row's first timestep index: its strength's for image-to-image (``get_timesteps`` of the img2img
        pipeline)."""
        return flow_begin(row, scheduler)

    def image_start(
        self, row: Row, scheduler: Any, begin: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, Inpainting | None]:
        """An image-to-image row's initial latents: its image's latents noised to its first timestep."""
        if row.task is not Task.IMAGE_TO_IMAGE:
            return super().image_start(row, scheduler, begin, dtype)
        from diffusers.utils.torch_utils import randn_tensor

        encoded = flow_image_latents(self.pipe, row, self.canvas.height, self.canvas.width, dtype)
        noise = randn_tensor(encoded.shape, generator=row.generator, device=self.device, dtype=dtype)
        first = scheduler.timesteps[begin : begin + 1]
        latents: torch.Tensor = scheduler.scale_noise(encoded, first, noise).to(device=self.device, dtype=dtype)
        return latents, None

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
        image = vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor, return_dict=False)[0]
        return list(self.pipe.image_processor.postprocess(image, output_type=output_type))
