"""Flux (``FluxPipeline``, a ``FluxTransformer2DModel`` over packed latents with a flow-matching scheduler): the
step engine's adapter.

Mirrors ``FluxPipeline.__call__`` (diffusers 0.42) for text-to-image:

* CLIP (pooled projection) and T5 (``max_sequence_length`` tokens, the pipeline's default 512 unless the step key
  sets one) embeddings per row;
* **the guidance embedding per row**: a guidance-distilled transformer (``guidance_embeds``, Flux-dev) takes a
  ``(batch,)`` guidance tensor, so each row's own ``guidance_scale`` is its entry; there is no classifier-free
  guidance by ``guidance_scale`` (schnell-like transformers ignore the scale);
* **true CFG per row** (:mod:`gpu_worker.step_engine.true_cfg`): a row with a negative prompt and its own
  ``true_cfg_scale`` above 1 adds its negative half (the negative prompt's CLIP and T5 embeddings, its guidance
  entry) and is combined as ``neg + true_cfg_scale (cond - neg)``; every other row is one denoiser row;
* **packed latents**: each row's ``(channels, 2h, 2w)`` noise drawn from its own generator and packed into
  ``(h w, 4 channels)`` tokens as the pipeline packs them, unpacked at decode;
* **the rotary ids** (the image's ``img_ids`` grid and the text's zero ``txt_ids``) depend on the canvas and the
  sequence length only, so the set shares one pair: they are the adapter's, not a row's;
* each row's scheduler set from the pipeline's sigmas ``linspace(1, 1/steps, steps)`` (none with
  ``use_flow_sigmas``) and the dynamic shift ``mu`` of the image sequence length, starting at index 0;
* timesteps ``/ 1000`` in the latents' dtype, no scheduler-step arguments, and
  ``vae.decode(latents / scaling_factor + shift_factor)``.

IP adapters and ``joint_attention_kwargs`` are not used (the fleet sends neither).

Image-to-image and inpainting rows mirror ``FluxImg2ImgPipeline`` and ``FluxInpaintPipeline``
(:mod:`gpu_worker.step_engine.flow_image_task`): SD3's start step from strength, the image's shifted and scaled
latents, the row's noise mixed in at its first timestep by ``scheduler.scale_noise`` (at strength 1 too), packed;
an inpainting row's packed mask (repeated over the channels) blends its packed image latents, noised to the next
timestep, back into the unmasked part after each step. Those pipelines take the sigmas ``linspace(1, 1/steps,
steps)`` whatever ``use_flow_sigmas`` says, but every scheduler with ``use_flow_sigmas`` lacks the ``scale_noise``
they call: image rows on such a scheduler fail in both modes, so the rows' common ``scheduler_for`` is right.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from gpu_worker.step_engine.adapter import Canvas, Conditioning, Prompt, split
from gpu_worker.step_engine.flow_image_task import PackedFlowImageTasks
from gpu_worker.step_engine.rows import Row
from gpu_worker.step_engine.true_cfg import TrueCfgAdapter


class FluxAdapter(PackedFlowImageTasks, TrueCfgAdapter):
    family: ClassVar[str] = "flux"
    denoiser_name: ClassVar[str] = "transformer"
    scales_initial_noise: ClassVar[bool] = False

    def __init__(self, pipe: Any, canvas: Canvas) -> None:
        super().__init__(pipe, canvas)
        self.max_sequence_length: int = canvas.max_sequence_length or self.call_default("max_sequence_length")
        self.embeds_guidance = bool(pipe.transformer.config.guidance_embeds)
        self.img_ids: torch.Tensor | None = None  # the rotary ids, set at the first encode (in the embeddings' dtype)
        self.txt_ids: torch.Tensor | None = None

    @property
    def size_multiple(self) -> int:
        return int(self.pipe.vae_scale_factor * 2)  # the VAE's factor, and packing 2 x 2 latents into one token

    def latent_shape(self) -> tuple[int, int, int]:
        """Channels, height, width of one row's latents before packing."""
        scale = self.pipe.vae_scale_factor
        channels = int(self.denoiser.config.in_channels) // 4
        return channels, 2 * (self.canvas.height // (scale * 2)), 2 * (self.canvas.width // (scale * 2))

    def scheduler_for(self, steps: int) -> Any:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

        scheduler = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
        config = scheduler.config
        sigmas = None if config.get("use_flow_sigmas", False) else np.linspace(1.0, 1 / steps, steps).tolist()
        _, height, width = self.latent_shape()
        mu = calculate_shift(
            (height // 2) * (width // 2),
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas, mu=mu)
        scheduler.set_begin_index(0)
        return scheduler

    def initial_latents(self, rows: Sequence[Row], schedulers: Sequence[Any], dtype: torch.dtype) -> list[torch.Tensor]:
        """Each row's noise drawn from its own generator (one ``randn_tensor`` call with the list), packed."""
        from diffusers.utils.torch_utils import randn_tensor

        channels, height, width = self.latent_shape()
        shape = (len(rows), channels, height, width)
        noise = randn_tensor(shape, generator=[row.generator for row in rows], device=self.device, dtype=dtype)
        packed = self.pipe._pack_latents(noise, len(rows), channels, height, width)
        return [packed[i : i + 1] for i in range(len(rows))]

    def _encode(self, prompts: list[str], rows: Sequence[Row]) -> list[dict[str, torch.Tensor]]:
        """The CLIP pooled and T5 embeddings of ``prompts`` (one call), each with its row's guidance entry."""
        embeds, pooled, txt_ids = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            device=self.device,
            num_images_per_prompt=1,
            max_sequence_length=self.max_sequence_length,
        )
        _, height, width = self.latent_shape()
        self.img_ids = self.pipe._prepare_latent_image_ids(1, height // 2, width // 2, self.device, embeds.dtype)
        self.txt_ids = txt_ids
        halves = split({"encoder_hidden_states": embeds, "pooled_projections": pooled}, len(prompts))
        if self.embeds_guidance:
            for half, row in zip(halves, rows, strict=True):
                half["guidance"] = torch.full([1], row.guidance_scale, device=self.device, dtype=torch.float32)
        return halves

    def encode(self, rows: Sequence[Row]) -> list[Prompt]:
        conds = self._encode([row.prompt for row in rows], rows)
        guided = [row for row in rows if self.guided(row)]
        negatives = iter(self._encode([row.negative_prompt or "" for row in guided], guided) if guided else [])
        return [
            Prompt(cond, next(negatives) if self.guided(row) else None) for cond, row in zip(conds, rows, strict=True)
        ]

    def denoise(self, sample: torch.Tensor, timesteps: torch.Tensor, conditioning: Conditioning) -> torch.Tensor:
        transformer = self.pipe.transformer
        with transformer.cache_context("cond"):
            out: torch.Tensor = transformer(
                hidden_states=sample,
                timestep=timesteps.to(sample.dtype) / 1000,
                guidance=conditioning.get("guidance"),
                pooled_projections=conditioning["pooled_projections"],
                encoder_hidden_states=conditioning["encoder_hidden_states"],
                txt_ids=self.txt_ids,
                img_ids=self.img_ids,
                joint_attention_kwargs={},
                return_dict=False,
            )[0]
        return out

    def decode(self, latents: torch.Tensor, output_type: str) -> list[Any]:
        pipe, vae = self.pipe, self.pipe.vae
        latents = pipe._unpack_latents(latents, self.canvas.height, self.canvas.width, pipe.vae_scale_factor)
        latents = latents / vae.config.scaling_factor + vae.config.shift_factor
        image = vae.decode(latents, return_dict=False)[0]
        return list(pipe.image_processor.postprocess(image, output_type=output_type))
