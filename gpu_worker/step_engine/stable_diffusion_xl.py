"""Stable Diffusion XL (``StableDiffusionXLPipeline``, a ``UNet2DConditionModel`` with ``text_time`` added
conditions): the step engine's adapter.

Mirrors ``StableDiffusionXLPipeline.__call__`` (diffusers 0.42) for text-to-image. What differs from Stable
Diffusion 1.x/2.x (whose adapter this one extends: the same UNet refusal, input scaling, guidance with rescale and
scheduler-step arguments):

* two CLIP encoders (the second's pooled projection is the row's ``text_embeds``), each row's prompt for both;
* a guided row without a negative prompt is guided by **zeros** (embeddings and pooled) when the pipeline's
  ``force_zeros_for_empty_prompt`` is set (the pipeline's ``negative_prompt=None``), else by the empty prompt; a
  row with one by its own, so rows with and without negatives share a set;
* the added time ids ``(height, width, 0, 0, height, width)`` (original size, crop, target size: the canvas's),
  per row, for both halves;
* each row's scheduler starts at index 0 (``set_begin_index(0)``, as the pipeline sets);
* decoding with the VAE's ``latents_mean`` / ``latents_std`` where configured (else ``/ scaling_factor``), the
  float16 VAE upcast the pipeline does (``force_upcast``), and the pipeline's watermarker where it has one.

Image-to-image and inpainting rows as SD's (``gpu_worker.step_engine.image_task``), their images encoded as
``StableDiffusionXLImg2ImgPipeline`` / ``StableDiffusionXLInpaintPipeline`` encode them (the VAE upcast to float32
where ``force_upcast``; image-to-image's ``latents_mean`` / ``latents_std`` where configured); no aesthetic-score
conditions (``requires_aesthetics_score`` off, the derived pipelines' default), so their time ids are text-to-image's.

``denoising_end``, ``denoising_start``, IP adapters, micro-conditioning other than the defaults and ``clip_skip``
are not used (the fleet sends none of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from gpu_worker.step_engine.adapter import Conditioning, Prompt, split
from gpu_worker.step_engine.rows import Row
from gpu_worker.step_engine.stable_diffusion import StableDiffusionAdapter
from shared.contracts import Task


class StableDiffusionXLAdapter(StableDiffusionAdapter):
    family: ClassVar[str] = "stable-diffusion-xl"

    def scheduler_for(self, steps: int) -> Any:
        scheduler = super().scheduler_for(steps)
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(0)
        return scheduler

    def encode_image(self, pixels: torch.Tensor, row: Row) -> torch.Tensor:
        from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion_img2img import retrieve_latents

        vae = self.pipe.vae
        config = vae.config
        dtype = pixels.dtype
        if config.force_upcast:
            pixels = pixels.float()
            vae.to(dtype=torch.float32)
        try:
            latents: torch.Tensor = retrieve_latents(vae.encode(pixels), generator=row.generator)
        finally:
            if config.force_upcast:
                vae.to(dtype)
        latents = latents.to(dtype)
        mean, std = getattr(config, "latents_mean", None), getattr(config, "latents_std", None)
        if row.task is Task.IMAGE_TO_IMAGE and mean is not None and std is not None:
            mean_t = torch.tensor(mean).view(1, 4, 1, 1).to(latents.device, dtype)
            std_t = torch.tensor(std).view(1, 4, 1, 1).to(latents.device, dtype)
            shifted: torch.Tensor = (latents - mean_t) * config.scaling_factor / std_t
            return shifted
        scaled: torch.Tensor = config.scaling_factor * latents
        return scaled

    def time_ids(self, dtype: torch.dtype, pooled: torch.Tensor) -> torch.Tensor:
        """One row's added time ids: original size, crop top-left (0, 0), target size (both the canvas's)."""
        size = (self.canvas.height, self.canvas.width)
        encoder_2 = self.pipe.text_encoder_2
        projection = int(pooled.shape[-1]) if encoder_2 is None else encoder_2.config.projection_dim
        ids: torch.Tensor = self.pipe._get_add_time_ids(
            size, (0, 0), size, dtype=dtype, text_encoder_projection_dim=projection
        )
        return ids.to(self.device)

    def encode(self, rows: Sequence[Row]) -> list[Prompt]:
        guided = [self.guided(row) for row in rows]
        negatives = [row.negative_prompt for row in rows]
        cond, uncond, pooled, uncond_pooled = self.pipe.encode_prompt(
            prompt=[row.prompt for row in rows],
            prompt_2=None,
            device=self.device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=any(guided),
            # all None: the pipeline's own negative_prompt=None (zeros where force_zeros_for_empty_prompt)
            negative_prompt=None if all(n is None for n in negatives) else [n or "" for n in negatives],
        )
        time_ids = self.time_ids(cond.dtype, pooled)
        conds = split({"encoder_hidden_states": cond, "text_embeds": pooled}, len(rows))
        unconds: list[dict[str, torch.Tensor] | None] = [None] * len(rows)
        if any(guided):
            unconds = [*split({"encoder_hidden_states": uncond, "text_embeds": uncond_pooled}, len(rows))]
            zeros = self.pipe.config.force_zeros_for_empty_prompt
            for i, negative in enumerate(negatives):
                half = unconds[i]
                if negative is None and zeros and half is not None:
                    unconds[i] = {name: torch.zeros_like(tensor) for name, tensor in half.items()}
        prompts = []
        for c, u, g in zip(conds, unconds, guided, strict=True):
            c["time_ids"] = time_ids
            if u is not None:
                u["time_ids"] = time_ids
            prompts.append(Prompt(c, u if g else None))
        return prompts

    def added_conditions(self, conditioning: Conditioning) -> dict[str, torch.Tensor] | None:
        return {"text_embeds": conditioning["text_embeds"], "time_ids": conditioning["time_ids"]}

    def decode(self, latents: torch.Tensor, output_type: str) -> list[Any]:
        vae = self.pipe.vae
        config = vae.config
        upcast = vae.dtype == torch.float16 and config.force_upcast
        if upcast:
            vae.to(dtype=torch.float32)
            latents = latents.to(torch.float32)
        mean, std = getattr(config, "latents_mean", None), getattr(config, "latents_std", None)
        if mean is not None and std is not None:
            mean_t = torch.tensor(mean).view(1, 4, 1, 1).to(latents.device, latents.dtype)
            std_t = torch.tensor(std).view(1, 4, 1, 1).to(latents.device, latents.dtype)
            latents = latents * std_t / config.scaling_factor + mean_t
        else:
            latents = latents / config.scaling_factor
        try:
            image = vae.decode(latents, return_dict=False)[0]
        finally:
            if upcast:
                vae.to(dtype=torch.float16)
        watermark = getattr(self.pipe, "watermark", None)
        if watermark is not None:
            image = watermark.apply_watermark(image)
        return list(self.pipe.image_processor.postprocess(image, output_type=output_type))
