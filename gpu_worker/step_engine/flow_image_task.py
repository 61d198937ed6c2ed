"""Image-to-image and inpainting rows of the flow-matching families (SD3, Flux, Qwen-Image) in a running set.

:class:`FlowImageTasks` (SD3) and :class:`PackedFlowImageTasks` (Flux and Qwen-Image, whose latents are packed
into 2 x 2 tokens) are the mixins of those adapters; they mirror the families' img2img and inpaint pipelines
(``StableDiffusion3Img2ImgPipeline`` / ``StableDiffusion3InpaintPipeline``, ``FluxImg2ImgPipeline`` /
``FluxInpaintPipeline``, ``QwenImageImg2ImgPipeline`` / ``QwenImageInpaintPipeline``; diffusers 0.42) per row:

* the first step: ``int(max(steps - steps x strength, 0))`` (a float product, unlike SD's ``int(steps x strength)``:
  any strength above 0 leaves a step), set as the row's scheduler's begin index (:func:`flow_begin`);
* the row's generator draws, in the pipelines' order, its image's latents (the family's ``image_latents``: a VAE
  sample, shifted and scaled, or normalised by ``latents_mean`` / ``latents_std``), then its noise;
* initial latents: the image latents and the noise mixed at the first timestep (``scheduler.scale_noise``), packed
  where the family packs; SD3's inpainting at strength 1 starts from the noise itself (``full_strength_is_noise``),
  Flux's and Qwen-Image's mix at strength 1 too, as their pipelines do;
* inpainting (:class:`FlowInpainting`): the mask binarised at the canvas (white = repaint), nearest-interpolated to
  the latents' size (Flux, Qwen-Image: repeated over the channels and packed); after each scheduler step the
  unmasked part is reset to the image latents noised to the next timestep (``scale_noise``; none after the last),
  ``(1 - mask) x image + mask x latents``. A 33-channel SD3 transformer (an inpainting model: 16 latent channels,
  the mask, 16 masked-image channels) instead gets the mask and the masked image's latents (the generator's third
  draw) concatenated to its input at every step, with no blend; at strength 1 it draws no image latents, as its
  pipeline. A 16- or 64-channel transformer takes no masked-image latents: the pipelines draw them last and never
  use them, and nothing draws from the row's generator after them (these schedulers' steps take none), so they
  are not computed.

Rows of every task and strength share a set: they differ only in their own latents, schedule and condition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpu_worker.step_engine.image_task import IMAGE_TASKS, Inpainting, mask_condition
from gpu_worker.step_engine.rows import Row
from shared.contracts import Task


def flow_begin(row: Row, scheduler: Any) -> int:
    """An image row's first timestep index in the flow-matching image pipelines (``int(max(steps - steps x
    strength, 0))``, a float product, x the scheduler's order), set as the scheduler's begin index; 0 for a
    text-to-image row. Any strength above 0 leaves at least one step."""
    if not row.task.needs_image:
        return 0
    init_timestep = min(row.steps * row.denoising_strength, row.steps)
    begin = int(max(row.steps - init_timestep, 0)) * getattr(scheduler, "order", 1)
    if hasattr(scheduler, "set_begin_index"):
        scheduler.set_begin_index(begin)
    return begin


def flow_pixels(pipe: Any, row: Row, height: int, width: int) -> torch.Tensor:
    """The row's input image as the flow image pipelines preprocess it: at the canvas's size, float32."""
    pixels: torch.Tensor = pipe.image_processor.preprocess(row.image, height=height, width=width)
    return pixels.to(dtype=torch.float32)


def flow_encode(pipe: Any, pixels: torch.Tensor, row: Row, dtype: torch.dtype) -> torch.Tensor:
    """Latents of ``pixels`` (a batch of one) as SD3's and Flux's image pipelines encode them: a VAE sample drawn
    with the row's generator, ``(sample - shift_factor) x scaling_factor``."""
    from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3_img2img import retrieve_latents

    vae = pipe.vae
    pixels = pixels.to(device=pipe._execution_device, dtype=dtype)
    sample = retrieve_latents(vae.encode(pixels), generator=row.generator)
    encoded: torch.Tensor = (sample - vae.config.shift_factor) * vae.config.scaling_factor
    return encoded


def flow_image_latents(pipe: Any, row: Row, height: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """The row's input image's latents as SD3's and Flux's image pipelines take them (:func:`flow_encode` of its
    :func:`flow_pixels`), a contiguous copy as theirs (``torch.cat`` / ``repeat``)."""
    return torch.cat([flow_encode(pipe, flow_pixels(pipe, row, height, width), row, dtype)], dim=0)


class FlowInpainting(Inpainting):
    """An inpainting row of a flow-matching family: its image latents are noised by ``scheduler.scale_noise``
    (which takes the sigma of the row's scheduler's step index: the next timestep's, after a step)."""

    def noised(self, image_latents: torch.Tensor, scheduler: Any, timestep: torch.Tensor) -> torch.Tensor:
        noised: torch.Tensor = scheduler.scale_noise(image_latents, torch.tensor([timestep]), self.noise)
        return noised


class FlowImageTasks:
    """Mixin of a flow-matching ``FamilyAdapter`` (listed before it) with image-to-image and inpainting rows over
    unpacked latents (SD3); the family gives :meth:`image_latents` and :meth:`noise_shape`."""

    tasks: ClassVar[frozenset[Task]] = IMAGE_TASKS
    full_strength_is_noise: ClassVar[bool] = False
    """Whether an inpainting row at strength 1 starts from its noise alone (SD3's ``is_strength_max``) rather than
    from ``scale_noise`` at the first timestep (Flux, Qwen-Image)."""
    pipe: Any
    canvas: Any
    denoiser: Any

    if TYPE_CHECKING:  # the FamilyAdapter's (listed after the mixin)

        @property
        def device(self) -> torch.device: ...

        def latent_shape(self) -> tuple[int, int, int]: ...

    def begin(self, row: Row, scheduler: Any) -> int:
        """The row's first timestep index: its strength's for an image row (:func:`flow_begin`)."""
        return flow_begin(row, scheduler)

    @property
    def mask_scale_factor(self) -> int:
        """The ``vae_scale_factor`` of the inpaint pipeline's ``mask_processor``."""
        return int(self.pipe.vae_scale_factor)

    def image_latents(self, row: Row, dtype: torch.dtype) -> torch.Tensor:
        """The row's input image's latents, unpacked, as its family's image pipelines encode them (a sample drawn
        with the row's generator)."""
        return flow_image_latents(self.pipe, row, self.canvas.height, self.canvas.width, dtype)

    def noise_shape(self) -> tuple[int, ...]:
        """The shape of one image row's noise, unpacked (the pipelines' ``randn_tensor`` shape)."""
        channels = int(self.pipe.vae.config.latent_channels)
        _, height, width = self.latent_shape()
        return (1, channels, height, width)

    def pack(self, latents: torch.Tensor) -> torch.Tensor:
        """Unpacked latents (a batch of one) as the denoiser takes them (SD3: as they are)."""
        return latents

    def latent_mask(self, condition: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The mask at the latents' size as the pipeline's ``prepare_mask_latents`` makes it (one channel)."""
        _, height, width = self.latent_shape()
        mask = torch.nn.functional.interpolate(condition, size=(height, width))
        return mask.to(device=self.device, dtype=dtype)

    def concatenates_mask(self) -> bool:
        """Whether the denoiser is an inpainting one: latents, mask and masked-image latents as its input."""
        latent_channels = int(self.pipe.vae.config.latent_channels)
        return int(self.denoiser.config.in_channels) == 2 * latent_channels + 1

    def image_start(
        self, row: Row, scheduler: Any, begin: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, Inpainting | None]:
        """An image row's initial latents at its first timestep, and its inpainting condition (None for
        image-to-image)."""
        from diffusers.utils.torch_utils import randn_tensor

        inpainting = row.task is Task.INPAINT
        concatenated = inpainting and self.concatenates_mask()
        pure_noise = inpainting and self.full_strength_is_noise and row.denoising_strength == 1.0
        encoded = None if concatenated and pure_noise else self.image_latents(row, dtype)
        noise = randn_tensor(self.noise_shape(), generator=row.generator, device=self.device, dtype=dtype)
        if pure_noise:
            latents = noise
        else:
            latents = scheduler.scale_noise(encoded, scheduler.timesteps[begin : begin + 1], noise)
        latents = self.pack(latents.to(device=self.device, dtype=dtype))
        if not inpainting:
            return latents, None
        height, width = self.canvas.height, self.canvas.width
        condition = mask_condition(row, self.mask_scale_factor, height, width)
        masked_latents = None
        if concatenated:
            masked = flow_pixels(self.pipe, row, height, width) * (condition < 0.5)
            masked_latents = flow_encode(self.pipe, masked, row, dtype).to(device=self.device, dtype=dtype)
        image_latents = None if encoded is None else self.pack(encoded)
        mask = self.latent_mask(condition, dtype)
        return latents, FlowInpainting(image_latents, self.pack(noise), mask, masked_latents)


class PackedFlowImageTasks(FlowImageTasks):
    """:class:`FlowImageTasks` over latents packed into 2 x 2 tokens (Flux, Qwen-Image: ``_pack_latents``)."""

    @property
    def mask_scale_factor(self) -> int:
        return int(self.pipe.vae_scale_factor) * 2  # the pipelines' processors count the packing

    def noise_shape(self) -> tuple[int, ...]:
        return (1, *self.latent_shape())

    def pack(self, latents: torch.Tensor) -> torch.Tensor:
        channels, height, width = self.latent_shape()
        packed: torch.Tensor = self.pipe._pack_latents(latents, latents.shape[0], channels, height, width)
        return packed

    def latent_mask(self, condition: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The mask at the latents' size, repeated over their channels and packed (``prepare_mask_latents``)."""
        mask = super().latent_mask(condition, dtype)
        return self.pack(mask.repeat(1, self.latent_shape()[0], 1, 1))

    def concatenates_mask(self) -> bool:
        return False  # the inpaint pipelines take 64-channel transformers only (their blend)
