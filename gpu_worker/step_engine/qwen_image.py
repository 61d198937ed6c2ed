"""Qwen-Image (``QwenImagePipeline``, a ``QwenImageTransformer2DModel`` over packed latents with a flow-matching
scheduler): the step engine's adapter.

Mirrors ``QwenImagePipeline.__call__`` (diffusers 0.42) for text-to-image:

* Qwen2.5-VL prompt embeddings, the pipeline's template prefix dropped, each row's **of its own length** (the
  pipeline pads a batch to its longest prompt and masks the padding, a solo call has no mask); a denoiser call pads
  its rows to the longest of the call with the mask (:meth:`QwenImageAdapter.collate`), no mask when every row is
  of one length, as the pipeline does;
* **true CFG per row** (:mod:`gpu_worker.step_engine.true_cfg`): a row with a negative prompt and a true CFG scale
  above 1 (its own, else the pipeline's default 4.0) adds its negative half, combined as
  ``neg + s (cond - neg)`` and rescaled to the conditional prediction's norm per token, as the pipeline does;
* the guidance embedding per row where the transformer has ``guidance_embeds`` (as Flux); ignored without;
* **packed latents**: each row's ``(1, channels, 2h, 2w)`` noise from its own generator, packed into
  ``(h w, 4 channels)`` tokens (``prepare_latents``, one call for the rows joining), ``img_shapes`` of the canvas;
* each row's scheduler from the sigmas ``linspace(1, 1/steps, steps)`` and the shift ``mu`` of the image sequence
  length, begin index 0; timesteps ``/ 1000``; no scheduler-step arguments;
* decode: unpacked, ``latents / (1 / latents_std) + latents_mean``, the VAE's first (only) frame.

``attention_kwargs`` are not used (the fleet sends none).

Image-to-image and inpainting rows mirror ``QwenImageImg2ImgPipeline`` and ``QwenImageInpaintPipeline``
(:mod:`gpu_worker.step_engine.flow_image_task`, as Flux's): the image as one frame through the VAE (a sample from
the row's generator), normalised by ``latents_mean`` / ``latents_std``, its noise (one frame) mixed in at the first
timestep by ``scale_noise``, packed; an inpainting row's packed mask blends its image latents back after each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from gpu_worker.step_engine.adapter import Canvas, Conditioning, Prompt
from gpu_worker.step_engine.flow_image_task import PackedFlowImageTasks, flow_pixels
from gpu_worker.step_engine.rows import Row
from gpu_worker.step_engine.true_cfg import TrueCfgAdapter

EMBEDS = "encoder_hidden_states"
MASK = "encoder_hidden_states_mask"


class QwenImageAdapter(PackedFlowImageTasks, TrueCfgAdapter):
    family: ClassVar[str] = "qwen-image"
    denoiser_name: ClassVar[str] = "transformer"
    scales_initial_noise: ClassVar[bool] = False

    def __init__(self, pipe: Any, canvas: Canvas) -> None:
        super().__init__(pipe, canvas)
        self.max_sequence_length: int = canvas.max_sequence_length or self.call_default("max_sequence_length")
        self.embeds_guidance = bool(pipe.transformer.config.guidance_embeds)

    @property
    def size_multiple(self) -> int:
        return int(self.pipe.vae_scale_factor * 2)  # the VAE's factor, and packing 2 x 2 latents into one token

    def latent_shape(self) -> tuple[int, int, int]:
        """Channels, height, width of one row's latents before packing."""
        scale = self.pipe.vae_scale_factor
        channels = int(self.denoiser.config.in_channels) // 4
        return channels, 2 * (self.canvas.height // (scale * 2)), 2 * (self.canvas.width // (scale * 2))

    def scheduler_for(self, steps: int) -> Any:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps

        scheduler = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
        config = scheduler.config
        _, height, width = self.latent_shape()
        mu = calculate_shift(
            (height // 2) * (width // 2),
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        sigmas = np.linspace(1.0, 1 / steps, steps).tolist()
        retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas, mu=mu)
        scheduler.set_begin_index(0)
        return scheduler

    def initial_latents(self, rows: Sequence[Row], schedulers: Sequence[Any], dtype: torch.dtype) -> list[torch.Tensor]:
        """Each row's noise from its own generator, packed (the pipeline's ``prepare_latents``, one call)."""
        channels = int(self.denoiser.config.in_channels) // 4
        packed = self.pipe.prepare_latents(
            len(rows),
            channels,
            self.canvas.height,
            self.canvas.width,
            dtype,
            self.device,
            [row.generator for row in rows],
        )
        return [packed[i : i + 1] for i in range(len(rows))]

    def image_latents(self, row: Row, dtype: torch.dtype) -> torch.Tensor:
        """The row's image as one frame through the VAE (a sample from its generator), normalised by
        ``latents_mean`` / ``latents_std``, frames before channels: ``(1, 1, channels, h, w)``."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_img2img import retrieve_latents

        vae = self.pipe.vae
        pixels = flow_pixels(self.pipe, row, self.canvas.height, self.canvas.width)
        pixels = pixels.unsqueeze(2).to(device=self.device, dtype=dtype)
        sample = retrieve_latents(vae.encode(pixels), generator=row.generator)
        z_dim = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1).to(sample.device, sample.dtype)
        inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1).to(sample.device, sample.dtype)
        return torch.cat([(sample - mean) * inverse_std], dim=0).transpose(1, 2)

    def noise_shape(self) -> tuple[int, ...]:
        return (1, 1, *self.latent_shape())  # one frame

    def _encode(self, prompts: list[str], rows: Sequence[Row]) -> list[dict[str, torch.Tensor]]:
        """Each prompt's embeddings (one call), unpadded, with its row's guidance entry where the model embeds it."""
        embeds, mask = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, num_images_per_prompt=1, max_sequence_length=self.max_sequence_length
        )
        lengths = [embeds.shape[1]] * len(prompts) if mask is None else [int(n) for n in mask.sum(dim=1)]
        halves = [{EMBEDS: embeds[i : i + 1, :length]} for i, length in enumerate(lengths)]
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

    def collate(self, halves: Sequence[Conditioning]) -> dict[str, torch.Tensor]:
        """The halves' embeddings padded with zeros to the longest, with the mask of their own tokens (none when
        they are all of one length: the pipeline's unmasked call)."""
        lengths = [half[EMBEDS].shape[1] for half in halves]
        longest = max(lengths)
        embeds = torch.cat(
            [torch.nn.functional.pad(half[EMBEDS], (0, 0, 0, longest - half[EMBEDS].shape[1])) for half in halves]
        )
        conditioning = {EMBEDS: embeds}
        if min(lengths) < longest:
            positions = torch.arange(longest, device=embeds.device)
            conditioning[MASK] = (positions[None, :] < torch.tensor(lengths, device=embeds.device)[:, None]).long()
        if self.embeds_guidance:
            conditioning["guidance"] = torch.cat([half["guidance"] for half in halves])
        return conditioning

    def guide(self, uncond: torch.Tensor, cond: torch.Tensor, row: Row) -> torch.Tensor:
        """True CFG, then rescaled to the conditional prediction's norm per token (the pipeline's)."""
        combined = super().guide(uncond, cond, row)
        rescaled: torch.Tensor = combined * (
            torch.norm(cond, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True)
        )
        return rescaled

    def denoise(self, sample: torch.Tensor, timesteps: torch.Tensor, conditioning: Conditioning) -> torch.Tensor:
        _, height, width = self.latent_shape()
        transformer = self.pipe.transformer
        with transformer.cache_context("cond"):
            out: torch.Tensor = transformer(
                hidden_states=sample,
                timestep=timesteps.to(sample.dtype) / 1000,
                guidance=conditioning.get("guidance"),
                encoder_hidden_states_mask=conditioning.get(MASK),
                encoder_hidden_states=conditioning[EMBEDS],
                img_shapes=[[(1, height // 2, width // 2)]] * sample.shape[0],
                attention_kwargs={},
                return_dict=False,
            )[0]
        return out

    def decode(self, latents: torch.Tensor, output_type: str) -> list[Any]:
        pipe, vae = self.pipe, self.pipe.vae
        latents = pipe._unpack_latents(latents, self.canvas.height, self.canvas.width, pipe.vae_scale_factor)
        latents = latents.to(vae.dtype)
        mean = (
            torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(latents.device, latents.dtype)
        )
        inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1)
        latents = latents / inverse_std.to(latents.device, latents.dtype) + mean
        image = vae.decode(latents, return_dict=False)[0][:, :, 0]
        return list(pipe.image_processor.postprocess(image, output_type=output_type))
