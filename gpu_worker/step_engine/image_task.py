"""Image-to-image and inpainting rows in a running set: each starts at its own step (its strength), from its own
image latents, and an inpainting row keeps its mask and image latents for every step.

:class:`ImageTasks` is the mixin of the adapters whose pipelines have both tasks (``FamilyAdapter.tasks``); it
mirrors diffusers' ``StableDiffusionImg2ImgPipeline`` and ``StableDiffusionInpaintPipeline`` (0.42) per row:

* the row's schedule is its steps' schedule from step ``steps - min(int(steps x strength), steps)`` on
  (``get_timesteps``, with the scheduler's ``set_begin_index`` where it has one), so a row of 4 steps at strength
  0.5 takes 2 denoiser calls;
* image-to-image: the input image through the VAE (a sample drawn with the row's generator), then the row's noise
  from the same generator, added at its first timestep (``scheduler.add_noise``), unscaled;
* inpainting: as the pipeline, in its draw order (image latents, noise, masked-image latents, all from the row's
  generator); strength 1 starts from noise x ``init_noise_sigma``. A 9-channel UNet (an inpainting model) gets the
  mask and the masked image's latents concatenated to its input at every step (:meth:`Inpainting.model_input`); a
  4-channel one keeps the unmasked part at the image's latents noised to the next timestep after every step
  (:meth:`Inpainting.after_step`).

Rows of different tasks and strengths share a set: they differ only in their own latents, schedule and condition.
The flow-matching families' image rows (SD3, Flux, Qwen-Image) are :mod:`gpu_worker.step_engine.flow_image_task`'s,
on the same :class:`Inpainting` condition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from gpu_worker.step_engine.rows import Row
from shared.contracts import Task

IMAGE_TASKS: frozenset[Task] = frozenset(Task)
"""What an adapter with :class:`ImageTasks` takes: text-to-image, image-to-image and inpainting."""


def first_step(steps: int, strength: float, order: int) -> int:
    """The index, into a schedule of ``steps`` steps (``order`` timesteps each), of the first timestep a row of
    ``strength`` denoises (diffusers' ``get_timesteps``)."""
    init_timestep = min(int(steps * strength), steps)
    return max(steps - init_timestep, 0) * order


def mask_condition(row: Row, vae_scale_factor: int, height: int, width: int) -> torch.Tensor:
    """The row's mask as the inpainting pipelines' ``mask_processor`` makes it: grayscale, at the canvas's size,
    binarised (1 = repaint), not normalised; ``(1, 1, height, width)``."""
    from diffusers.image_processor import VaeImageProcessor

    masks = VaeImageProcessor(
        vae_scale_factor=vae_scale_factor, do_normalize=False, do_binarize=True, do_convert_grayscale=True
    )
    condition: torch.Tensor = masks.preprocess(row.mask, height=height, width=width)
    return condition


@dataclass(slots=True, eq=False)
class Inpainting:
    """An inpainting row's own condition, kept for every step: its image latents (None where not needed), its
    initial noise, its mask at the latents' size and, where its denoiser takes them, its masked image's latents."""

    image_latents: torch.Tensor | None
    noise: torch.Tensor
    mask: torch.Tensor
    masked_image_latents: torch.Tensor | None
    """An inpainting denoiser's (a 9-channel UNet, a 33-channel SD3 transformer): mask and masked latents are part of
    its input (:meth:`model_input`); None: the latents are blended after each step instead (:meth:`after_step`)."""

    @property
    def concatenated(self) -> bool:
        """Whether the denoiser takes mask and masked latents as input (else the latents are blended)."""
        return self.masked_image_latents is not None

    def model_input(self, scaled: torch.Tensor) -> torch.Tensor:
        """The row's denoiser input from its scaled latents."""
        if self.masked_image_latents is None:
            return scaled
        return torch.cat([scaled, self.mask, self.masked_image_latents], dim=1)

    def noised(self, image_latents: torch.Tensor, scheduler: Any, timestep: torch.Tensor) -> torch.Tensor:
        """The image latents noised to ``timestep`` with the row's noise (``scheduler.add_noise``)."""
        noised: torch.Tensor = scheduler.add_noise(image_latents, self.noise, torch.tensor([timestep]))
        return noised

    def after_step(self, latents: torch.Tensor, scheduler: Any, next_timestep: torch.Tensor | None) -> torch.Tensor:
        """The row's latents after its scheduler step: the unmasked part put back at the image's latents, noised
        to the next timestep (none after the last step)."""
        if self.concatenated or self.image_latents is None:
            return latents
        proper = self.image_latents
        if next_timestep is not None:
            proper = self.noised(proper, scheduler, next_timestep)
        return (1 - self.mask) * proper + self.mask * latents


class ImageTasks:
    """Mixin of a ``FamilyAdapter`` (listed before it) whose pipeline family has image-to-image and inpainting
    pipelines over the same components."""

    tasks: ClassVar[frozenset[Task]] = IMAGE_TASKS
    pipe: Any
    canvas: Any
    denoiser: Any

    def begin(self, row: Row, scheduler: Any) -> int:
        """The row's first timestep index: its strength's for an image task (ValueError when that leaves no step)."""
        if not row.task.needs_image:
            return super().begin(row, scheduler)  # type: ignore[misc, no-any-return]
        begin = first_step(row.steps, row.denoising_strength, getattr(scheduler, "order", 1))
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(begin)
        if begin >= len(scheduler.timesteps):
            raise ValueError(f"row {row.id}: strength {row.strength} of {row.steps} steps leaves no step to denoise")
        return begin

    def encode_image(self, pixels: torch.Tensor, row: Row) -> torch.Tensor:
        """Image latents of ``pixels`` (a batch of one), sampled with the row's generator."""
        from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion_img2img import retrieve_latents

        vae = self.pipe.vae
        latents: torch.Tensor = retrieve_latents(vae.encode(pixels), generator=row.generator)
        scaled: torch.Tensor = vae.config.scaling_factor * latents
        return scaled

    def image_start(
        self, row: Row, scheduler: Any, begin: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, Inpainting | None]:
        """An image row's initial latents at its first timestep, and its inpainting condition (None for
        image-to-image)."""
        from diffusers.utils.torch_utils import randn_tensor

        device = self.pipe._execution_device
        first = scheduler.timesteps[begin : begin + 1]
        processor = self.pipe.image_processor
        height, width = self.canvas.height, self.canvas.width
        if row.task is Task.IMAGE_TO_IMAGE:
            pixels = processor.preprocess(row.image).to(device=device, dtype=dtype)
            encoded = self.encode_image(pixels, row)
            noise = randn_tensor(encoded.shape, generator=[row.generator], device=device, dtype=dtype)
            return scheduler.add_noise(encoded, noise, first), None
        denoiser_channels = int(self.denoiser.config.in_channels)
        latent_channels = int(self.pipe.vae.config.latent_channels)
        concatenated = denoiser_channels == 2 * latent_channels + 1
        strength_max = row.denoising_strength == 1.0
        image = processor.preprocess(row.image, height=height, width=width).to(dtype=torch.float32)
        scale = self.pipe.vae_scale_factor
        shape = (1, latent_channels, height // scale, width // scale)
        image_latents: torch.Tensor | None = None
        if not concatenated or not strength_max:
            # repeated to the batch as the pipeline does, which also makes it contiguous: the layout the blend of
            # every step computes in (a strided one rounds differently)
            image_latents = self.encode_image(image.to(device=device, dtype=dtype), row).repeat(1, 1, 1, 1)
        noise = randn_tensor(shape, generator=[row.generator], device=device, dtype=dtype)
        if strength_max:
            latents = noise * scheduler.init_noise_sigma
        else:
            latents = scheduler.add_noise(image_latents, noise, first)
        condition = mask_condition(row, scale, height, width)
        masked = (image * (condition < 0.5)).to(device=device, dtype=dtype)
        mask = torch.nn.functional.interpolate(condition, size=(height // scale, width // scale))
        # drawn for a 4-channel UNet too: the row's scheduler steps may draw from its generator after it
        masked_latents = self.encode_image(masked, row)
        inpainting = Inpainting(
            image_latents, noise, mask.to(device=device, dtype=dtype), masked_latents if concatenated else None
        )
        return latents, inpainting
