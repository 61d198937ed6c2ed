"""LTX-Video (``LTXPipeline``, an ``LTXVideoTransformer3DModel`` over packed video latents with a flow-matching
scheduler): the step engine's adapter.

Mirrors ``LTXPipeline.__call__`` (diffusers 0.42) for text-to-video:

* **frames are the canvas's** (the step key's ``num_frames`` and ``fps``; None: the family's defaults, 161 frames
  at 25 fps, as the request-level runner calls it): every row of a set has the latent grid
  ``((frames - 1) / temporal + 1, height / spatial, width / spatial)`` and the rotary interpolation scale
  ``(temporal / fps, spatial, spatial)``;
* T5 embeddings of ``max_sequence_length`` tokens (the pipeline's default 128) with their attention masks per row;
  a guided row (guidance scale above 1) without a negative prompt is guided by ``""``, as the pipeline does;
* **video latents packing**: each row's ``(channels, frames, h, w)`` noise in float32 from its own generator, packed
  into tokens by the pipeline's ``prepare_latents`` (one call for the rows joining), the denoiser's input in the
  embeddings' dtype and its prediction back in float32;
* classifier-free guidance with the row's own scale and ``guidance_rescale``;
* each row's scheduler from the sigmas ``linspace(1, 1/steps, steps)`` and the shift ``mu`` of the video sequence
  length; no scheduler-step arguments;
* **decode to frames**: unpacked, denormalised by the VAE's ``latents_mean`` / ``latents_std``, decoded at
  ``decode_timestep`` 0 where the VAE is timestep-conditioned (the pipeline's default: its noise is scaled by 0),
  each row a :class:`gpu_worker.runner.Video` of PIL frames at the canvas's frame rate.

``attention_kwargs`` and a ``decode_timestep`` other than the default are not used (the fleet sends neither).

Image-to-video rows (task ``image-to-image``, the image the first frame) mirror ``LTXImageToVideoPipeline``
(:mod:`gpu_worker.step_engine.ltx_image_task`): the image's latents as the first latent frame, kept through every
step, and a timestep per token (0 on that frame) in a call with such a row; they share a set with text rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from gpu_worker.families import family_of
from gpu_worker.runner import Video
from gpu_worker.step_engine.adapter import Canvas, Conditioning, FamilyAdapter, Prompt, split
from gpu_worker.step_engine.ltx_image_task import CONDITIONING_MASK, LtxImageToVideo, timestep_of
from gpu_worker.step_engine.rows import Row


class LtxVideoAdapter(LtxImageToVideo, FamilyAdapter):
    family: ClassVar[str] = "ltx-video"
    denoiser_name: ClassVar[str] = "transformer"
    scales_initial_noise: ClassVar[bool] = False
    rescales_guidance: ClassVar[bool] = True
    video: ClassVar[bool] = True

    def __init__(self, pipe: Any, canvas: Canvas) -> None:
        super().__init__(pipe, canvas)
        traits = family_of(pipe).traits
        self.max_sequence_length: int = canvas.max_sequence_length or self.call_default("max_sequence_length")
        self.num_frames: int = canvas.num_frames or traits.default_frames or self.call_default("num_frames")
        self.frame_rate: int = canvas.fps or traits.default_fps or self.call_default("frame_rate")

    @property
    def size_multiple(self) -> int:
        return int(self.pipe.vae_spatial_compression_ratio)  # LTXPipeline.check_inputs: multiples of 32

    def latent_grid(self) -> tuple[int, int, int]:
        """Latent frames, height, width of every row (the canvas's)."""
        pipe, spatial = self.pipe, self.pipe.vae_spatial_compression_ratio
        frames = (self.num_frames - 1) // pipe.vae_temporal_compression_ratio + 1
        return frames, self.canvas.height // spatial, self.canvas.width // spatial

    def scheduler_for(self, steps: int) -> Any:
        from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift, retrieve_timesteps

        scheduler = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
        config = scheduler.config
        frames, height, width = self.latent_grid()
        mu = calculate_shift(
            frames * height * width,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        retrieve_timesteps(scheduler, steps, self.device, sigmas=np.linspace(1.0, 1 / steps, steps).tolist(), mu=mu)
        return scheduler

    def initial_latents(self, rows: Sequence[Row], schedulers: Sequence[Any], dtype: torch.dtype) -> list[torch.Tensor]:
        """Each row's float32 noise from its own generator, packed (the pipeline's ``prepare_latents``, one call)."""
        packed = self.pipe.prepare_latents(
            len(rows),
            int(self.denoiser.config.in_channels),
            self.canvas.height,
            self.canvas.width,
            self.num_frames,
            torch.float32,
            self.device,
            [row.generator for row in rows],
        )
        return [packed[i : i + 1] for i in range(len(rows))]

    def encode(self, rows: Sequence[Row]) -> list[Prompt]:
        guided = [self.guided(row) for row in rows]
        embeds, mask, negative, negative_mask = self.pipe.encode_prompt(
            prompt=[row.prompt for row in rows],
            negative_prompt=[row.negative_prompt or "" for row in rows] if any(guided) else None,
            do_classifier_free_guidance=any(guided),
            num_videos_per_prompt=1,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        conds = split({"encoder_hidden_states": embeds, "encoder_attention_mask": mask}, len(rows))
        self.with_first_frame(conds, rows)
        unconds: list[dict[str, torch.Tensor] | None] = [None] * len(rows)
        if any(guided):
            negatives = split({"encoder_hidden_states": negative, "encoder_attention_mask": negative_mask}, len(rows))
            self.with_first_frame(negatives, rows)
            unconds = [*negatives]
        return [Prompt(c, u if g else None) for c, u, g in zip(conds, unconds, guided, strict=True)]

    def denoise(self, sample: torch.Tensor, timesteps: torch.Tensor, conditioning: Conditioning) -> torch.Tensor:
        pipe = self.pipe
        embeds = conditioning["encoder_hidden_states"]
        frames, height, width = self.latent_grid()
        spatial = pipe.vae_spatial_compression_ratio
        with pipe.transformer.cache_context("cond_uncond"):
            out: torch.Tensor = pipe.transformer(
                hidden_states=sample.to(embeds.dtype),
                encoder_hidden_states=embeds,
                timestep=timestep_of(timesteps, conditioning.get(CONDITIONING_MASK)),
                encoder_attention_mask=conditioning["encoder_attention_mask"],
                num_frames=frames,
                height=height,
                width=width,
                rope_interpolation_scale=(pipe.vae_temporal_compression_ratio / self.frame_rate, spatial, spatial),
                attention_kwargs=None,
                return_dict=False,
            )[0]
        return out.float()

    def decode(self, latents: torch.Tensor, output_type: str) -> list[Any]:
        pipe, vae = self.pipe, self.pipe.vae
        frames, height, width = self.latent_grid()
        patch, patch_t = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
        latents = pipe._unpack_latents(latents, frames, height, width, patch, patch_t)
        latents = pipe._denormalize_latents(latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
        latents = latents.to(pipe.text_encoder.dtype).to(vae.dtype)
        timestep = None
        if vae.config.timestep_conditioning:  # decode_timestep 0: the pipeline's noise is scaled by 0
            timestep = torch.zeros(latents.shape[0], device=latents.device, dtype=latents.dtype)
        video = vae.decode(latents, timestep, return_dict=False)[0]
        decoded = pipe.video_processor.postprocess_video(video, output_type=output_type)
        if output_type != "pil":
            return list(decoded)
        return [Video(frames=list(clip), fps=self.frame_rate) for clip in decoded]
